// The walk's decisions, apart from any server or clock (tuner_test.cc tests them on made-up figures):
//
//   StepOrder     the knobs in the seed's order for the model kind
//   PlanStep      one step's candidate values from the current best, with what is not measured and why
//                 (the baseline's own value, values a closed loop cannot fill, what the doctor rules out)
//   WalkValues    the climb: measure values in order, stop at the first that gains < min_gain
//   Judge         a measured point against the SLOs: accepted, or why not
//   AdviseNext    --url: the one flag to try next on a server tune cannot restart
//
// The doctor's verdicts arrive as the JSON array tune stores (tuner.h DoctorVerdictsJson): objects with
// "bottleneck", "summary", "next_step" and "gpu_evidence" (the verdict rests on GPU counters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tools/bench/bench_types.h"
#include "tools/tune/knobs.h"

namespace stoke::tune {

// p99 targets, milliseconds; 0 = not set. ttft/tpot are for decoders (streamed tokens).
struct Slos {
  double p99_ms = 0, ttft_ms = 0, tpot_ms = 0;
  bool any() const { return p99_ms > 0 || ttft_ms > 0 || tpot_ms > 0; }
  bench::Slo ForBench() const { return {.ttft_ms = ttft_ms, .tpot_ms = tpot_ms, .e2e_ms = p99_ms}; }
  std::string Describe() const;  // "p99 150 ms, TTFT p99 500 ms, TPOT p99 50 ms" (the set ones)
};

struct Measurement {
  int index = 0;
  std::string step;  // baseline | a knob | confirm:baseline | confirm:best | grid
  Knobs knobs;
  bool ok = false;  // the server ran and the point was measured
  std::string error;
  double requests_per_s = 0, goodput_rps = 0, p50_ms = 0, p99_ms = 0;
  double ttft_p99_ms = 0, tpot_p99_ms = 0, output_tokens_per_s = 0;  // decoders (streamed)
  double mean_input_tokens = 0;  // decoders: the prompt tokens the server counted (chat template included)
  int64_t succeeded = 0, errors = 0;
  bool valid = true;
  std::string invalid_reason;
  bool accepted = false;
  std::string why;  // rejected: why
  double warmup_s = 0, measured_s = 0;
  double elapsed_s = 0;   // since tune started, at the end of this point
  nlohmann::json doctor;  // the doctor's verdicts on this point (observed while it was measured); null if not
  double generator_cpu_percent = 0;
  double score() const { return accepted ? goodput_rps : 0; }
};

// Sets m->accepted and m->why: rejected when it failed, bench marked it invalid, a request failed, nothing
// finished, or a p99 (e2e, TTFT, TPOT: the ones set) exceeds its SLO. goodput itself is bench's (requests/s
// meeting every SLO, per request).
void Judge(const Slos& slos, Measurement* m);

struct WalkContext {
  ModelKind kind = ModelKind::kBatched;
  bench::LoadMode mode = bench::LoadMode::kConcurrency;
  double load = 16;
  std::string device;  // as given to tune ("" = the server's choice)
  std::vector<int> batch_sizes, instance_counts, max_num_seqs, max_num_batched_tokens;
  std::vector<int64_t> queue_delays_us;
  int max_input_tokens = 0;  // the longest prompt the server sees (chat template included), 0 when not known
  double tpot_slo_ms = 0;    // decoders: the TPOT p99 SLO (the step-time target's step aims below it); 0 none
  Knobs own;                 // the baseline's values made explicit where known
  bool has_kv_cache_dtype = false;
  bool has_quantization = false;  // stoke serve has --quantization (the weight_precision / precision steps)
  bool encoder = false;  // batched: the model is a BERT encoder (platform stoke_bert): the precision step
  std::string calibration_data;  // encoders: --calibration-data: the precision step also tries int8 weights
};

struct StepPlan {
  std::vector<Knobs> candidates;
  std::vector<std::string> names;         // "batch 8", "seqs 32", "chunked prefill off"
  std::vector<std::string> not_measured;  // "64 (the baseline's)"
  std::string skip;                       // non-empty: the whole step is skipped, and why
  std::string doctor_note;                // what the doctor's verdict changed (or a throttling warning)
  bool ordered = true;                    // a monotone axis: climb; else measure every value
};

std::vector<std::string> StepOrder(ModelKind kind);
// `current`: the best so far with its "own" values made explicit; `verdicts`: the doctor on that point.
StepPlan PlanStep(const std::string& step, const WalkContext& c, const Knobs& current,
                  const nlohmann::json& verdicts);

// Measures `values` in order through `measure` (a score, 0 = rejected; nullopt = out of budget) starting from
// `reference` (the score to beat); returns the index of the best value (-1 when none beat the reference by
// min_gain) and sets *stopped to why it stopped. `ordered` (a monotone axis): the climb stops at the first
// value that gains less than min_gain over the value before it (not over the reference: a step may start
// below the previous step's best, as batch 1 does after a baseline of 32). Not ordered: every value is
// measured and the best kept, still only when it beats the reference by min_gain.
int WalkValues(size_t count, double reference, double min_gain,
               const std::function<std::optional<double>(size_t)>& measure,
               const std::function<std::string(size_t)>& name, std::string* stopped, bool ordered = true);

// --url: the flag to try next on a server tune did not start (it cannot restart it), from the walk's order
// and the doctor's verdict on the baseline there.
struct Advice {
  std::string step;  // the walk's step it comes from ("" when none applies)
  std::string flag;  // "--max-num-seqs 32"
  std::string why;
};
Advice AdviseNext(const WalkContext& c, const Knobs& baseline, const nlohmann::json& verdicts);

}  // namespace stoke::tune
