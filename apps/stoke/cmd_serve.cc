// stoke serve: the OpenAI-compatible HTTP server for one Llama-family model (CPU, or GPU with --device cuda).
//
//   stoke serve --model smollm2-135m-instruct --port 8000
//   stoke serve --model /path/model.gguf --config serve.json --max-num-seqs 16    (flags win over the file)
//
// The HTTP server listens first (/health/live answers at once, /health/ready says 503), then the model loads
// (fetched if it is a known alias not yet on disk); when it is ready a line with the URL goes to stderr.
// SIGINT/SIGTERM: stop accepting, let in-flight responses finish (--drain-seconds), then exit 0.
//
// --config FILE: a JSON object whose keys are the long flag names ("port", "max-num-seqs"; "max_num_seqs"
// also works), e.g. {"port": 8080, "kv-cache-bytes": "2GiB", "no-prefix-cache": true}; or the same keys as
// a flat TOML file (FILE.toml: `max-batch-size = 8`), e.g. the stoke.toml `stoke tune` writes.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/stoke/cli_util.h"
#include "apps/stoke/command.h"
#include "apps/stoke/config_file.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/model_registry.h"
#include "engine/model/factory.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "net/http/http_server.h"
#include "net/http/trace_endpoint.h"
#include "net/kserve/classic_server.h"
#include "net/openai/debug_requests.h"
#include "net/openai/openai_service.h"
#include "serve/llm_loop.h"
#include "telemetry/gpu_telemetry.h"
#include "telemetry/server_metrics.h"
#include "telemetry/step_trace.h"
#include "tools/precision/serve_gate.h"

namespace stoke {
namespace {

struct ServeOptions {
  std::string model;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 8001;
  std::string config;
  int64_t max_body_bytes = 8 << 20;
  int http_threads = 2;
  int threads = 0;  // compute threads; 0 = hardware threads
  int64_t kv_cache_bytes = int64_t{1} << 30;
  bool kv_cache_bytes_set = false;  // given explicitly (flag or --config); else cuda sizes the KV itself
  int kv_blocks = 0;
  int block_size = 16;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_waiting = 1024;
  bool no_prefix_cache = false;
  std::string sampling = "device";
  bool no_chunked_prefill = false;
  double drain_seconds = 10;
  double idle_timeout_seconds = 120;
  int gpu_telemetry_interval_ms = 1000;
  bool no_gpu_telemetry = false;
  DeviceFlags device;  // also the engine tuning flags (--gemv-max-rows, --decode-pipeline, ...: cli_util.h)
  std::string encoder_attention = "auto";  // encoders on CUDA: BertDeviceOptions::attention
  int instances = 0;                // classic models: instances (0 = the model file's instance_group, else 1)
  int max_batch_size = 0;           // classic models: 0 = the model file's max_batch_size
  int64_t max_queue_delay_us = -1;  // classic models: -1 = the model file's max_queue_delay_microseconds
  std::string metric_names = "vllm";  // vllm (stoke:...) | prometheus (stoke_...): telemetry/metrics.h
  int debug_requests = 1000;          // finished requests GET /v1/debug/requests keeps (0: off)
  bool no_ledger = false;             // per-request ledgers not recorded (the ledger-overhead benchmark)
  bool allow_inconsistent = false;    // serve a precision the consistency gate rejects (serve_gate.h)
};

// Applies --config: every key sets its flag unless the flag was given on the command line.
Status ApplyConfigFile(CLI::App* cmd, const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json j, ReadConfigFile(path));  // JSON, or TOML for *.toml
  for (const auto& [key, value] : j.items()) {
    std::string name = key;
    std::replace(name.begin(), name.end(), '_', '-');
    if (name == "config") return InvalidArgumentError("--config {}: 'config' cannot be nested", path);
    CLI::Option* opt = cmd->get_option_no_throw("--" + name);
    if (opt == nullptr) return InvalidArgumentError("--config {}: unknown key '{}'", path, key);
    if (opt->count() > 0) continue;  // the command line wins
    std::string v;
    if (value.is_string()) {
      v = value.get<std::string>();
    } else if (value.is_boolean()) {
      v = value.get<bool>() ? "true" : "false";
    } else if (value.is_number()) {
      v = value.dump();
    } else {
      return InvalidArgumentError("--config {}: '{}' must be a string, number or boolean", path, key);
    }
    try {
      opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return InvalidArgumentError("--config {}: '{}': {}", path, key, e.what());
    }
  }
  return OkStatus();
}

// "smollm2-135m-instruct" stays; "/x/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1".
std::string DefaultServedName(const std::string& model) {
  std::string name = model;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  if (const size_t slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

Status Validate(const ServeOptions& o) {
  if (o.model.empty())
    return InvalidArgumentError("--model is required (on the command line or in --config)");
  if (o.port < 0 || o.port > 65535) return InvalidArgumentError("--port {} is out of range", o.port);
  if (o.max_body_bytes < 1024) return InvalidArgumentError("--max-body-bytes must be at least 1024");
  if (o.http_threads < 1 || o.http_threads > 256)
    return InvalidArgumentError("--http-threads must be in [1, 256]");
  if (o.max_num_seqs < 1) return InvalidArgumentError("--max-num-seqs must be at least 1");
  if (o.max_num_batched_tokens < 1)
    return InvalidArgumentError("--max-num-batched-tokens must be at least 1");
  if (o.max_waiting < 0) return InvalidArgumentError("--max-waiting must be >= 0");
  if (o.kv_blocks < 0) return InvalidArgumentError("--kv-blocks must be >= 0");
  if (o.kv_cache_bytes <= 0) return InvalidArgumentError("--kv-cache-bytes must be positive");
  if (o.block_size < 1) return InvalidArgumentError("--block-size must be at least 1");
  if (o.debug_requests < 0) return InvalidArgumentError("--debug-requests must be >= 0");
  if (o.max_batch_size < 0 || o.max_batch_size > 4096)
    return InvalidArgumentError("--max-batch-size {} must be in [0, 4096] (0: the model's own)",
                                o.max_batch_size);
  if (o.max_queue_delay_us < -1 || o.max_queue_delay_us > 60'000'000)
    return InvalidArgumentError("--max-queue-delay-us {} must be in [0, 60000000] (-1: the model's own)",
                                o.max_queue_delay_us);
  if (o.gpu_telemetry_interval_ms < 100)
    return InvalidArgumentError("--gpu-telemetry-interval-ms must be at least 100 (GPM needs > 100 ms)");
  RETURN_IF_ERROR(ParseMetricNaming(o.metric_names).status().WithContext("--metric-names"));
  return DecoderOptionsFromFlags(o.device).status();
}

struct Engine {
  std::shared_ptr<LlmLoop> loop;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::string path;
  std::string device;                         // the decoder's device_name()
  std::string kv_cache_dtype;                 // the decoder's kv_cache_dtype_name()
  std::optional<precision::GateReport> gate;  // the consistency gate run at load, if any (serve_gate.h)
};

StatusOr<Engine> LoadEngine(const ServeOptions& o, ServerMetrics* metrics, const Backends& backends) {
  Engine e;
  ASSIGN_OR_RETURN(e.path, ResolveModel(o.model));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(e.path));
  e.tokenizer = std::move(tok);
  auto tmpl = ChatTemplate::FromModel(e.path);
  if (tmpl.ok()) {
    e.chat_template = std::move(*tmpl);
  } else {
    LOG_WARN("serve: no usable chat template ({}); /v1/chat/completions will answer 400",
             tmpl.status().message());
  }
  ASSIGN_OR_RETURN(DecoderOptions dopts, DecoderOptionsFromFlags(o.device));
  dopts.max_step_tokens = std::max(dopts.max_step_tokens, o.max_num_batched_tokens);
  ASSIGN_OR_RETURN(e.gate, precision::RunServeGate(e.path, dopts, *e.tokenizer, o.allow_inconsistent, backends));
  ASSIGN_OR_RETURN(std::unique_ptr<DecoderModel> model, LoadDecoder(e.path, dopts, backends));
  e.device = model->device_name();
  e.kv_cache_dtype = model->kv_cache_dtype_name();

  LlmLoopOptions lo;
  lo.scheduler.max_num_seqs = o.max_num_seqs;
  lo.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  lo.scheduler.enable_chunked_prefill = !o.no_chunked_prefill;
  lo.block_size = o.block_size;
  lo.kv_budget_bytes = o.kv_cache_bytes;
  // A GPU decoder knows the memory left after its weights and scratch (--gpu-memory-fraction); an explicit
  // --kv-cache-bytes (or --kv-blocks) still wins.
  if (!o.kv_cache_bytes_set && model->KvBudgetBytes() > 0) lo.kv_budget_bytes = model->KvBudgetBytes();
  lo.num_kv_blocks = o.kv_blocks;
  lo.enable_prefix_caching = !o.no_prefix_cache;
  lo.device_sampling = o.sampling != "host";
  lo.max_waiting = o.max_waiting;
  lo.on_step = [metrics, model = o.served_model_name.empty() ? DefaultServedName(o.model)
                                                             : o.served_model_name](const StepRecord& step) {
    metrics->RecordStep(step);
    TraceStep(model, step);  // the timeline, while a trace is on (telemetry/step_trace.h)
  };
  ASSIGN_OR_RETURN(std::unique_ptr<LlmLoop> loop, LlmLoop::Create(lo, std::move(model), e.tokenizer));
  e.loop = std::move(loop);
  return e;
}

// `bound` is what CLI11 writes into: --config values land there too, so read the options after applying it.
int RunServe(CLI::App* cmd, ServeOptions* bound, const Backends& backends) {
  if (!bound->config.empty()) {
    if (Status s = ApplyConfigFile(cmd, bound->config); !s.ok()) {
      fmt::print(stderr, "stoke serve: {}\n", s.message());
      return 2;
    }
  }
  bound->kv_cache_bytes_set = cmd->get_option("--kv-cache-bytes")->count() > 0;
  const ServeOptions o = *bound;
  if (Status s = Validate(o); !s.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", s.message());
    return 2;
  }
  const MetricNaming naming = *ParseMetricNaming(o.metric_names);
  // Encoders (BERT HF folders) and model files (*.json, e.g. the synthetic model) are served by the dynamic
  // batcher behind KServe v2 REST/gRPC and /v1/embeddings instead of the LLM loop
  // (net/kserve/classic_server.h).
  if (IsClassicModel(o.model)) {
    return RunClassicServe({.model = o.model,
                            .served_model_name = o.served_model_name,
                            .host = o.host,
                            .port = o.port,
                            .grpc_port = o.grpc_port,
                            .http_threads = o.http_threads,
                            .max_body_bytes = static_cast<size_t>(o.max_body_bytes),
                            .threads = o.threads,
                            .drain_seconds = o.drain_seconds,
                            .idle_timeout_seconds = o.idle_timeout_seconds,
                            .gpu_telemetry = !o.no_gpu_telemetry,
                            .gpu_telemetry_interval_ms = o.gpu_telemetry_interval_ms,
                            // "" = the model file's "device" key (an explicit --device overrides it)
                            .device = cmd->get_option("--device")->count() > 0 ? o.device.device : "",
                            .encoder_attention = o.encoder_attention,
                            .instances = o.instances,
                            .max_batch_size = o.max_batch_size,
                            .max_queue_delay_us = o.max_queue_delay_us,
                            .metric_naming = naming,
                            .debug_requests = o.debug_requests,
                            .record_ledger = !o.no_ledger},
                           backends);
  }
  if (o.threads > 0) ThreadPool::SetDefaultThreads(o.threads);
  const std::string served = o.served_model_name.empty() ? DefaultServedName(o.model) : o.served_model_name;

  // Token-count histograms need a bound before the model (and its context length) is known.
  auto metrics_or = ServerMetrics::Create(served, 1 << 17, naming);
  if (!metrics_or.ok()) {
    fmt::print(stderr, "stoke serve: metrics: {}\n", metrics_or.status().message());
    return 1;
  }
  std::unique_ptr<ServerMetrics> metrics = std::move(*metrics_or);
  // GPU telemetry on /metrics (DCGM_FI_* names) and GET /v1/gpu; without NVML only an info line.
  std::unique_ptr<GpuTelemetry> gpu = GpuTelemetry::Create(
      {.enabled = !o.no_gpu_telemetry, .interval = std::chrono::milliseconds(o.gpu_telemetry_interval_ms)},
      &metrics->registry());
  gpu->Start();

  HttpServerOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.threads = o.http_threads;
  ho.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  ho.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.idle_timeout_seconds * 1000));
  ho.error_body = OpenAiErrorBody;
  // Before the server: its connections' completion callbacks write into it.
  RequestLog request_log(static_cast<size_t>(o.debug_requests));
  TraceEndpoint trace;  // POST /v1/debug/trace; declared before the server, which calls into it
  HttpServer server(ho);
  trace.Register(server);
  auto service = std::make_unique<OpenAiService>(OpenAiServiceOptions{.served_model_name = served,
                                                                      .model_aliases = {o.model},
                                                                      .request_log = &request_log,
                                                                      .record_ledger = !o.no_ledger},
                                                 metrics.get());
  service->RegisterRoutes(server);
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
  if (cmd->get_option("--grpc-port")->count() > 0) {
    LOG_WARN(
        "serve: --grpc-port {} is ignored: an LLM is served over HTTP only (the KServe v2 gRPC endpoint "
        "serves encoders and model files)",
        o.grpc_port);
  }

  // Load on a worker so a signal during a long load (or fetch) still stops the process promptly.
  StatusOr<Engine> loaded = InternalError("not loaded");
  std::atomic<bool> load_done{false};
  std::thread loader([&] {
    loaded = LoadEngine(o, metrics.get(), backends);
    load_done = true;
  });
  while (!load_done.load()) {
    if (server.WaitForSignal(std::chrono::milliseconds(50)) != 0) {
      // Nothing is in flight yet; the load can't be interrupted cleanly, so leave without unwinding it.
      fmt::print(stderr, "stoke serve: interrupted while loading the model\n");
      server.Shutdown(std::chrono::milliseconds(0));
      std::fflush(stderr);
      std::_Exit(0);
    }
  }
  loader.join();
  if (!loaded.ok()) {
    fmt::print(stderr, "stoke serve: cannot load {}: {}\n", o.model, loaded.status().message());
    server.Shutdown(std::chrono::milliseconds(0));
    return 1;
  }
  Engine engine = std::move(*loaded);
  std::weak_ptr<LlmLoop> weak_loop = engine.loop;
  metrics->SetSnapshotSource([weak_loop]() -> EngineSnapshot {
    auto loop = weak_loop.lock();
    return loop ? loop->Snapshot() : EngineSnapshot{};
  });
  service->SetModelFields(precision::PrecisionModelFields(engine.kv_cache_dtype, engine.gate));
  if (engine.gate) {
    if (Status s =
            precision::PublishGateMetrics(*engine.gate, served, engine.kv_cache_dtype, metrics->registry());
        !s.ok())
      LOG_WARN("serve: consistency gate metrics: {}", s.message());
  }
  service->SetReady(engine.loop, engine.tokenizer, engine.chat_template);
  fmt::print(
      stderr,
      "stoke serve: ready on {} (model '{}' from {} on {}, context {} tokens, {} KV blocks of {}, prefix "
      "cache {})\n",
      url, served, engine.path, engine.device, engine.loop->context_length(), engine.loop->num_kv_blocks(),
      engine.loop->block_size(), o.no_prefix_cache ? "off" : "on");

  const int signo = server.WaitForSignal();
  fmt::print(stderr, "stoke serve: {} received; draining (up to {} s)\n",
             signo == SIGTERM ? "SIGTERM" : "SIGINT", o.drain_seconds);
  trace.Finish();  // a trace in progress answers now rather than holding the drain up
  server.Shutdown(std::chrono::milliseconds(static_cast<int64_t>(o.drain_seconds * 1000)));
  // Teardown order: nothing calls into the engine any more; then the engine (its thread joins; leftover
  // callbacks only queue onto the stopped server); metrics last (the engine's step hook uses them).
  service.reset();
  engine.loop.reset();
  fmt::print(stderr, "stoke serve: stopped\n");
  return 0;
}

CommandRegistrar kServe("serve", "Serve a model over an OpenAI-compatible HTTP API", [](CLI::App* cmd) {
  auto o = std::make_shared<ServeOptions>();
  // Required, but checked after --config (which may name it).
  cmd->add_option("--model", o->model,
                  "Model alias (smollm2-135m-instruct) or path (GGUF file or HF folder); required, on the "
                  "command line or in --config");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Name clients use in \"model\" (default: the alias, or the file name without .gguf)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "HTTP port (0: any free port)")->capture_default_str();
  cmd->add_option(
         "--grpc-port", o->grpc_port,
         "KServe v2 gRPC port (inference.GRPCInferenceService, incl. ModelStreamInfer) for encoders and "
         "model files (0: any free port, -1: off); an LLM is served over HTTP only and ignores it")
      ->capture_default_str();
  cmd->add_option("--config", o->config,
                  "JSON (or *.toml) file with the same keys as these flags (flags win)");
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body; larger gets 413 (e.g. 8MiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "Threads running the HTTP event loop")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Compute threads for the CPU engine (0: one per hardware thread)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-bytes", o->kv_cache_bytes,
                  "KV cache memory budget (e.g. 1GiB; default on cuda: what --gpu-memory-fraction leaves)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--kv-blocks", o->kv_blocks,
                  "KV cache size in blocks (overrides --kv-cache-bytes; 0: use it)")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens computed per engine step")
      ->capture_default_str();
  cmd->add_option("--max-waiting", o->max_waiting, "Waiting requests beyond which new ones get 503")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache, "Compute every prompt in full (no KV reuse)");
  cmd->add_option(
         "--sampling", o->sampling,
         "Where next tokens are drawn: device (on the GPU with --device cuda, only token ids reach "
         "the host; logprobs requests and stop tokens masked before min_tokens use the host) or host "
         "(every row of logits copied to the host)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  cmd->add_flag("--no-chunked-prefill", o->no_chunked_prefill,
                "Admit a prompt only when it fits one step whole");
  cmd->add_option("--drain-seconds", o->drain_seconds,
                  "On SIGINT/SIGTERM, time in-flight requests get to finish")
      ->capture_default_str();
  cmd->add_option("--idle-timeout-seconds", o->idle_timeout_seconds,
                  "Close keep-alive connections idle this long")
      ->capture_default_str();
  cmd->add_option("--gpu-telemetry-interval-ms", o->gpu_telemetry_interval_ms,
                  "GPU telemetry (NVML/GPM -> /metrics, /v1/gpu) sampling period")
      ->capture_default_str();
  cmd->add_flag("--no-gpu-telemetry", o->no_gpu_telemetry, "Do not load NVML or sample the GPUs");
  AddDeviceFlags(cmd, &o->device);
  AddEncoderAttentionFlag(cmd, &o->encoder_attention);
  cmd->add_option("--instances", o->instances,
                  "Encoder models: instances, each with its own thread pool or CUDA stream (0: the model "
                  "file's instance_group, else 1)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-batch-size", o->max_batch_size,
                  "Encoder models: largest batch the dynamic batcher forms (0: the model file's "
                  "max_batch_size; > 0 turns dynamic batching on)")
      ->capture_default_str();
  cmd->add_option("--max-queue-delay-us", o->max_queue_delay_us,
                  "Encoder models: longest the oldest queued request waits for its batch to grow (-1: the "
                  "model file's max_queue_delay_microseconds; >= 0 turns dynamic batching on)")
      ->capture_default_str();
  cmd->add_option("--metric-names", o->metric_names,
                  "/metrics family names: vllm (stoke:name; promtool lints the colon) or prometheus "
                  "(stoke_name; lint-clean)")
      ->capture_default_str();
  cmd->add_flag("--allow-inconsistent", o->allow_inconsistent,
                "Serve a --kv-cache-dtype the output-consistency gate at load rejects (docs/precision.md)");
  cmd->add_option("--debug-requests", o->debug_requests,
                  "Finished requests (with their time ledgers) GET /v1/debug/requests keeps (0: off)")
      ->capture_default_str();
  cmd->add_flag(
      "--no-ledger", o->no_ledger,
      "Do not record finished requests' time ledgers (no request_stage_seconds, /v1/debug/requests "
      "entries or trace request spans; X-Stoke-Ledger: 1 is still answered): to measure their cost");
  return [cmd, o](const Backends& backends) -> int { return RunServe(cmd, o.get(), backends); };
});

}  // namespace
}  // namespace stoke
