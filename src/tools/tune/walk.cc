#include "tools/tune/walk.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace stoke::tune {

namespace {

// The verdict of `bottleneck` in `verdicts`, or nullptr.
const nlohmann::json* Find(const nlohmann::json& verdicts, const std::string& bottleneck) {
  if (!verdicts.is_array()) return nullptr;
  for (const nlohmann::json& v : verdicts)
    if (v.is_object() && v.value("bottleneck", "") == bottleneck) return &v;
  return nullptr;
}

std::string Summary(const nlohmann::json& v) {
  return v.value("summary", "");
}

// A warning every step carries when the doctor saw the GPU throttled: its figures may not hold.
std::string ThrottleNote(const nlohmann::json& verdicts) {
  const nlohmann::json* t = Find(verdicts, "throttled");
  if (t == nullptr) return "";
  return "the doctor saw the GPU throttled (" + Summary(*t) + "): this step's figures may not hold";
}

bool ClosedLoopCannotFill(const WalkContext& c, int v) {
  return c.mode == bench::LoadMode::kConcurrency && v > 1 && v / 2 >= c.load;
}

// Closed loop: sequences beyond the requests in flight never run; the smallest value that holds them all is
// still measured.
bool MoreSeqsThanNeeded(const WalkContext& c, int v) {
  if (c.mode != bench::LoadMode::kConcurrency || v <= c.load) return false;
  for (int w : c.max_num_seqs)
    if (w >= c.load && w < v) return true;
  return false;
}

// The weight-precision step of either kind: fp8 weights, and for an encoder with --calibration-data int8 weights
// calibrated on it (docs/precision.md), one point each. Their servers run the consistency gate at load and refuse
// to start when it fails, so such a point fails and is never kept.
void PlanLowerWeights(const WalkContext& c, const Knobs& cur, bool int8, StepPlan* p) {
  if (!c.has_quantization) {
    p->skip = "this stoke serve has no --quantization";
    return;
  }
  if (!cur.quantization.empty()) {
    p->skip = "the weights are " + cur.quantization + " already";
    return;
  }
  p->ordered = false;
  Knobs k = cur;
  k.quantization = "fp8";
  p->candidates.push_back(k);
  p->names.push_back("weights fp8 (gated)");
  if (int8 && !c.calibration_data.empty()) {
    k.quantization = "int8";
    k.calibration_data = c.calibration_data;
    p->candidates.push_back(k);
    p->names.push_back("weights int8, calibrated (gated)");
  }
}

void BatchedSteps(const std::string& step, const WalkContext& c, const Knobs& cur,
                  const nlohmann::json& verdicts, StepPlan* p) {
  if (step == "max_batch_size") {
    for (int bs : c.batch_sizes) {
      Knobs k = cur;
      k.max_batch_size = bs;
      k.max_queue_delay_us = c.queue_delays_us.empty() ? cur.max_queue_delay_us : c.queue_delays_us[0];
      if (bs == c.own.max_batch_size) {
        p->not_measured.push_back(fmt::format("{} (the baseline's)", bs));
      } else if (ClosedLoopCannotFill(c, bs)) {
        p->not_measured.push_back(fmt::format("{} (>= 2x the {} requests in flight)", bs, c.load));
      } else {
        p->candidates.push_back(k);
        p->names.push_back(fmt::format("batch {}", bs));
      }
    }
  } else if (step == "max_queue_delay_us") {
    p->ordered = false;  // delays are not on a monotone axis: a worse 0 says nothing about 5000
    if (c.queue_delays_us.size() <= 1) {
      p->skip = "only one --queue-delays-us value (the batch step's)";
      return;
    }
    if (cur.max_batch_size <= 1) {
      p->skip = "the best max_batch_size is 1: no batch to wait for";
      return;
    }
    for (int64_t d : c.queue_delays_us) {
      if (d == cur.max_queue_delay_us) continue;
      Knobs k = cur;
      k.max_queue_delay_us = d;
      p->candidates.push_back(k);
      p->names.push_back(fmt::format("delay {} us", d));
    }
  } else if (step == "instances") {
    // Only GPU counters make "bandwidth/compute bound" a reason: the doctor's blind compute_bound (instances
    // saturated, no counters) says nothing about what another instance adds.
    for (const char* b : {"bandwidth_bound", "compute_bound"}) {
      const nlohmann::json* v = Find(verdicts, b);
      if (v != nullptr && v->value("gpu_evidence", false)) {
        p->skip = fmt::format(
            "the doctor names the current best {} ({}): more instances share the same "
            "saturated GPU and will not help",
            b, Summary(*v));
        p->doctor_note = p->skip;
        return;
      }
    }
    for (int n : c.instance_counts) {
      if (n <= cur.instances) continue;
      Knobs k = cur;
      k.instances = n;
      p->candidates.push_back(k);
      p->names.push_back(fmt::format("{} instances", n));
    }
  } else if (step == "precision") {
    if (!c.encoder) {
      p->skip =
          "no lower precision for this model (--quantization applies to encoders; this is a synthetic "
          "model file or an image classifier)";
      return;
    }
    // The candidate's server compares its fp8 / int8 encoder with the CPU's fp32 one at load (cosine of
    // embeddings).
    PlanLowerWeights(c, cur, /*int8=*/true, p);
  }
}

void DecoderSteps(const std::string& step, const WalkContext& c, const Knobs& cur,
                  const nlohmann::json& verdicts, StepPlan* p) {
  if (step == "max_num_seqs") {
    const nlohmann::json* kv = Find(verdicts, "kv_capacity_bound");
    for (int v : c.max_num_seqs) {
      Knobs k = cur;
      k.max_num_seqs = v;
      if (v == c.own.max_num_seqs || v == cur.max_num_seqs) {
        p->not_measured.push_back(
            fmt::format("{} (the {}'s)", v, v == c.own.max_num_seqs ? "baseline" : "current best"));
      } else if (MoreSeqsThanNeeded(c, v)) {
        p->not_measured.push_back(fmt::format("{} (more than the {} requests in flight)", v, c.load));
      } else if (kv != nullptr && v > cur.max_num_seqs) {
        p->not_measured.push_back(fmt::format("{} (kv_capacity_bound)", v));
      } else {
        p->candidates.push_back(k);
        p->names.push_back(fmt::format("seqs {}", v));
      }
    }
    if (kv != nullptr) {
      p->doctor_note = fmt::format(
          "the doctor names the current best kv_capacity_bound ({}): more max-num-seqs will not help without "
          "more KV (--kv-cache-bytes / --gpu-memory-fraction); values above {} not measured",
          Summary(*kv), cur.max_num_seqs);
      if (p->candidates.empty()) p->skip = p->doctor_note;
    }
  } else if (step == "max_num_batched_tokens") {
    // A decode step needs a token per running sequence: as many as max_num_seqs, or in closed loop the
    // requests in flight if fewer.
    int seqs = cur.max_num_seqs;
    if (c.mode == bench::LoadMode::kConcurrency && seqs > 0) seqs = std::min(seqs, static_cast<int>(c.load));
    for (int v : c.max_num_batched_tokens) {
      Knobs k = cur;
      k.max_num_batched_tokens = v;
      if (v == c.own.max_num_batched_tokens || v == cur.max_num_batched_tokens) {
        p->not_measured.push_back(
            fmt::format("{} (the {}'s)", v, v == c.own.max_num_batched_tokens ? "baseline" : "current best"));
      } else if (v < seqs) {
        p->not_measured.push_back(
            fmt::format("{} (< {} running sequences: a decode step needs a token each)", v, seqs));
      } else if (cur.chunked_prefill == 0 && c.max_input_tokens > v) {
        p->not_measured.push_back(
            fmt::format("{} (< the {}-token prompts, unchunked)", v, c.max_input_tokens));
      } else {
        p->candidates.push_back(k);
        p->names.push_back(fmt::format("tokens {}", v));
      }
    }
  } else if (step == "chunked_prefill") {
    p->ordered = false;
    const int now = cur.chunked_prefill < 0 ? 1 : cur.chunked_prefill;
    if (now == 1 && c.max_input_tokens > cur.max_num_batched_tokens) {
      p->skip = fmt::format(
          "the workload's prompts (up to {} tokens) exceed the batched-token budget ({}): without chunked "
          "prefill they could not be admitted",
          c.max_input_tokens, cur.max_num_batched_tokens);
      return;
    }
    Knobs k = cur;
    k.chunked_prefill = 1 - now;
    p->candidates.push_back(k);
    p->names.push_back(fmt::format("chunked prefill {}", k.chunked_prefill ? "on" : "off"));
  } else if (step == "target_step_ms") {
    // A step's time is every running stream's inter-token gap: aim the scheduler's step-time target below the
    // TPOT SLO (0.8 of it, leaving room for the steps the fit misjudges and for the first ones it has not
    // seen).
    p->ordered = false;
    if (c.tpot_slo_ms <= 0) {
      p->skip = "no TPOT SLO (--slo-tpot-ms): nothing to aim a step time at";
      return;
    }
    Knobs k = cur;
    k.target_step_ms = std::max(1.0, std::round(0.8 * c.tpot_slo_ms));
    if (k.target_step_ms == cur.target_step_ms) {
      p->not_measured.push_back(fmt::format("{:g} ms (the current best's)", k.target_step_ms));
      return;
    }
    p->candidates.push_back(k);
    p->names.push_back(fmt::format("step target {:g} ms", k.target_step_ms));
  } else if (step == "cuda_graphs") {
    p->ordered = false;
    if (c.device == "cpu") {
      p->skip = "CPU";
      return;
    }
    if (c.device != "cuda") {
      p->skip =
          "CPU or unknown device: --device cuda was not given (CUDA graphs are a knob of the CUDA engine)";
      return;
    }
    const int now = cur.cuda_graphs < 0 ? 1 : cur.cuda_graphs;
    Knobs k = cur;
    k.cuda_graphs = 1 - now;
    p->candidates.push_back(k);
    p->names.push_back(fmt::format("CUDA graphs {}", k.cuda_graphs ? "on" : "off"));
    if (Find(verdicts, "launch_bound") != nullptr)
      p->doctor_note = "the doctor names the current best launch_bound: CUDA graphs are the knob for it";
  } else if (step == "async_output") {
    // The tokens' text on the output thread while the model runs the next step: it pays where the host
    // would otherwise be idle during a step (a GPU's). On the CPU the model's step takes the cores itself and
    // the host part is ~1 % of a step: served SmolLM2-135M at c=8 on the dev VM, level (102.3 vs 102.7
    // output tok/s, bench/results/cpu_llm_async_output_2026-12-05.json).
    p->ordered = false;
    if (c.device != "cuda") {
      p->skip = c.device == "cpu" ? "CPU: the host is ~1% of a CPU step and the model's step takes the cores "
                                    "(measured level on the CPU)"
                                  : "CPU or unknown device: --device cuda was not given (async output "
                                    "overlaps the host's work with a GPU's step)";
      return;
    }
    Knobs k = cur;
    k.async_output = cur.async_output == 0 ? 1 : 0;  // own (-1) is on for a GPU decoder (--async-output auto)
    p->candidates.push_back(k);
    p->names.push_back(fmt::format("async output {}", k.async_output ? "on" : "off"));
    for (const nlohmann::json& v : verdicts.is_array() ? verdicts : nlohmann::json::array()) {
      if (!v.is_object() || !v.contains("evidence") || !v["evidence"].is_array()) continue;
      for (const nlohmann::json& e : v["evidence"]) {
        if (e.is_object() && e.value("signal", "") == "step.host_share") {
          p->doctor_note = fmt::format(
              "the doctor measured the host at {:.0f}% of each step with the GPU idle: async output is its "
              "knob",
              100 * e.value("value", 0.0));
        }
      }
    }
  } else if (step == "kv_cache_dtype") {
    if (!c.has_kv_cache_dtype) {
      p->skip = "this stoke serve has no --kv-cache-dtype";
      return;
    }
    // Each candidate's server runs the output-consistency gate at load against the bf16 cache and refuses
    // to start on a failing precision (docs/precision.md): such a point fails and is never kept.
    p->ordered = false;
    for (const char* d : {"int8", "fp8"}) {
      if (cur.kv_cache_dtype == d) continue;
      Knobs k = cur;
      k.kv_cache_dtype = d;
      p->candidates.push_back(k);
      p->names.push_back(fmt::format("kv {} (gated)", d));
    }
    if (Find(verdicts, "kv_capacity_bound") != nullptr)
      p->doctor_note = "the doctor names the current best kv_capacity_bound: an 8-bit cache holds ~1.9x the tokens";
  } else if (step == "weight_precision") {
    // The candidate's server runs the decoder gate at load against the checkpoint's weights, as the KV step.
    PlanLowerWeights(c, cur, /*int8=*/false, p);  // decoders: int8 weights are refused (fp8 only)
  }
}

}  // namespace

std::string Slos::Describe() const {
  std::vector<std::string> parts;
  if (p99_ms > 0) parts.push_back(fmt::format("p99 {} ms", p99_ms));
  if (ttft_ms > 0) parts.push_back(fmt::format("TTFT p99 {} ms", ttft_ms));
  if (tpot_ms > 0) parts.push_back(fmt::format("TPOT p99 {} ms", tpot_ms));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

void Judge(const Slos& s, Measurement* m) {
  m->accepted = false;
  if (!m->ok) {
    m->why = m->why.empty() ? "failed" : m->why;
    return;
  }
  if (!m->valid) {
    m->why = "invalid: " + (m->invalid_reason.empty() ? std::string("?") : m->invalid_reason);
  } else if (m->errors > 0) {
    m->why = fmt::format("{} failed requests", m->errors);
  } else if (m->succeeded == 0) {
    m->why = "no request finished";
  } else if (s.p99_ms > 0 && m->p99_ms > s.p99_ms) {
    m->why = fmt::format("p99 {:.1f} ms > SLO {:.1f} ms", m->p99_ms, s.p99_ms);
  } else if (s.ttft_ms > 0 && m->ttft_p99_ms > s.ttft_ms) {
    m->why = fmt::format("TTFT p99 {:.1f} ms > SLO {:.1f} ms", m->ttft_p99_ms, s.ttft_ms);
  } else if (s.tpot_ms > 0 && m->tpot_p99_ms > s.tpot_ms) {
    m->why = fmt::format("TPOT p99 {:.2f} ms > SLO {:.2f} ms", m->tpot_p99_ms, s.tpot_ms);
  } else {
    m->accepted = true;
    m->why.clear();
  }
}

std::vector<std::string> StepOrder(ModelKind kind) {
  if (kind == ModelKind::kDecoder)
    return {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "target_step_ms",
            "cuda_graphs",  "async_output",           "kv_cache_dtype",  "weight_precision"};
  return {"max_batch_size", "max_queue_delay_us", "instances", "precision"};
}

StepPlan PlanStep(const std::string& step, const WalkContext& c, const Knobs& current,
                  const nlohmann::json& verdicts) {
  StepPlan p;
  if (c.kind == ModelKind::kDecoder) {
    DecoderSteps(step, c, current, verdicts, &p);
  } else {
    BatchedSteps(step, c, current, verdicts, &p);
  }
  if (p.skip.empty() && p.candidates.empty())
    p.skip = p.not_measured.empty() ? "no value to try"
                                    : fmt::format("no value to try: {}", fmt::join(p.not_measured, ", "));
  if (const std::string t = ThrottleNote(verdicts); !t.empty())
    p.doctor_note = p.doctor_note.empty() ? t : p.doctor_note + "; " + t;
  return p;
}

int WalkValues(size_t count, double reference, double min_gain,
               const std::function<std::optional<double>(size_t)>& measure,
               const std::function<std::string(size_t)>& name, std::string* stopped, bool ordered) {
  int best = -1;
  double best_score = reference;
  bool have_prev = false;
  double prev = 0;
  std::string prev_name;
  for (size_t i = 0; i < count; ++i) {
    std::optional<double> s = measure(i);
    if (!s) {
      *stopped = fmt::format("the budget is spent before {}", name(i));
      return best;
    }
    if (*s > 0 && *s >= best_score * (1 + min_gain)) {
      best = static_cast<int>(i);
      best_score = *s;
    }
    if (ordered && have_prev && prev > 0 && *s < prev * (1 + min_gain)) {
      *stopped = fmt::format("{} gains {:+.1f} % goodput over {} (< {:.0f} %)", name(i),
                             100 * (*s / prev - 1), prev_name, 100 * min_gain);
      if (best < 0 && reference > 0)
        *stopped += fmt::format("; no value beat the previous step's best ({:.1f}/s) by {:.0f} %", reference,
                                100 * min_gain);
      return best;
    }
    have_prev = true;
    prev = *s;
    prev_name = name(i);
  }
  *stopped = count == 0 ? "no value to try" : "every value measured";
  if (best < 0 && best_score <= 0 && count > 0) *stopped = "no value meets the SLO";
  if (best < 0 && reference > 0 && count > 0)
    *stopped += fmt::format("; no value beat the previous step's best ({:.1f}/s) by {:.0f} %", reference,
                            100 * min_gain);
  return best;
}

Advice AdviseNext(const WalkContext& c, const Knobs& baseline, const nlohmann::json& verdicts) {
  Advice a;
  for (const std::string& step : StepOrder(c.kind)) {
    StepPlan p = PlanStep(step, c, baseline, verdicts);
    if (!p.skip.empty()) continue;
    // The next value up from the baseline's on an ordered axis (the smallest that can hold every request in
    // flight for max_num_seqs), else the step's only candidate.
    size_t pick = 0;
    if (p.ordered) {
      for (size_t i = 0; i < p.candidates.size(); ++i) {
        const double v = KnobValue(step, p.candidates[i]), now = KnobValue(step, baseline);
        const bool fits = step != "max_num_seqs" || c.mode != bench::LoadMode::kConcurrency || v >= c.load;
        if ((now <= 0 || v > now) && fits) {
          pick = i;
          break;
        }
      }
    }
    // Only the flags this step moves.
    const Knobs& k = p.candidates[pick];
    Knobs moved;
    if (k.max_batch_size != baseline.max_batch_size) moved.max_batch_size = k.max_batch_size;
    if (k.max_queue_delay_us != baseline.max_queue_delay_us) moved.max_queue_delay_us = k.max_queue_delay_us;
    if (k.instances != baseline.instances) moved.instances = k.instances;
    if (k.max_num_seqs != baseline.max_num_seqs) moved.max_num_seqs = k.max_num_seqs;
    if (k.max_num_batched_tokens != baseline.max_num_batched_tokens)
      moved.max_num_batched_tokens = k.max_num_batched_tokens;
    if (k.chunked_prefill != baseline.chunked_prefill) moved.chunked_prefill = k.chunked_prefill;
    if (k.cuda_graphs != baseline.cuda_graphs) moved.cuda_graphs = k.cuda_graphs;
    if (k.target_step_ms != baseline.target_step_ms) moved.target_step_ms = k.target_step_ms;
    if (k.async_output != baseline.async_output) moved.async_output = k.async_output;
    a.flag = fmt::format("{}", fmt::join(moved.Flags(c.kind), " "));
    a.step = step;
    a.why = fmt::format("the walk's first step the doctor does not rule out ({}: {})", step, p.names[pick]);
    if (!p.doctor_note.empty()) a.why += "; " + p.doctor_note;
    break;
  }
  if (const nlohmann::json* kv = Find(verdicts, "kv_capacity_bound");
      kv != nullptr && c.kind == ModelKind::kDecoder) {
    a.step = "kv_cache";
    a.flag = "--kv-cache-bytes (larger) or --gpu-memory-fraction (higher)";
    a.why = "the doctor names the baseline kv_capacity_bound (" + Summary(*kv) + "): more KV first";
  }
  return a;
}

}  // namespace stoke::tune
