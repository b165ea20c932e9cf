// stoke tune: the seed's tuning loop, automated, for batched (classic) models. One knob moves at a time:
//
//   baseline (the model's own config)
//   -> max_batch_size (1, 2, 4, ... with a queue delay)  -> max_queue_delay_us (the other delays, best batch)
//   -> instances (1, 2, 4, 8 with the best batch; skipped when the doctor names a bandwidth- or compute-bound
//      GPU)  -> precision (skipped: no lower precision for the CPU backend; not yet on CUDA)
//   -> confirmation: baseline and best alternated, the gain with its spread ("no gain" within the noise).
//
// Each point is a fresh `stoke serve` child with the knobs as flags (server_process.h), measured by stoke
// bench's load generator for a fixed time (warm-up + windows, no stability early exit, so the measuring time
// is what the options say). goodput = requests/s that finished at or under the SLO; a point whose p99 is over
// the SLO (or that failed or was invalid) is rejected and counts 0. A step stops when the next value gains
// less than `min_gain` (5 %) over the step's best so far (while nothing meets the SLO it goes on).
// Grid mode measures every combination of the same knob values instead (for comparison).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/workload.h"

namespace stoke::tune {

// A serving configuration; 0 / -1 = the model's own value.
struct Knobs {
  int max_batch_size = 0;
  int64_t max_queue_delay_us = -1;
  int instances = 0;
  bool operator==(const Knobs&) const = default;
  std::string Describe() const;  // "batch 8, delay 1000 us, instances 2" ("model's own" parts say so)
};

struct Measurement {
  int index = 0;
  std::string step;  // baseline | max_batch_size | max_queue_delay_us | instances | confirm | grid
  Knobs knobs;
  bool ok = false;  // the server ran and the point was measured
  std::string error;
  double requests_per_s = 0, goodput_rps = 0, p50_ms = 0, p99_ms = 0;
  int64_t succeeded = 0, errors = 0;
  bool valid = true;
  bool accepted = false;
  std::string why;  // rejected: why
  double warmup_s = 0, measured_s = 0;
  double elapsed_s = 0;  // since tune started, at the end of this point
  double score() const { return accepted ? goodput_rps : 0; }
};

struct StepReport {
  std::string knob;
  std::vector<int> points;  // Measurement::index, in order
  bool skipped = false;
  std::string stopped;  // why the step stopped (or why it was skipped)
  Knobs best;           // the configuration carried to the next step
  int from_point = -1;  // the measurement the step started from (the previous best)
  int best_point = -1;  // the measurement of `best` after the step
};

struct Confirmation {
  bool ran = false;
  std::vector<double> baseline, best;  // goodput per round
  double gain = 0, spread = 0;         // relative: mean(best)/mean(baseline) - 1, and its spread
  std::string verdict;                 // "gain +23% ± 4%" | "no gain (...)" | why it did not run
};

struct TuneOptions {
  std::string model;
  std::string device;  // "" = not passed to serve
  std::string stoke_exe;
  double slo_p99_ms = 0;
  bench::LoadMode mode = bench::LoadMode::kConcurrency;
  double load = 16;
  bench::WorkloadSpec workload;
  double warmup_s = 2, window_s = 5;
  int windows = 1;  // measured time per point = windows x window_s
  double budget_s = 600;
  double min_gain = 0.05;
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  std::vector<int64_t> queue_delays_us = {1000, 0, 5000};  // the first is the batch step's delay
  std::vector<int> instance_counts = {1, 2, 4, 8};
  int confirm_rounds = 3;
  bool grid = false;
  bool doctor = true;
  std::string out_dir;                  // serve logs go to out_dir/logs
  std::vector<std::string> serve_args;  // extra flags for every `stoke serve`
  std::FILE* progress = stderr;         // one line per measurement; nullptr = silent
};

struct TuneResult {
  std::string mode;  // "walk" | "grid"
  std::string model, served_name, device, started_at;
  Knobs baseline_knobs;  // the model's own, as its /v2/models/M/config reported them
  std::vector<Measurement> measurements;
  std::vector<StepReport> steps;
  nlohmann::json doctor;  // the verdicts on the baseline (null when not asked)
  Knobs chosen;
  int chosen_index = -1;  // the measurement of the chosen point
  Confirmation confirmation;
  double measuring_s = 0;  // sum of warm-up + measured seconds of every point, + the doctor's window
  bool budget_exhausted = false;
};

// The walk's decision rule, separated for unit tests: measures `values` in order through `measure` (which
// returns a score, 0 = rejected; nullopt = out of budget) starting from `reference` (the score to beat);
// returns the index of the best value (-1 when none beat the reference) and sets *stopped to why it stopped.
// `ordered` (a monotone axis: batch sizes, instance counts): the climb stops at the first value that gains less
// than min_gain over the value before it (not over the reference: a step may start below the previous step's
// best, as batch 1 does after a baseline of 32). `ordered` = false (values not on a monotone axis, e.g. queue delays): every value is measured and the best
// kept, still only when it beats the reference by min_gain.
int WalkValues(size_t count, double reference, double min_gain,
               const std::function<std::optional<double>(size_t)>& measure,
               const std::function<std::string(size_t)>& name, std::string* stopped, bool ordered = true);

StatusOr<TuneResult> RunTune(const TuneOptions& opts);

}  // namespace stoke::tune
