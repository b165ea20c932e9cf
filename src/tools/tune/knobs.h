// What stoke tune turns: the serving knobs of one `stoke serve`, for the two kinds of model it serves.
//
//   kind      knob                     stoke serve flag            "own" (the server's default) when
//   batched   max_batch_size           --max-batch-size N          0
//             max_queue_delay_us       --max-queue-delay-us US     -1
//             instances                --instances N               0
//             quantization             --quantization fp8|int8     "" (none); BERT encoders only, gated at
//                                                                  load (step "precision"); int8 with
//                                                                  --calibration-data (tune's own flag)
//   decoder   max_num_seqs             --max-num-seqs N            0
//             max_num_batched_tokens   --max-num-batched-tokens N  0
//             chunked_prefill          --no-chunked-prefill (off)  -1 (0 off, 1 on)
//             cuda_graphs              --cuda-graphs on|off        -1 (0 off, 1 on)
//             target_step_ms           --target-step-ms MS         0 (off); tried only with a TPOT SLO
//             async_output             --async-output on|off       -1 (0 off, 1 on; own: auto = on on cuda);
//                                                                  tried only on cuda
//             kv_cache_dtype           --kv-cache-dtype int8|fp8   "" (the model's own: bf16); the server
//                                                                  runs the consistency gate at load
//             quantization             --quantization fp8          "" (none: the checkpoint's weights); gated
//                                                                  at load as kv_cache_dtype (step
//                                                                  "weight_precision")
//
// A knob left at "own" is not passed, so the server (or the model file) decides.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stoke::tune {

// Batched: KServe with /v2/models/M/config (the dynamic batcher). Decoder: the OpenAI API, continuous
// batching.
enum class ModelKind : uint8_t { kUnknown, kBatched, kDecoder };
const char* KindName(ModelKind k);  // "unknown" | "batched" | "decoder"

struct Knobs {
  int max_batch_size = 0;
  int64_t max_queue_delay_us = -1;
  int instances = 0;
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int chunked_prefill = -1;
  int cuda_graphs = -1;
  double target_step_ms = 0;   // 0 = own (off): the scheduler's step-time target (docs/scheduling.md)
  int async_output = -1;       // -1 = own (auto: on on cuda): tokens' text on an output thread
  std::string kv_cache_dtype;  // "" = own; "int8" | "fp8" (docs/precision.md)
  std::string quantization;    // "" = own (none); "fp8" | "int8" (encoders; docs/precision.md)
  std::string calibration_data;  // int8: the calibration samples (--calibration-data), "" otherwise
  bool operator==(const Knobs&) const = default;
  // "batch 8, delay 1000 us, instances 2" | "seqs 64, tokens 2048, chunked on, graphs own"; "own" where
  // unset.
  std::string Describe(ModelKind kind) const;
  // The flags that set it, after "serve" (only the knobs that are not "own").
  std::vector<std::string> Flags(ModelKind kind) const;
};

// The knob's value for charts; "own" reads as the server's default when known (`own`). kv_cache_dtype is an
// index: 0 own (bf16), 1 int8, 2 fp8; weight_precision and precision (the quantization knob's steps): 0 own,
// 1 fp8, 2 int8.
double KnobValue(const std::string& knob, const Knobs& k);
nlohmann::json KnobsJson(const Knobs& k, ModelKind kind);

// The defaults `stoke serve --help` shows for the decoder knobs (the server does not report its scheduler
// settings over HTTP), and whether it has the --kv-cache-dtype and --quantization flags. 0 / -1 where the
// help does not say.
struct ServeDefaults {
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int cuda_graphs = -1;
  bool has_kv_cache_dtype = false;
  bool has_quantization = false;
};
ServeDefaults ParseServeHelp(const std::string& help_text);
// Runs `exe serve --help` and parses it.
ServeDefaults ReadServeDefaults(const std::string& exe);

}  // namespace stoke::tune
