#include "server/model_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "base/logging.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/model/factory.h"
#include "engine/model/synthetic.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "serve/batcher/bert_classic_model.h"
#include "serve/batcher/image_model_loader.h"
#include "serve/batcher/synthetic_classic_model.h"
#include "serve/llm_loop.h"
#include "telemetry/step_trace.h"
#include "tools/precision/calibration.h"
#include "tools/precision/encoder_gate.h"
#include "tools/precision/serve_gate.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool IsBertFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  auto text = ReadFileToString((fs::path(dir) / "config.json").string());
  if (!text.ok()) return false;
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object()) return false;
  if (j.value("model_type", "") == "bert") return true;
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const json& a : j["architectures"]) {
      if (a.is_string() && a.get<std::string>().starts_with("Bert")) return true;
    }
  }
  return false;
}

BatcherConfig DefaultBatcherConfig() {
  BatcherConfig c;
  c.max_batch_size = 32;
  c.dynamic_batching = DynamicBatchingOptions{};
  return c;
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = fs::path(path).filename().string();
  if (name.ends_with(".json") || name.ends_with(".onnx")) name.resize(name.size() - 5);
  return name;
}

// The batching settings a model gets: its own (stoke.toml), else the server's flags. max_batch_size and
// max_queue_delay win over the model file; either turns dynamic batching on.
struct BatchingOverrides {
  int instances = 0;
  int max_batch_size = 0;
  int64_t max_queue_delay_us = -1;
};

void ApplyBatching(const BatchingOverrides& o, BatcherConfig* c) {
  if (o.instances > 0) c->instance_count = o.instances;
  if (o.max_batch_size > 0) {
    c->max_batch_size = o.max_batch_size;
    if (!c->dynamic_batching) c->dynamic_batching = DynamicBatchingOptions{};
  }
  if (o.max_queue_delay_us >= 0) {
    if (!c->dynamic_batching) c->dynamic_batching = DynamicBatchingOptions{};
    c->dynamic_batching->max_queue_delay_us = o.max_queue_delay_us;
  }
}

// A batched model before loading: what the model file (or the defaults) and the settings say.
struct BatchedSpec {
  ModelKind kind = ModelKind::kEncoder;
  std::string name;
  std::string model;  // encoder: alias or folder; image: alias or .onnx file
  BatcherConfig config;
  json file;  // synthetic keys live there
  std::string source;
  int threads = 0;
  std::string device = "auto";  // encoder: auto = cuda when the build has CUDA and a GPU is visible
  std::string encoder_attention = BertDeviceOptions{}.attention;
  std::string encoder_epilogues = BertDeviceOptions{}.epilogues;
  bool encoder_cuda_graphs = BertDeviceOptions{}.cuda_graphs;
  std::string image_preprocess = "cpu";
  std::string image_conv_backend = "auto";
  // Encoders: the Linear weights' precision (--quantization, stoke.toml quantization), checked by the
  // output-consistency gate at load (tools/precision/encoder_gate.h) unless it is none.
  WeightQuantization quantization = WeightQuantization::kNone;
  precision::Int8CalibrationOptions calibration;  // int8: the activation scales' samples
  bool allow_inconsistent = false;                // ServerOptions::allow_inconsistent
};

StatusOr<BatchedSpec> ReadBatchedSpec(const ModelSettings& m, const ServerOptions& o) {
  const BatchingOverrides batching{.instances = m.instances.value_or(o.instances),
                                   .max_batch_size = m.max_batch_size.value_or(o.max_batch_size),
                                   .max_queue_delay_us = m.max_queue_delay_us.value_or(o.max_queue_delay_us)};
  // "" = the model file's "device" key (else auto): an explicit --device or stoke.toml device overrides it.
  const std::string device = m.device.value_or(o.batched_device);
  BatchedSpec s;
  s.quantization = m.quantization.value_or(o.decoder.quantization);
  s.calibration = {.data = m.calibration_data.value_or(o.calibration_data),
                   .percentile = o.calibration_percentile,
                   .smoothing_alpha = o.calibration_smoothing,
                   .activations = o.int8_activations};
  s.allow_inconsistent = o.allow_inconsistent;
  s.encoder_attention = o.encoder_attention;
  s.encoder_epilogues = o.encoder_epilogues;
  s.encoder_cuda_graphs = o.encoder_cuda_graphs;
  s.image_preprocess = o.image_preprocess;
  s.image_conv_backend = o.image_conv_backend;
  s.threads = o.threads;
  if (!m.source.ends_with(".json")) {
    s.kind = m.kind == "image" || IsImageModel(m.source) ? ModelKind::kImage : ModelKind::kEncoder;
    s.model = m.source;
    s.name = m.name.empty() ? BaseName(m.source) : m.name;
    s.config = DefaultBatcherConfig();
    if (!device.empty()) s.device = device;
    ApplyBatching(batching, &s.config);
    RETURN_IF_ERROR(s.config.Validate().WithContext(m.origin));
    return s;
  }
  s.source = m.source;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(m.source));
  s.file = json::parse(text, nullptr, false);
  if (!s.file.is_object()) return InvalidArgumentError("{}: not a JSON object", m.source);
  const std::string type = s.file.value("type", "");
  if (type != "bert" && type != "image" && type != "synthetic") {
    return InvalidArgumentError("{}: \"type\" must be \"bert\", \"image\" or \"synthetic\", got {}", m.source,
                                s.file.contains("type") ? s.file["type"].dump() : "nothing");
  }
  s.kind = type == "bert" ? ModelKind::kEncoder : type == "image" ? ModelKind::kImage : ModelKind::kSynthetic;
  const std::string file_name = s.file.contains("name") && s.file["name"].is_string()
                                    ? s.file["name"].get<std::string>()
                                    : BaseName(m.source);
  s.name = m.name.empty() ? file_name : m.name;
  if (s.file.contains("threads")) {
    if (!s.file["threads"].is_number_integer())
      return InvalidArgumentError("{}: 'threads' must be an integer", m.source);
    s.threads = s.file["threads"].get<int>();
  }
  if (s.kind != ModelKind::kSynthetic) {
    if (!s.file.contains("model") || !s.file["model"].is_string()) {
      return InvalidArgumentError("{}: {} model file needs \"model\" ({})", m.source,
                                  type == "bert" ? "a bert" : "an image",
                                  type == "bert" ? "alias or HF folder" : "alias or .onnx file");
    }
    s.model = s.file["model"].get<std::string>();
    const fs::path rel = fs::path(m.source).parent_path() / s.model;
    std::error_code ec;
    if (!FindModelSpec(s.model) && fs::path(s.model).is_relative() && fs::exists(rel, ec))
      s.model = rel.string();
    // As in Triton, a model file without "dynamic_batching" runs each request alone.
    if (!s.file.contains("max_batch_size")) s.file["max_batch_size"] = DefaultBatcherConfig().max_batch_size;
  }
  ASSIGN_OR_RETURN(s.config, BatcherConfig::FromJson(s.file, m.source));
  ApplyBatching(batching, &s.config);
  RETURN_IF_ERROR(s.config.Validate().WithContext("--max-batch-size / --max-queue-delay-us"));
  if (s.kind != ModelKind::kSynthetic) {
    if (s.file.contains("device") && !s.file["device"].is_string())
      return InvalidArgumentError("{}: 'device' must be a string (cpu, cuda or auto)", m.source);
    s.device = !device.empty() ? device : s.file.value("device", std::string("auto"));
    if (s.config.max_batch_size < 1)
      return InvalidArgumentError("{}: {} model needs max_batch_size >= 1", m.source,
                                  type == "bert" ? "a bert" : "an image");
  } else if (!device.empty()) {
    s.file["device"] = device;  // --device overrides the synthetic model file's "device" too
  }
  return s;
}

std::string BatchingSummary(const BatcherConfig& c) {
  return fmt::format("max_batch_size {}, dynamic batching {}, {} instance(s)", c.max_batch_size,
                     c.dynamic_batching
                         ? fmt::format("on, max_queue_delay {} us", c.dynamic_batching->max_queue_delay_us)
                         : std::string("off"),
                     c.instance_count);
}

// An encoder's weight precision, for its /v1/models entry, KServe metadata and gauges; the gate's report
// when one ran. Only for quantised weights: at the checkpoint's precision its entries stay as they were.
void PublishEncoderPrecision(const BatchedSpec& s, const std::optional<precision::GateReport>& gate,
                             MetricsRegistry* registry, LoadedModel* l) {
  if (s.quantization == WeightQuantization::kNone) return;
  const precision::ServedPrecision served{
      .kv_cache_dtype = "", .quantization = std::string(WeightQuantizationName(s.quantization))};
  l->model_fields = precision::PrecisionModelFields(served, gate);
  const std::map<std::string, std::string> params = {{"quantization", served.quantization},
                                                     {"consistency_gate", !gate          ? "not run"
                                                                          : gate->pass() ? "pass"
                                                                                         : "fail"}};
  for (auto& c : l->classic) c->set_parameters(params);
  if (!gate || registry == nullptr) return;
  if (Status st = precision::PublishGateMetrics(*gate, s.name, served, *registry); !st.ok())
    LOG_WARN("serve: model '{}': consistency gate metrics: {}", s.name, st.message());
}

StatusOr<LoadedModel> LoadBatched(const BatchedSpec& s, const std::vector<std::string>& names,
                                  const Backends& backends, MetricsRegistry* registry) {
  LoadedModel l;
  std::string path = s.source, device = "cpu";
  if (s.kind == ModelKind::kSynthetic) {
    ASSIGN_OR_RETURN(SyntheticConfig sc, SyntheticConfig::FromJson(s.file, s.source));
    auto model = std::make_shared<const SyntheticModel>(std::move(sc));
    l.classic.push_back(
        std::make_shared<SyntheticClassicModel>(model, std::max(1, s.config.max_batch_size), backends));
  } else if (s.kind == ModelKind::kImage) {
    // --device cuda (or the model's own device = "cuda"): the GPU executor from the Backends; auto: the CPU.
    ASSIGN_OR_RETURN(LoadedImageModel im, LoadImageModel({.model = s.model,
                                                          .file = s.file,
                                                          .source = s.source,
                                                          .threads = s.threads,
                                                          .preprocess = s.image_preprocess,
                                                          .device = s.device,
                                                          .conv_backend = s.image_conv_backend,
                                                          .backends = &backends}));
    LOG_INFO("image model {}: {}", im.path, im.summary);
    path = im.path;
    device = im.device;
    l.classic.push_back(im.encoded);
    l.classic.push_back(im.tensor);
  } else {
    ASSIGN_OR_RETURN(path, ResolveModel(s.model));
    if (!IsBertFolder(path)) return InvalidArgumentError("{} is not a BERT-family HF folder", path);
    ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> enc, BertEncoder::Load(path));
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
    std::shared_ptr<const Tokenizer> tokenizer = std::move(tok);
    // On a device the weights are uploaded once and shared by both forms' instances. --quantization fp8:
    // the CPU encoder's weights are quantised, or the device quantises its copies.
    BertDeviceOptions dev_opts;
    dev_opts.device = s.device;
    dev_opts.attention = s.encoder_attention;
    dev_opts.epilogues = s.encoder_epilogues;
    dev_opts.cuda_graphs = s.encoder_cuda_graphs;
    dev_opts.quantization = s.quantization;
    dev_opts.max_batch_tokens = std::max<int64_t>(dev_opts.max_batch_tokens,
                                                  int64_t{s.config.max_batch_size} * enc->max_seq_length());
    // int8: the activation scales from the calibration samples, measured by this fp32 encoder (refused
    // without samples).
    RETURN_IF_ERROR(precision::CalibrateForInt8(*enc, *tokenizer, s.calibration, &dev_opts));
    ASSIGN_OR_RETURN(precision::EncoderAtPrecision at,
                     precision::EncoderAtPrecisionFrom(std::move(enc), dev_opts, backends));
    // Weights other than the checkpoint's are compared with the CPU's fp32 encoder first; a failing
    // precision is refused unless allowed (FailedPrecondition with the report).
    ASSIGN_OR_RETURN(std::optional<precision::GateReport> gate,
                     precision::RunEncoderServeGate(path, at, *tokenizer, s.allow_inconsistent));
    device = at.device ? at.device->device_name() : "cpu";
    if (s.quantization != WeightQuantization::kNone) {
      device += fmt::format(", weights {}", WeightQuantizationName(s.quantization));
      if (gate) device += gate->pass() ? ", consistency gate passed" : ", consistency gate FAILED";
    }
    l.classic.push_back(std::make_shared<BertClassicModel>(at.encoder, tokenizer, BertInputForm::kText,
                                                           s.threads, at.device));
    l.classic.push_back(std::make_shared<BertClassicModel>(at.encoder, tokenizer, BertInputForm::kTokenIds,
                                                           s.threads, at.device));
    PublishEncoderPrecision(s, gate, registry, &l);
  }
  l.summary = fmt::format("models {} from {} on {}; {}", fmt::join(names, ", "), path, device,
                          BatchingSummary(s.config));
  return l;
}

struct DecoderSpec {
  std::string name;
  std::string source;
  DecoderOptions options;
  int64_t kv_cache_bytes = 0;
  bool kv_cache_bytes_set = false;
  bool allow_inconsistent = false;  // ServerOptions::allow_inconsistent
};

// The precision goes to the model's /v1/models entry; the report of the output-consistency gate run at load
// (if it ran: tools/precision/serve_gate.h) there too and to its gauges.
void PublishPrecision(const DecoderSpec& d, const precision::ServedPrecision& served,
                      const std::optional<precision::GateReport>& gate, ServerMetrics* metrics,
                      DecoderHandle* handle) {
  handle->model_fields = precision::PrecisionModelFields(served, gate);
  if (!gate || metrics == nullptr) return;
  if (Status s = precision::PublishGateMetrics(*gate, d.name, served, metrics->registry()); !s.ok())
    LOG_WARN("serve: model '{}': consistency gate metrics: {}", d.name, s.message());
}

StatusOr<LoadedModel> LoadDecoderModel(const DecoderSpec& d, const ServerOptions& o, ServerMetrics* metrics,
                                       const Backends& backends) {
  ASSIGN_OR_RETURN(std::string path, ResolveModel(d.source));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  auto handle = std::make_shared<DecoderHandle>();
  handle->tokenizer = std::move(tok);
  handle->metrics = metrics;
  auto tmpl = ChatTemplate::FromModel(path);
  if (tmpl.ok()) {
    handle->chat_template = std::move(*tmpl);
  } else {
    LOG_WARN("serve: model '{}' has no usable chat template ({}); /v1/chat/completions will answer 400",
             d.name, tmpl.status().message());
  }
  DecoderOptions dopts = d.options;
  dopts.max_step_tokens = std::max(dopts.max_step_tokens, o.max_num_batched_tokens);
  // A KV precision or weight quantisation other than the backend's reference is compared with it first; a
  // failing one is refused unless allowed (FailedPrecondition with the report).
  ASSIGN_OR_RETURN(std::optional<precision::GateReport> gate,
                   precision::RunServeGate(path, dopts, *handle->tokenizer, d.allow_inconsistent, backends));
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model, LoadDecoder(path, dopts, backends));
  const std::string device = model->device_name();
  const precision::ServedPrecision served{model->kv_cache_dtype_name(), model->quantization_name()};
  PublishPrecision(d, served, gate, metrics, handle.get());
  // Where it runs, beside its precision in /v1/models ("cpu", "cuda:0 (NVIDIA H200)"): stoke doctor names
  // GPU-only knobs only for a GPU model.
  if (nlohmann::ordered_json f = nlohmann::ordered_json::parse(handle->model_fields, nullptr, false);
      f.is_object()) {
    f["device"] = device;
    handle->model_fields = f.dump();
  }

  LlmLoopOptions lo;
  lo.scheduler.max_num_seqs = o.max_num_seqs;
  lo.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  lo.scheduler.enable_chunked_prefill = o.chunked_prefill;
  lo.block_size = o.block_size;
  lo.kv_budget_bytes = d.kv_cache_bytes;
  // A GPU decoder knows the memory left after its weights and scratch (its GPU memory share); an explicit
  // KV size (or --kv-blocks) still wins.
  if (!d.kv_cache_bytes_set && model->KvBudgetBytes() > 0) lo.kv_budget_bytes = model->KvBudgetBytes();
  lo.num_kv_blocks = o.kv_blocks;
  lo.enable_prefix_caching = o.prefix_cache;
  lo.device_sampling = o.device_sampling;
  lo.async_output = o.async_output == "on" || (o.async_output == "auto" && device.starts_with("cuda"));
  lo.max_waiting = o.max_waiting;
  lo.target_step_ms = o.target_step_ms;
  if (auto costs = ComputeDecoderStepCosts(*model, path); costs.ok()) {
    lo.step_costs = *costs;
  } else {
    LOG_WARN(
        "serve: model '{}': no step cost model ({}); stoke:step_read_bytes_total and step_flops_total stay 0",
        d.name, costs.status().message());
  }
  // The timeline first, then the metrics (as a request's ledger goes to both): once /metrics counts a step, a
  // trace that was on holds it (test_trace.py waits on the metrics before it stops a trace).
  lo.on_step = [metrics, name = d.name](const StepRecord& step) {
    TraceStep(name, step);  // the timeline, while a trace is on (telemetry/step_trace.h)
    if (metrics != nullptr) metrics->RecordStep(step);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<LlmLoop> created,
                   LlmLoop::Create(lo, std::move(model), handle->tokenizer));
  std::shared_ptr<LlmLoop> loop = std::move(created);
  if (metrics != nullptr) {
    std::weak_ptr<LlmLoop> weak = loop;
    metrics->SetSnapshotSource([weak]() -> EngineSnapshot {
      auto l = weak.lock();
      return l ? l->Snapshot() : EngineSnapshot{};
    });
  }
  handle->engine = loop;
  LoadedModel l;
  std::string kv = served.kv_cache_dtype;
  if (served.quantization != "none") kv += ", weights " + served.quantization;
  if (gate) kv += gate->pass() ? ", consistency gate passed" : ", consistency gate FAILED";
  l.summary =
      fmt::format("model '{}' from {} on {}, context {} tokens, {} KV blocks of {} ({}), prefix cache {}",
                  d.name, path, device, loop->context_length(), loop->num_kv_blocks(), loop->block_size(), kv,
                  o.prefix_cache ? "on" : "off");
  l.decoder = std::move(handle);
  l.drain = [loop](std::chrono::milliseconds drain) {
    loop->WaitIdle(static_cast<Nanos>(drain.count()) * 1000 * 1000);
  };
  return l;
}

}  // namespace

bool IsBatchedModelSource(const std::string& source) {
  if (source.ends_with(".json")) return true;
  if (IsBertFolder(source) || IsImageModel(source)) return true;
  if (const ModelSpec* spec = FindModelSpec(source); spec != nullptr) {
    const std::string path = ModelEntryPath(*spec, DefaultModelDir());
    if (ModelPresent(*spec, DefaultModelDir())) return IsBertFolder(path);
    // Not fetched yet: known encoder aliases are HF folders described as encoders.
    return spec->entry.empty() && spec->description.find("encoder") != std::string::npos;
  }
  return false;
}

std::string DefaultModelName(const std::string& source) {
  std::string name = source;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

StatusOr<ModelConfig> MakeModelConfig(const ModelSettings& m, const ServerOptions& o,
                                      const Backends& backends, MetricsRegistry* registry,
                                      std::vector<std::unique_ptr<ServerMetrics>>* keep) {
  if (m.source.empty()) return InvalidArgumentError("{}: no model source", m.origin);
  bool batched;
  if (m.kind.empty()) {
    batched = IsBatchedModelSource(m.source);
  } else if (m.kind == "decoder") {
    batched = false;
  } else if (m.kind == "encoder" || m.kind == "image" || m.kind == "synthetic") {
    batched = true;
  } else {
    return InvalidArgumentError("{}: kind '{}' must be decoder, encoder, image or synthetic", m.origin,
                                m.kind);
  }
  ModelConfig c;
  c.load_at_start = m.load;
  if (!batched) {
    DecoderSpec d;
    d.name = m.name.empty() ? DefaultModelName(m.source) : m.name;
    d.source = m.source;
    d.options = o.decoder;
    if (m.device) d.options.device = *m.device;
    if (m.gpu_memory_fraction) d.options.gpu_memory_fraction = *m.gpu_memory_fraction;
    if (m.kv_cache_dtype) d.options.kv_cache.dtype = *m.kv_cache_dtype;
    if (m.quantization == WeightQuantization::kInt8) {
      return InvalidArgumentError(
          "{}: quantization 'int8' applies to encoders (with calibration_data); a decoder's weights are none "
          "or fp8 (and its KV cache: kv_cache_dtype int8 or fp8)",
          m.origin);
    }
    if (m.quantization) d.options.quantization = *m.quantization;
    d.allow_inconsistent = o.allow_inconsistent;
    d.kv_cache_bytes = m.kv_cache_bytes.value_or(o.kv_cache_bytes);
    d.kv_cache_bytes_set = m.kv_cache_bytes.has_value() || o.kv_cache_bytes_set;
    // Token-count histograms need a bound before the model (and its context length) is known.
    ASSIGN_OR_RETURN(std::unique_ptr<ServerMetrics> metrics,
                     ServerMetrics::Create(registry, d.name, 1 << 17));
    ServerMetrics* mp = metrics.get();
    keep->push_back(std::move(metrics));
    c.name = d.name;
    c.kind = ModelKind::kDecoder;
    if (m.source != d.name) c.aliases.push_back(m.source);
    c.load = [d, &o, mp, backends]() { return LoadDecoderModel(d, o, mp, backends); };
    return c;
  }
  ASSIGN_OR_RETURN(BatchedSpec s, ReadBatchedSpec(m, o));
  if (!m.kind.empty() && m.kind != ModelKindName(s.kind)) {
    return InvalidArgumentError("{}: kind '{}' but {} is a{} {} model", m.origin, m.kind, m.source,
                                s.kind == ModelKind::kSynthetic ? "" : "n", ModelKindName(s.kind));
  }
  c.name = s.name;
  c.kind = s.kind;
  c.served.push_back({.name = s.name, .config = s.config});
  if (s.kind == ModelKind::kEncoder) c.served.push_back({.name = s.name + "-ids", .config = s.config});
  if (s.kind == ModelKind::kImage) c.served.push_back({.name = s.name + "-tensor", .config = s.config});
  if (m.source != s.name) c.aliases.push_back(m.source);
  std::vector<std::string> names;
  for (const auto& sm : c.served) names.push_back(sm.name);
  if (s.kind != ModelKind::kEncoder && s.quantization != WeightQuantization::kNone) {
    // Weight precision is a decoder's and an encoder's: the model's own stoke.toml asking it of another kind
    // is an error; the server's flag (for the other models) does not apply here.
    if (m.quantization) {
      return InvalidArgumentError(
          "{}: quantization '{}' applies to decoders and encoders, not to a{} {} model", m.origin,
          WeightQuantizationName(s.quantization), s.kind == ModelKind::kImage ? "n" : "",
          ModelKindName(s.kind));
    }
    LOG_WARN("serve: model '{}': --quantization {} does not apply to a{} {} model", s.name,
             WeightQuantizationName(s.quantization), s.kind == ModelKind::kImage ? "n" : "",
             ModelKindName(s.kind));
    s.quantization = WeightQuantization::kNone;
  }
  c.load = [s, names, backends, registry]() { return LoadBatched(s, names, backends, registry); };
  return c;
}

}  // namespace stoke
