// stoke serve: the flags. The serving itself is src/server/ (RunServer): one lifecycle for decoders, encoders
// and synthetic models, one or many per process.
//
//   stoke serve --model smollm2-135m-instruct --port 8000
//   stoke serve --model chat=smollm2-135m-instruct --model all-minilm-l6-v2      (two models, one process)
//   stoke serve --model-repository models/                                       (one folder per model)
//   stoke serve --model /path/model.gguf --config serve.json --max-num-seqs 16    (flags win over the file)
//
// --model [NAME=]SOURCE is repeatable; the other flags apply to every model (a repository folder's stoke.toml
// sets them per model: server/repository_folder.h).
//
// --config FILE: a JSON object whose keys are the long flag names ("port", "max-num-seqs"; "max_num_seqs"
// also works), e.g. {"port": 8080, "kv-cache-bytes": "2GiB", "no-prefix-cache": true}; or the same keys as
// a flat TOML file (FILE.toml: `max-batch-size = 8`), e.g. the stoke.toml `stoke tune` writes.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
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
#include "base/status.h"
#include "engine/model/backends.h"
#include "server/server.h"
#include "server/server_options.h"
#include "telemetry/metrics.h"

namespace stoke {
namespace {

struct ServeOptions {
  std::vector<std::string> models;  // [NAME=]SOURCE
  std::string model_repository;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 8001;
  std::string config;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 64 << 10;
  int max_connections = 0;  // 0: no cap but the descriptor limit
  int http_threads = 2;
  int threads = 0;  // compute threads; 0 = hardware threads
  int64_t kv_cache_bytes = int64_t{1} << 30;
  bool kv_cache_bytes_set = false;  // given explicitly (flag or --config); else cuda sizes the KV itself
  int kv_blocks = 0;
  int block_size = 16;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  double target_step_ms = 0;
  int max_waiting = 1024;
  bool no_prefix_cache = false;
  std::string sampling = "device";
  bool no_chunked_prefill = false;
  double drain_seconds = 10;
  double idle_timeout_seconds = 120;
  double request_timeout_seconds = 60;
  std::string api_key;  // --api-key, or read from --api-key-file (never logged)
  std::string api_key_file;
  bool metrics_require_key = false;
  int gpu_telemetry_interval_ms = 1000;
  bool no_gpu_telemetry = false;
  DeviceFlags device;  // also the engine tuning flags (--gemv-max-rows, --decode-pipeline, ...: cli_util.h)
  // Encoders on CUDA: BertDeviceOptions' knobs, its defaults.
  std::string encoder_attention = BertDeviceOptions{}.attention;
  std::string encoder_epilogues = BertDeviceOptions{}.epilogues;
  std::string encoder_cuda_graphs = BertDeviceOptions{}.cuda_graphs ? "on" : "off";
  std::string preprocess = "cpu";                // image models: cpu | gpu (resize + normalise on the GPU) | nvjpeg
  std::string conv_backend = "auto";             // image models on the GPU: auto | cudnn | im2col
  int instances = 0;                // classic models: instances (0 = the model file's instance_group, else 1)
  int max_batch_size = 0;           // classic models: 0 = the model file's max_batch_size
  int64_t max_queue_delay_us = -1;  // classic models: -1 = the model file's max_queue_delay_microseconds
  std::string metric_names = "vllm";  // vllm (stoke:...) | prometheus (stoke_...): telemetry/metrics.h
  int debug_requests = 1000;          // finished requests GET /v1/debug/requests keeps (0: off)
  bool no_ledger = false;             // per-request ledgers not recorded (the ledger-overhead benchmark)
  std::string event_batching = "off";  // on: generation events reach the connections in batches (EventOutbox)
  std::string async_output = "auto";   // on: tokens' text on an output thread during the next step
  bool allow_inconsistent = false;    // serve a precision the consistency gate rejects (serve_gate.h)
  precision::Int8CalibrationOptions calibration;  // encoders at --quantization int8
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

Status Validate(const ServeOptions& o) {
  if (o.models.empty() && o.model_repository.empty())
    return InvalidArgumentError(
        "--model or --model-repository is required (on the command line or in --config)");
  if (!o.served_model_name.empty() && (o.models.size() != 1 || !o.model_repository.empty()))
    return InvalidArgumentError("--served-model-name names one model; with several, use --model NAME=SOURCE");
  if (o.port < 0 || o.port > 65535) return InvalidArgumentError("--port {} is out of range", o.port);
  if (o.max_body_bytes < 1024) return InvalidArgumentError("--max-body-bytes must be at least 1024");
  if (o.max_header_bytes < 1024 || o.max_header_bytes > (1 << 30))
    return InvalidArgumentError("--max-header-bytes must be in [1024, 1GiB]");
  if (o.max_connections < 0) return InvalidArgumentError("--max-connections must be >= 0");
  if (o.http_threads < 1 || o.http_threads > 256)
    return InvalidArgumentError("--http-threads must be in [1, 256]");
  if (o.max_num_seqs < 1) return InvalidArgumentError("--max-num-seqs must be at least 1");
  if (o.max_num_batched_tokens < 1)
    return InvalidArgumentError("--max-num-batched-tokens must be at least 1");
  if (o.max_waiting < 0) return InvalidArgumentError("--max-waiting must be >= 0");
  if (!(o.target_step_ms >= 0)) return InvalidArgumentError("--target-step-ms must be >= 0 (0: off)");
  if (o.kv_blocks < 0) return InvalidArgumentError("--kv-blocks must be >= 0");
  if (o.kv_cache_bytes <= 0) return InvalidArgumentError("--kv-cache-bytes must be positive");
  if (o.block_size < 1) return InvalidArgumentError("--block-size must be at least 1");
  if (o.debug_requests < 0) return InvalidArgumentError("--debug-requests must be >= 0");
  if (!(o.request_timeout_seconds > 0))
    return InvalidArgumentError("--request-timeout-seconds must be positive");
  if (!o.api_key.empty() && !o.api_key_file.empty())
    return InvalidArgumentError("give --api-key or --api-key-file, not both");
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

// The key from --api-key, or the first line of --api-key-file (trailing whitespace dropped); "" for none.
StatusOr<std::string> ReadApiKey(const std::string& key, const std::string& file) {
  if (file.empty()) return key;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  text = text.substr(0, text.find('\n'));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty()) return InvalidArgumentError("--api-key-file {}: the file holds no key", file);
  return text;
}

// "chat=smollm2-135m-instruct" -> name "chat"; "smollm2-135m-instruct" or "/x/a=b.gguf" (a path) -> no name.
ModelSettings ParseModelArg(const std::string& arg) {
  ModelSettings m;
  m.origin = "--model " + arg;
  const size_t eq = arg.find('=');
  const size_t slash = arg.find('/');
  if (eq != std::string::npos && eq > 0 && (slash == std::string::npos || eq < slash)) {
    m.name = arg.substr(0, eq);
    m.source = arg.substr(eq + 1);
  } else {
    m.source = arg;
  }
  return m;
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
  if (Status s = Validate(*bound); !s.ok()) {
    fmt::print(stderr, "stoke serve: {}\n", s.message());
    return 2;
  }
  if (auto key = ReadApiKey(bound->api_key, bound->api_key_file); key.ok()) {
    bound->api_key = *key;
  } else {
    fmt::print(stderr, "stoke serve: {}\n", key.status().message());
    return 2;
  }
  const ServeOptions o = *bound;
  ServerOptions so;
  for (const std::string& arg : o.models) {
    ModelSettings m = ParseModelArg(arg);
    if (m.source.empty()) {
      fmt::print(stderr, "stoke serve: --model {}: no model after '='\n", arg);
      return 2;
    }
    if (o.models.size() == 1 && !o.served_model_name.empty()) m.name = o.served_model_name;
    so.models.push_back(std::move(m));
  }
  so.model_repository = o.model_repository;
  so.host = o.host;
  so.port = o.port;
  so.grpc_port = o.grpc_port;
  so.grpc_port_set = cmd->get_option("--grpc-port")->count() > 0;
  so.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  so.max_header_bytes = static_cast<size_t>(o.max_header_bytes);
  so.max_connections = o.max_connections;
  so.http_threads = o.http_threads;
  so.threads = o.threads;
  so.drain_seconds = o.drain_seconds;
  so.idle_timeout_seconds = o.idle_timeout_seconds;
  so.request_timeout_seconds = o.request_timeout_seconds;
  so.api_key = o.api_key;
  so.metrics_require_key = o.metrics_require_key;
  so.gpu_telemetry = !o.no_gpu_telemetry;
  so.gpu_telemetry_interval_ms = o.gpu_telemetry_interval_ms;
  so.metric_naming = *ParseMetricNaming(o.metric_names);
  so.debug_requests = o.debug_requests;
  so.record_ledger = !o.no_ledger;
  so.batch_generation_events = o.event_batching == "on";
  so.decoder = *DecoderOptionsFromFlags(o.device);  // checked by Validate (incl. --kv-cache-dtype)
  so.allow_inconsistent = o.allow_inconsistent;
  so.calibration_data = o.calibration.data;
  so.calibration_percentile = o.calibration.percentile;
  so.calibration_smoothing = o.calibration.smoothing_alpha;
  so.int8_activations = o.calibration.activations;
  so.kv_cache_bytes = o.kv_cache_bytes;
  so.kv_cache_bytes_set = o.kv_cache_bytes_set;
  so.kv_blocks = o.kv_blocks;
  so.block_size = o.block_size;
  so.max_num_seqs = o.max_num_seqs;
  so.max_num_batched_tokens = o.max_num_batched_tokens;
  so.target_step_ms = o.target_step_ms;
  so.max_waiting = o.max_waiting;
  so.prefix_cache = !o.no_prefix_cache;
  so.device_sampling = o.sampling != "host";
  so.async_output = o.async_output;
  so.chunked_prefill = !o.no_chunked_prefill;
  // "" = a model file's "device" key (an explicit --device overrides it)
  so.batched_device = cmd->get_option("--device")->count() > 0 ? o.device.device : "";
  so.encoder_attention = o.encoder_attention;
  so.encoder_epilogues = o.encoder_epilogues;
  so.encoder_cuda_graphs = o.encoder_cuda_graphs == "on";
  so.image_preprocess = o.preprocess;
  so.image_conv_backend = o.conv_backend;
  so.instances = o.instances;
  so.max_batch_size = o.max_batch_size;
  so.max_queue_delay_us = o.max_queue_delay_us;
  return RunServer(so, backends);
}

CommandRegistrar kServe(
    "serve", "Serve models over the OpenAI API, KServe v2 REST and gRPC", [](CLI::App* cmd) {
      auto o = std::make_shared<ServeOptions>();
      // Required, but checked after --config (which may name it).
      cmd->add_option(
             "--model", o->models,
             "[NAME=]SOURCE: a model alias (smollm2-135m-instruct, all-minilm-l6-v2) or path (GGUF file, "
             "HF folder, *.json model file), served as NAME (default: the alias, or the file name); "
             "repeatable: several models in one process")
          ->take_all();
      cmd->add_option("--model-repository", o->model_repository,
                      "A folder with one folder per model, each with an optional stoke.toml (docs/api.md)");
      cmd->add_option(
          "--served-model-name", o->served_model_name,
          "Name clients use in \"model\" for the one --model (default: the alias, or the file name "
          "without .gguf)");
      cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
      cmd->add_option("--port", o->port, "HTTP port (0: any free port)")->capture_default_str();
      cmd->add_option(
             "--grpc-port", o->grpc_port,
             "KServe v2 gRPC port (inference.GRPCInferenceService, incl. ModelStreamInfer) for encoders and "
             "model files (0: any free port, -1: off); a server of decoders only has no gRPC listener")
          ->capture_default_str();
      cmd->add_option("--config", o->config,
                      "JSON (or *.toml) file with the same keys as these flags (flags win)");
      cmd->add_option("--max-body-bytes", o->max_body_bytes,
                      "Largest request body (413), and KServe gRPC request message (RESOURCE_EXHAUSTED) "
                      "(e.g. 8MiB)")
          ->transform(CLI::AsSizeValue(false))
          ->capture_default_str();
      cmd->add_option("--max-header-bytes", o->max_header_bytes,
                      "Largest request line + headers, all together; larger gets 431 (e.g. 64KiB)")
          ->transform(CLI::AsSizeValue(false))
          ->capture_default_str();
      cmd->add_option("--max-connections", o->max_connections,
                      "Open HTTP connections beyond which a new one gets 503 + Retry-After and is closed "
                      "(0: no cap but the descriptor limit)")
          ->capture_default_str();
      cmd->add_option("--http-threads", o->http_threads, "Threads running the HTTP event loop")
          ->capture_default_str();
      cmd->add_option("--threads", o->threads,
                      "Compute threads for the CPU engine (0: one per hardware thread)")
          ->capture_default_str();
      cmd->add_option(
             "--kv-cache-bytes", o->kv_cache_bytes,
             "KV cache memory budget (e.g. 1GiB; default on cuda: what --gpu-memory-fraction leaves)")
          ->transform(CLI::AsSizeValue(false))
          ->capture_default_str();
      cmd->add_option("--kv-blocks", o->kv_blocks,
                      "KV cache size in blocks (overrides --kv-cache-bytes; 0: use it)")
          ->capture_default_str();
      cmd->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
      cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences running at once")->capture_default_str();
      cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                      "Tokens computed per engine step")
          ->capture_default_str();
      cmd->add_option(
             "--target-step-ms", o->target_step_ms,
             "Decoders: keep each engine step near N ms by admitting only the prefill tokens that a "
             "running fit of measured step times (tokens, KV positions read) says fit after the "
             "step's decodes; at least 64 prefill tokens per step so waiting prompts progress. Bounds "
             "the inter-token gap prefill adds (set it near the TPOT you want). 0: off, only "
             "--max-num-batched-tokens limits a step")
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
      cmd->add_option(
             "--async-output", o->async_output,
             "Decoders: on = detokenising, stop strings and the hand-off of each step's tokens run on "
             "an output thread while the model runs the next step (the GPU does not wait for "
             "them); a stop string is then seen one step late (one more token computed and dropped, "
             "outputs unchanged). off = between steps. auto = on for a decoder on a GPU (the host's "
             "time between steps 3.62 -> 0.68 ms at c=512 on an H200), off on the CPU (level there)")
          ->check(CLI::IsMember({"auto", "on", "off"}))
          ->capture_default_str();
      cmd->add_flag("--no-chunked-prefill", o->no_chunked_prefill,
                    "Admit a prompt only when it fits one step whole");
      cmd->add_option("--drain-seconds", o->drain_seconds,
                      "On SIGINT/SIGTERM, time in-flight requests get to finish")
          ->capture_default_str();
      cmd->add_option("--idle-timeout-seconds", o->idle_timeout_seconds,
                      "Close keep-alive connections idle this long")
          ->capture_default_str();
      cmd->add_option("--request-timeout-seconds", o->request_timeout_seconds,
                      "A request must arrive whole within this long of its first byte (else 408)")
          ->capture_default_str();
      cmd->add_option("--api-key", o->api_key,
                      "Require 'Authorization: Bearer KEY' (gRPC: metadata authorization) on every route "
                      "but /health* (and /metrics, unless --metrics-require-key), for every model; else 401");
      cmd->add_option(
          "--api-key-file", o->api_key_file,
          "Like --api-key, the key read from this file (its first line), so it stays out of `ps`");
      cmd->add_flag("--metrics-require-key", o->metrics_require_key,
                    "With --api-key: /metrics needs the key too (default: open, for Prometheus)");
      cmd->add_option("--gpu-telemetry-interval-ms", o->gpu_telemetry_interval_ms,
                      "GPU telemetry (NVML/GPM -> /metrics, /v1/gpu) sampling period")
          ->capture_default_str();
      cmd->add_flag("--no-gpu-telemetry", o->no_gpu_telemetry, "Do not load NVML or sample the GPUs");
      AddDeviceFlags(cmd, &o->device);
      AddEncoderAttentionFlag(cmd, &o->encoder_attention);
      AddEncoderEpiloguesFlag(cmd, &o->encoder_epilogues);
      AddEncoderCudaGraphsFlag(cmd, &o->encoder_cuda_graphs);
      cmd->add_option(
             "--preprocess", o->preprocess,
             "Image models: where decode, resize and normalise run: cpu (all of it on each instance's "
             "thread pool), gpu (decode on the CPU, resize + normalise on the GPU into the model's input) or "
             "nvjpeg (JPEGs decoded on the GPU by nvJPEG too, PNG still on the CPU; needs a build with "
             "nvJPEG). gpu and nvjpeg need the model on the GPU: --device cuda")
          ->check(CLI::IsMember({"cpu", "gpu", "nvjpeg"}))
          ->capture_default_str();
      cmd->add_option(
             "--conv-backend", o->conv_backend,
             "Image models on the GPU (--device cuda): how convolutions run: cudnn (cuDNN, conv + bias "
             "+ ReLU in one call, the fastest algorithm measured per shape), im2col (our im2col + a "
             "cuBLAS GEMM, then bias + activation) or auto (with cuDNN in the build: im2col below a "
             "batch of 32 images, cudnn from 32, as measured on the H200; else im2col). Depthwise convs always run our direct kernel. Other than auto with the model on "
             "the CPU: refused at load")
          ->check(CLI::IsMember({"auto", "cudnn", "im2col"}))
          ->capture_default_str();
      cmd->add_option("--instances", o->instances,
                      "Encoder models: instances, each with its own thread pool or CUDA stream (0: the model "
                      "file's instance_group, else 1)")
          ->check(CLI::NonNegativeNumber);
      cmd->add_option("--max-batch-size", o->max_batch_size,
                      "Encoder models: largest batch the dynamic batcher forms (0: the model file's "
                      "max_batch_size; > 0 turns dynamic batching on)")
          ->capture_default_str();
      cmd->add_option(
             "--max-queue-delay-us", o->max_queue_delay_us,
             "Encoder models: longest the oldest queued request waits for its batch to grow (-1: the "
             "model file's max_queue_delay_microseconds; >= 0 turns dynamic batching on)")
          ->capture_default_str();
      cmd->add_option("--metric-names", o->metric_names,
                      "/metrics family names: vllm (stoke:name; promtool lints the colon) or prometheus "
                      "(stoke_name; lint-clean)")
          ->capture_default_str();
      cmd->add_flag("--allow-inconsistent", o->allow_inconsistent,
                    "Serve a --kv-cache-dtype or --quantization the output-consistency gate at load rejects "
                    "(docs/precision.md)");
      AddCalibrationFlags(cmd, &o->calibration);
      cmd->add_option("--debug-requests", o->debug_requests,
                      "Finished requests (with their time ledgers) GET /v1/debug/requests keeps (0: off)")
          ->capture_default_str();
      cmd->add_flag(
          "--no-ledger", o->no_ledger,
          "Do not record finished requests' time ledgers (no request_stage_seconds, /v1/debug/requests "
          "entries or trace request spans; X-Stoke-Ledger: 1 is still answered): to measure their cost");
      cmd->add_option("--event-batching", o->event_batching,
                      "LLM: on = the engine thread queues each step's streamed tokens and hands them to the "
                      "connections in one batch (an io thread fans them out); off = one hand-off per token "
                      "from the engine thread (for A/B until measured on a GPU)")
          ->check(CLI::IsMember({"on", "off"}))
          ->capture_default_str();
      return [cmd, o](const Backends& backends) -> int { return RunServe(cmd, o.get(), backends); };
    });

}  // namespace
}  // namespace stoke
