// What `stoke serve` is told (apps/stoke/cmd_serve.cc fills it from the flags and --config): the models, the
// listeners, and the defaults every model gets unless its own settings (a stoke.toml in the repository
// folder) say otherwise. Each field's flag is in docs/api.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/kv_cache_dtype.h"
#include "api/weight_quantization.h"
#include "engine/model/bert_backend.h"
#include "engine/model/bert_int8.h"
#include "engine/model/factory.h"
#include "telemetry/metrics.h"

namespace stoke {

// One model: a --model argument, or one folder of --model-repository. Unset fields take the server's.
struct ModelSettings {
  std::string name;    // served name ("" = the file's "name", the alias, or the file/folder name)
  std::string source;  // alias, GGUF file, HF folder, ONNX file (image classifier), or model file (*.json)
  std::string kind;    // "" = from the source | decoder | encoder | image | synthetic
  std::optional<std::string> device;               // auto | cpu | cuda
  std::optional<double> gpu_memory_fraction;       // decoders on CUDA: its share of the GPU's memory
  std::optional<int64_t> kv_cache_bytes;           // decoders
  std::optional<KvCacheDtype> kv_cache_dtype;      // decoders: its KV precision (docs/precision.md)
  std::optional<WeightQuantization> quantization;  // decoders, encoders: weight precision (docs/precision.md)
  std::optional<std::string> calibration_data;     // encoders at int8: the calibration samples' file
  std::optional<int> instances;                    // batched models
  std::optional<int> max_batch_size;               // batched models
  std::optional<int64_t> max_queue_delay_us;       // batched models
  bool load = true;                                // loaded at start (false: only by the repository API)
  std::string origin;                              // for messages: "--model X", "DIR/NAME/stoke.toml"
};

struct ServerOptions {
  std::vector<ModelSettings> models;
  std::string model_repository;  // a folder of model folders (repository_folder.h), read at start

  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 8001;        // 0: any free port; -1: off
  bool grpc_port_set = false;  // given explicitly (a decoder-only server then warns that it has no gRPC)
  // Limits and access, the same for every model and route (docs/reliability.md).
  size_t max_body_bytes = 8u << 20;     // HTTP bodies (413) and KServe gRPC request messages
  size_t max_header_bytes = 64u << 10;  // request line + headers (431)
  int max_connections = 0;              // open HTTP connections; beyond: 503 + close (0: fd limit only)
  double request_timeout_seconds = 60;  // a request must arrive whole within this (408)
  std::string api_key;                  // "" = open; else Bearer on HTTP and gRPC but health (401)
  bool metrics_require_key = false;     // with api_key: /metrics too
  int http_threads = 2;
  int threads = 0;            // compute threads; 0 = hardware threads
  double drain_seconds = 10;  // after the first SIGINT/SIGTERM; a second exits 128+signo
  double idle_timeout_seconds = 120;
  bool gpu_telemetry = true;
  int gpu_telemetry_interval_ms = 1000;
  MetricNaming metric_naming = MetricNaming::kVllm;
  int debug_requests = 1000;
  bool record_ledger = true;
  // --event-batching on: OpenAiServiceOptions::batch_generation_events.
  bool batch_generation_events = false;

  // Decoders.
  DecoderOptions decoder;  // device, GPU memory fraction, KV cache dtype, engine knobs
  // A decoder whose KV precision differs from the backend's reference is checked against it at load (the
  // output-consistency gate, tools/precision/serve_gate.h); a failing one is refused unless this is set.
  bool allow_inconsistent = false;
  // Encoders at --quantization int8: the calibration samples (--calibration-data; a model's stoke.toml
  // calibration_data overrides it) and the percentile of |x| each activation scale clips at.
  std::string calibration_data;
  double calibration_percentile = BertCalibrationOptions{}.percentile;
  double calibration_smoothing = BertCalibrationOptions{}.smoothing_alpha;
  Int8Activations int8_activations = BertCalibrationOptions{}.activations;  // --int8-activations
  int64_t kv_cache_bytes = int64_t{1} << 30;
  bool kv_cache_bytes_set = false;  // given explicitly; else cuda sizes the KV itself
  int kv_blocks = 0;
  int block_size = 16;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  double target_step_ms = 0;  // LlmLoopOptions::target_step_ms (0: off)
  int max_waiting = 1024;
  bool prefix_cache = true;
  bool device_sampling = true;
  // --async-output auto|on|off -> LlmLoopOptions::async_output; auto = on for a decoder on a GPU (measured
  // there: bench/results/gpu_served_async_output_h200_2026-12-06.json), off on the CPU (level there).
  std::string async_output = "auto";
  bool chunked_prefill = true;

  // Batched models (encoders, image classifiers, synthetic).
  std::string batched_device;  // "" = the model file's "device" (else auto); set when --device was given
  std::string encoder_attention = BertDeviceOptions{}.attention;  // BertDeviceOptions' knobs, its defaults
  std::string encoder_epilogues = BertDeviceOptions{}.epilogues;
  bool encoder_cuda_graphs = BertDeviceOptions{}.cuda_graphs;
  std::string image_preprocess = "cpu";  // image classifiers: where decoding and resizing run (gpu: not yet)
  std::string image_conv_backend = "auto";  // image classifiers on a GPU: --conv-backend auto, cudnn, im2col
  int instances = 0;
  int max_batch_size = 0;
  int64_t max_queue_delay_us = -1;
};

}  // namespace stoke
