// stoke tune: the seed's tuning loop, automated. One knob moves at a time, in the seed's order for the kind
// of model (walk.h StepOrder):
//
//   batched (encoders, model files):  baseline -> max_batch_size (with a queue delay) -> max_queue_delay_us
//                                     -> instances -> precision (encoders: --quantization fp8, gated at
//                                     load by the server; skipped for model files and image classifiers)
//   decoders (GGUF / HF Llama-family): baseline -> max_num_seqs -> max_num_batched_tokens -> chunked prefill
//                                     -> step-time target (with a TPOT SLO) -> CUDA graphs (--device cuda
//                                     only) -> KV cache dtype (int8, fp8: the server gates each at load) ->
//                                     weight precision (--quantization fp8, gated at load the same way)
//   then the confirmation: baseline and best alternated, the gain with its spread ("no gain" within the
//   noise).
//
// Each point is a fresh `stoke serve` child with the knobs as flags (server_process.h), measured by stoke
// bench's load generator for a fixed time (warm-up + windows, no stability early exit, so the measuring time
// is what the options say): KServe v2 HTTP for batched models, streamed chat completions for decoders. The
// doctor watches every point while it is measured (doctor_probe.h); its verdict on the point a step starts
// from is recorded with the step and can rule values out (walk.h PlanStep). goodput = requests/s meeting
// every SLO; a point whose p99 (e2e, TTFT, TPOT: the SLOs given) is over its SLO, or that failed or was
// invalid, is rejected and counts 0. A step stops when the next value gains less than `min_gain` (5 %).
//
// Grid mode measures every combination of the batched knobs' values instead (for comparison). --url mode
// (RunUrlTune) measures a server tune did not start and names the next flag to try (it cannot restart it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/workload.h"
#include "tools/tune/knobs.h"
#include "tools/tune/walk.h"

namespace stoke::tune {

struct StepReport {
  std::string knob;
  std::vector<int> points;  // Measurement::index, in order
  bool skipped = false;
  std::string stopped;      // why the step stopped (or why it was skipped)
  std::string doctor_note;  // what the doctor's verdict changed for this step ("" = nothing)
  nlohmann::json doctor;    // the doctor's verdicts on the point the step started from (null: not asked)
  Knobs best;               // the configuration carried to the next step
  int from_point = -1;      // the measurement the step started from (the previous best)
  int best_point = -1;      // the measurement of `best` after the step
};

struct Confirmation {
  bool ran = false;
  std::vector<double> baseline, best;  // goodput per round
  double gain = 0, spread = 0;         // relative: mean(best)/mean(baseline) - 1, and its spread
  std::string verdict;                 // "gain +23% ± 4%" | "no gain (...)" | why it did not run
};

struct TuneOptions {
  std::string model;
  std::string url;     // --url: tune measures this server and advises (RunUrlTune); "" = start servers
  std::string device;  // "" = not passed to serve
  std::string stoke_exe;
  Slos slos;
  bench::LoadMode mode = bench::LoadMode::kConcurrency;
  double load = 16;
  bench::WorkloadSpec workload;
  double warmup_s = 2, window_s = 5;
  int windows = 1;  // measured time per point = windows x window_s
  double budget_s = 600;
  double min_gain = 0.05;
  // batched models
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  std::vector<int64_t> queue_delays_us = {1000, 0, 5000};  // the first is the batch step's delay
  std::vector<int> instance_counts = {1, 2, 4, 8};
  // decoders
  std::vector<int> max_num_seqs = {8, 16, 32, 64, 128, 256};
  std::vector<int> max_num_batched_tokens = {512, 1024, 2048, 4096, 8192};
  int confirm_rounds = 3;
  bool grid = false;
  bool doctor = true;
  int prebuilt_requests = 0;            // bench's pre-built request pool per point (0 = bench's default)
  std::string out_dir;                  // serve logs go to out_dir/logs
  std::vector<std::string> serve_args;  // extra flags for every `stoke serve`
  std::string calibration_data;         // encoders: the precision step also tries int8 calibrated on this
  std::FILE* progress = stderr;         // one line per measurement; nullptr = silent
};

struct TuneResult {
  std::string mode;  // "walk" | "grid" | "url"
  ModelKind kind = ModelKind::kUnknown;
  std::string model, served_name, device, started_at, url;
  Knobs baseline_knobs;  // the model's own, as its server reported them (batched) or serve --help says
                         // (decoder)
  std::vector<Measurement> measurements;
  std::vector<StepReport> steps;
  nlohmann::json doctor;  // the verdicts on the baseline (null when not asked)
  Knobs chosen;
  int chosen_index = -1;  // the measurement of the chosen point
  Confirmation confirmation;
  Advice advice;           // --url: the next flag to try
  double measuring_s = 0;  // sum of warm-up + measured seconds of every point
  bool budget_exhausted = false;
};

// Validates the options that do not need the model (SLOs, lists); InvalidArgument names the flag.
Status ValidateTuneOptions(const TuneOptions& opts);
StatusOr<TuneResult> RunTune(const TuneOptions& opts);

}  // namespace stoke::tune
