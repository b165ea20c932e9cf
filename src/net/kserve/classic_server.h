// `stoke serve` for stateless models (encoders, the synthetic model): the dynamic batcher and instance
// group behind KServe v2 REST + gRPC, the OpenAI embeddings API, /health and /metrics.
// apps/stoke/cmd_serve.cc calls RunClassicServe when IsClassicModel(--model).
//
// --model is one of
//   - an HF folder of a BERT-family encoder (config.json model_type "bert"), or a known encoder alias
//     ("all-minilm-l6-v2"): served with the defaults below;
//   - a model file, JSON with "type": "bert" or "synthetic" and Triton-named batching keys:
//       {"type": "bert", "model": "all-minilm-l6-v2", "name": "minilm", "max_batch_size": 32,
//        "dynamic_batching": {"max_queue_delay_microseconds": 500}, "instance_group": [{"count": 2}],
//        "device": "cuda"}
//       {"type": "synthetic", "name": "synth", ... synthetic.h keys ..., "max_batch_size": 8}
//     "model" may be relative to the file's folder.
// A BERT model is served twice over the same weights: "<name>" (BYTES "text") and "<name>-ids" (INT64
// input_ids + attention_mask); /v1/embeddings uses "<name>".
// Defaults without a file: max_batch_size 32, dynamic batching with max_queue_delay 0 (batches form from
// what queues while the instance is busy), one instance. In a file, as in Triton, no "dynamic_batching" key
// means batching off (max_batch_size still defaults to 32 for bert).
#pragma once

#include <cstddef>
#include <string>

#include "engine/model/backends.h"
#include "telemetry/metrics.h"

namespace stoke {

struct ClassicServeOptions {
  std::string model;
  std::string served_model_name;  // "" = the file's "name", else the alias / folder name
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 8001;  // 0: any free port; -1: no gRPC
  int http_threads = 2;
  size_t max_body_bytes = 8u << 20;
  int threads = 0;  // compute threads; 0 = hardware threads
  double drain_seconds = 10;
  double idle_timeout_seconds = 120;
  bool gpu_telemetry = true;  // NVML/GPM sampler -> /metrics and GET /v1/gpu
  int gpu_telemetry_interval_ms = 1000;
  // bert: "cpu", "cuda" or "auto"; "" = the model file's "device" key, else cpu. Each instance gets its own
  // device runner (CUDA: its own stream and scratch over weights uploaded once).
  std::string device;
  // bert on CUDA: the attention kernel (BertDeviceOptions::attention; flag --encoder-attention).
  std::string encoder_attention = "auto";
  int instances = 0;  // > 0: overrides the instance count (the model file's instance_group, default 1)
  // > 0: overrides max_batch_size (and turns dynamic batching on if the model file has it off); 0 = the
  // model's own. Larger: fewer executions per request, each batch waits for its slowest row.
  int max_batch_size = 0;
  // >= 0: overrides dynamic_batching.max_queue_delay_microseconds (turning dynamic batching on); -1 = the
  // model's own. Larger: fuller batches under light load, + up to this much queueing per request.
  int64_t max_queue_delay_us = -1;
  MetricNaming metric_naming = MetricNaming::kVllm;  // /metrics names: stoke:... or stoke_...
  int debug_requests = 1000;  // finished requests GET /v1/debug/requests keeps (0: off)
  bool record_ledger = true;  // false (`--no-ledger`): no per-request ledger to /metrics, the log, traces
};

// True for a .json model file or a BERT-family HF folder / known encoder alias (decided without fetching).
bool IsClassicModel(const std::string& model);

// Runs the server until SIGINT/SIGTERM; returns the process exit code. `backends` (built in main) decide
// where "cuda" / "auto" devices come from (LoadBertOnDevice, SyntheticClassicModel). Prints, on stderr,
// "stoke serve: listening on http://HOST:PORT (loading MODEL)", "stoke serve: gRPC listening on HOST:PORT"
// and "stoke serve: ready on ..." once the models serve.
int RunClassicServe(const ClassicServeOptions& options, const Backends& backends);

}  // namespace stoke
