#include "net/kserve/classic_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/file_util.h"
#include "base/logging.h"
#include "base/thread_pool.h"
#include "engine/loader/hf_folder.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/model/synthetic.h"
#include "engine/tokenizer/tokenizer.h"
#include "net/grpc/grpc_server.h"
#include "net/http/http_server.h"
#include "net/http/trace_endpoint.h"
#include "net/kserve/embeddings_service.h"
#include "net/kserve/kserve_codec.h"
#include "net/kserve/kserve_service.h"
#include "net/openai/debug_requests.h"
#include "serve/batcher/bert_classic_model.h"
#include "serve/batcher/model_repository.h"
#include "serve/batcher/synthetic_classic_model.h"
#include "telemetry/gpu_telemetry.h"
#include "telemetry/metrics.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What --model names, before anything is loaded.
struct ServeSpec {
  std::string type;   // "bert" | "synthetic"
  std::string name;   // served name (text form for bert)
  std::string model;  // bert: alias or folder
  BatcherConfig config;
  json file;  // the model file's JSON (synthetic keys live there)
  std::string source;
  int threads = 0;
  std::string device = "auto";  // bert only: auto = cuda when this build has CUDA and a GPU is visible
  std::string encoder_attention = "auto";  // bert on CUDA: BertDeviceOptions::attention
};

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

BatcherConfig DefaultConfig() {
  BatcherConfig c;
  c.max_batch_size = 32;
  c.dynamic_batching = DynamicBatchingOptions{};
  return c;
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = fs::path(path).filename().string();
  if (name.ends_with(".json")) name.resize(name.size() - 5);
  return name;
}

// --max-batch-size / --max-queue-delay-us win over the model file; either turns dynamic batching on.
void ApplyBatchingFlags(const ClassicServeOptions& o, BatcherConfig* c) {
  if (o.max_batch_size > 0) {
    c->max_batch_size = o.max_batch_size;
    if (!c->dynamic_batching) c->dynamic_batching = DynamicBatchingOptions{};
  }
  if (o.max_queue_delay_us >= 0) {
    if (!c->dynamic_batching) c->dynamic_batching = DynamicBatchingOptions{};
    c->dynamic_batching->max_queue_delay_us = o.max_queue_delay_us;
  }
}

StatusOr<ServeSpec> ReadModelSpec(const ClassicServeOptions& o) {
  ServeSpec s;
  s.encoder_attention = o.encoder_attention;
  if (!o.model.ends_with(".json")) {
    s.type = "bert";
    s.model = o.model;
    s.name = o.served_model_name.empty() ? BaseName(o.model) : o.served_model_name;
    s.config = DefaultConfig();
    s.threads = o.threads;
    if (!o.device.empty()) s.device = o.device;
    if (o.instances > 0) s.config.instance_count = o.instances;
    ApplyBatchingFlags(o, &s.config);
    return s;
  }
  s.source = o.model;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(o.model));
  s.file = json::parse(text, nullptr, false);
  if (!s.file.is_object()) return InvalidArgumentError("{}: not a JSON object", o.model);
  s.type = s.file.value("type", "");
  if (s.type != "bert" && s.type != "synthetic") {
    return InvalidArgumentError("{}: \"type\" must be \"bert\" or \"synthetic\", got {}", o.model,
                                s.file.contains("type") ? s.file["type"].dump() : "nothing");
  }
  const std::string file_name = s.file.contains("name") && s.file["name"].is_string()
                                    ? s.file["name"].get<std::string>()
                                    : BaseName(o.model);
  s.name = o.served_model_name.empty() ? file_name : o.served_model_name;
  if (s.file.contains("threads")) {
    if (!s.file["threads"].is_number_integer())
      return InvalidArgumentError("{}: 'threads' must be an integer", o.model);
    s.threads = s.file["threads"].get<int>();
  } else {
    s.threads = o.threads;
  }
  if (s.type == "bert") {
    if (!s.file.contains("model") || !s.file["model"].is_string()) {
      return InvalidArgumentError("{}: a bert model file needs \"model\" (alias or HF folder)", o.model);
    }
    s.model = s.file["model"].get<std::string>();
    const fs::path rel = fs::path(o.model).parent_path() / s.model;
    std::error_code ec;
    if (!FindModelSpec(s.model) && fs::path(s.model).is_relative() && fs::exists(rel, ec))
      s.model = rel.string();
    // As in Triton, a model file without "dynamic_batching" runs each request alone.
    if (!s.file.contains("max_batch_size")) s.file["max_batch_size"] = DefaultConfig().max_batch_size;
  }
  ASSIGN_OR_RETURN(s.config, BatcherConfig::FromJson(s.file, o.model));
  if (o.instances > 0) s.config.instance_count = o.instances;
  ApplyBatchingFlags(o, &s.config);
  RETURN_IF_ERROR(s.config.Validate().WithContext("--max-batch-size / --max-queue-delay-us"));
  if (s.type == "bert") {
    if (s.file.contains("device") && !s.file["device"].is_string())
      return InvalidArgumentError("{}: 'device' must be a string (cpu, cuda or auto)", o.model);
    s.device = !o.device.empty() ? o.device : s.file.value("device", std::string("auto"));
  } else if (!o.device.empty()) {
    s.file["device"] = o.device;  // --device overrides the synthetic model file's "device" too
  }
  if (s.type == "bert" && s.config.max_batch_size < 1) {
    return InvalidArgumentError("{}: a bert model needs max_batch_size >= 1", o.model);
  }
  return s;
}

struct LoadedModels {
  std::vector<std::pair<std::string, std::shared_ptr<ClassicModel>>> models;
  std::shared_ptr<const BertClassicModel> text;  // bert only
  std::string path;
  std::string device = "cpu";
};

StatusOr<LoadedModels> LoadModels(const ServeSpec& s, const Backends& backends) {
  LoadedModels l;
  if (s.type == "synthetic") {
    ASSIGN_OR_RETURN(SyntheticConfig sc, SyntheticConfig::FromJson(s.file, s.source));
    auto model = std::make_shared<const SyntheticModel>(std::move(sc));
    l.models.emplace_back(s.name, std::make_shared<SyntheticClassicModel>(
                                      model, std::max(1, s.config.max_batch_size), backends));
    l.path = s.source;
    return l;
  }
  ASSIGN_OR_RETURN(l.path, ResolveModel(s.model));
  if (!IsBertFolder(l.path)) return InvalidArgumentError("{} is not a BERT-family HF folder", l.path);
  ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> enc, BertEncoder::Load(l.path));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(l.path));
  std::shared_ptr<const BertEncoder> encoder = std::move(enc);
  std::shared_ptr<const Tokenizer> tokenizer = std::move(tok);
  // On a device the weights are uploaded once and shared by both forms' instances.
  BertDeviceOptions dev_opts;
  dev_opts.device = s.device;
  dev_opts.attention = s.encoder_attention;
  dev_opts.max_batch_tokens = std::max<int64_t>(dev_opts.max_batch_tokens,
                                                int64_t{s.config.max_batch_size} * encoder->max_seq_length());
  ASSIGN_OR_RETURN(std::shared_ptr<BertDeviceModel> device, LoadBertOnDevice(encoder, dev_opts, backends));
  l.device = device ? device->device_name() : "cpu";
  auto text = std::make_shared<BertClassicModel>(encoder, tokenizer, BertInputForm::kText, s.threads, device);
  l.text = text;
  l.models.emplace_back(s.name, text);
  l.models.emplace_back(
      s.name + "-ids",
      std::make_shared<BertClassicModel>(encoder, tokenizer, BertInputForm::kTokenIds, s.threads, device));
  return l;
}

}  // namespace

bool IsClassicModel(const std::string& model) {
  if (model.ends_with(".json")) return true;
  if (IsBertFolder(model)) return true;
  if (const ModelSpec* spec = FindModelSpec(model); spec != nullptr) {
    const std::string path = ModelEntryPath(*spec, DefaultModelDir());
    if (ModelPresent(*spec, DefaultModelDir())) return IsBertFolder(path);
    // Not fetched yet: known encoder aliases are HF folders described as encoders.
    return spec->entry.empty() && spec->description.find("encoder") != std::string::npos;
  }
  return false;
}

int RunClassicServe(const ClassicServeOptions& o, const Backends& backends) {
  auto spec = ReadModelSpec(o);
  if (!spec.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", spec.status().message());
    return 2;
  }
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);

  ModelRepository repo;
  std::vector<std::string> names = {spec->name};
  if (spec->type == "bert") names.push_back(spec->name + "-ids");
  for (const std::string& n : names) {
    if (Status s = repo.Add({.name = n, .config = spec->config}); !s.ok()) {
      fmt::print(stderr, "stoke serve: {}\n", s.message());
      return 2;
    }
  }
  MetricsRegistry registry(o.metric_naming);
  // GPU telemetry on /metrics (DCGM_FI_* names) and GET /v1/gpu; without NVML only an info line.
  std::unique_ptr<GpuTelemetry> gpu = GpuTelemetry::Create(
      {.enabled = o.gpu_telemetry, .interval = std::chrono::milliseconds(o.gpu_telemetry_interval_ms)},
      &registry);
  gpu->Start();

  HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.threads = o.http_threads;
  ho.max_body_bytes = o.max_body_bytes;
  ho.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.idle_timeout_seconds * 1000));
  ho.error_body = [](int, std::string_view message) { return KserveErrorBody(message); };
  // Before the server: its connections' completion callbacks write into it.
  RequestLog request_log(static_cast<size_t>(std::max(0, o.debug_requests)));
  TraceEndpoint trace;  // POST /v1/debug/trace; declared before the server, which calls into it
  HttpServer server(ho);
  trace.Register(server);
  KserveService kserve({.request_log = &request_log, .record_ledger = o.record_ledger}, &repo);
  kserve.RegisterRoutes(server);
  EmbeddingsService openai({.served_model_name = spec->name,
                            .model_aliases = {o.model},
                            .embeddings = spec->type == "bert",
                            .request_log = &request_log,
                            .record_ledger = o.record_ledger},
                           &repo, &registry);
  openai.RegisterRoutes(server);
  RegisterDebugRequests(server, &request_log);
  server.Handle("GET", "/v1/gpu", [g = gpu.get()](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send({.body = g->SnapshotJson()});
  });
  if (Status s = server.Start(); !s.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", s.message());
    return 1;
  }
  const std::string url = fmt::format("http://{}:{}", o.host, server.port());
  fmt::print(stderr, "stoke serve: listening on {} (loading {})\n", url, o.model);

  std::unique_ptr<GrpcInferenceServer> grpc;
  if (o.grpc_port >= 0) {
    grpc = std::make_unique<GrpcInferenceServer>(GrpcServerOptions{.host = o.host,
                                                                   .port = o.grpc_port,
                                                                   .extensions = KserveExtensions(),
                                                                   .request_log = &request_log,
                                                                   .record_ledger = o.record_ledger},
                                                 &repo);
    if (Status s = grpc->Start(); !s.ok()) {
      fmt::print(stderr, "stoke serve: {}\n", s.message());
      server.Shutdown(std::chrono::milliseconds(0));
      return 1;
    }
    fmt::print(stderr, "stoke serve: gRPC listening on {}:{}\n", o.host, grpc->port());
  }

  StatusOr<LoadedModels> loaded = InternalError("not loaded");
  std::atomic<bool> load_done{false};
  std::thread loader([&] {
    loaded = LoadModels(*spec, backends);
    load_done = true;
  });
  while (!load_done.load()) {
    if (server.WaitForSignal(std::chrono::milliseconds(50)) != 0) {
      fmt::print(stderr, "stoke serve: interrupted while loading the model\n");
      if (grpc) grpc->Shutdown(std::chrono::milliseconds(0));
      server.Shutdown(std::chrono::milliseconds(0));
      std::fflush(stderr);
      std::_Exit(0);
    }
  }
  loader.join();
  Status started = loaded.status();
  if (started.ok()) {
    for (auto& [name, model] : loaded->models) {
      if (started = repo.SetModel(name, model); !started.ok()) break;
    }
  }
  if (started.ok()) started = repo.StartAll(&registry);
  if (!started.ok()) {
    fmt::print(stderr, "stoke serve: cannot load {}: {}\n", o.model, started.message());
    if (grpc) grpc->Shutdown(std::chrono::milliseconds(0));
    server.Shutdown(std::chrono::milliseconds(0));
    return 1;
  }
  if (loaded->text) openai.SetModel(loaded->text);
  const BatcherConfig& c = spec->config;
  fmt::print(stderr,
             "stoke serve: ready on {} (models {} from {} on {}; max_batch_size {}, dynamic batching {}, {} "
             "instance(s))\n",
             url, fmt::join(names, ", "), loaded->path, loaded->device, c.max_batch_size,
             c.dynamic_batching
                 ? fmt::format("on, max_queue_delay {} us", c.dynamic_batching->max_queue_delay_us)
                 : std::string("off"),
             c.instance_count);

  const int signo = server.WaitForSignal();
  fmt::print(stderr, "stoke serve: {} received; draining (up to {} s)\n",
             signo == SIGTERM ? "SIGTERM" : "SIGINT", o.drain_seconds);
  const auto drain = std::chrono::milliseconds(static_cast<int64_t>(o.drain_seconds * 1000));
  trace.Finish();  // a trace in progress answers now rather than holding the drain up
  if (grpc) grpc->Shutdown(drain);
  server.Shutdown(drain);
  repo.StopAll();
  fmt::print(stderr, "stoke serve: stopped\n");
  return 0;
}

}  // namespace stoke
