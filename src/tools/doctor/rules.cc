#include "tools/doctor/rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>

namespace stoke::doctor {
namespace {

double Ratio(double a, double b) {
  return Has(a) && Has(b) && b > 0 ? a / b : kNaN;
}
double Share(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0.0 : it->second;
}
// true only when v is known and compares as asked (an unknown signal never fires a rule).
bool Ge(double v, double t) {
  return Has(v) && v >= t;
}
bool Lt(double v, double t) {
  return Has(v) && v < t;
}

// 0.5 at the threshold, 1.0 at `full` (or beyond): how far the deciding number is past its threshold.
double Margin(double value, double threshold, double full) {
  if (!Has(value) || full == threshold) return 0.5;
  return 0.5 + 0.5 * std::clamp((value - threshold) / (full - threshold), 0.0, 1.0);
}

Evidence Ev(std::string signal, double value, std::string op, double threshold, std::string unit,
            std::string note) {
  return {std::move(signal), value, std::move(op), threshold, std::move(unit), std::move(note)};
}

bool IsLlm(const Signals& s) {
  return s.kind == "llm";
}
// The server says the model runs on the CPU (its /v1/models "device"): GPU-only knobs are no step to name.
bool OnCpu(const Signals& s) {
  return s.device == "cpu";  // DecoderModel::device_name() of the CPU engine
}
// The step's model: bytes it reads (weights + KV) and FLOPs per byte (matmul + attention); NaN without it.
double StepBytes(const Signals& s) {
  return (Has(s.step_weight_bytes) ? s.step_weight_bytes : 0) + (Has(s.step_kv_bytes) ? s.step_kv_bytes : 0);
}
double StepFlopPerByte(const Signals& s) {
  const double bytes = StepBytes(s);
  if (!Has(s.step_matmul_flops) || bytes <= 0) return kNaN;
  return (s.step_matmul_flops + (Has(s.step_attention_flops) ? s.step_attention_flops : 0)) / bytes;
}
// Both parts of the step timed at the device's rates (--hbm-gbps and --tensor-tflops: ApplyDeviceRates).
bool StepAtRates(const Signals& s) {
  return Has(s.step_memory_ms) && Has(s.step_math_ms);
}
// An LLM step that, by its own model, is memory-heavy and reads as such: at the device's rates its weights
// and KV take at least step_memory_heavy x its math time (without them, fewer than memory_heavy_flop_per_byte
// FLOPs per byte), with DRAM at least dram_streaming and the tensor pipes short of tensor_high.
bool MemoryBoundByModel(const Signals& s, const Thresholds& t) {
  if (!IsLlm(s) || !Ge(s.dram_active, t.dram_streaming) || Ge(s.tensor_active, t.tensor_high)) return false;
  if (StepAtRates(s)) return s.step_math_ms > 0 && s.step_memory_ms >= t.step_memory_heavy * s.step_math_ms;
  return Lt(StepFlopPerByte(s), t.memory_heavy_flop_per_byte);
}
// A closed loop's finished request is replaced at once, its successor admitted on the next step: about one
// waiting on average (at most 5 % of the running) is turnover; more is a backlog held back by the server.
double Turnover(const Signals& s) {
  return std::max(1.0, 0.05 * (Has(s.running_mean) ? s.running_mean : 0.0));
}
// An 8-bit KV cache already (the server's precision in /v1/models): fp8 KV is no step to name.
bool KvIs8Bit(const Signals& s) {
  return s.kv_cache_dtype == "fp8" || s.kv_cache_dtype == "int8";
}
int Instances(const Signals& s) {
  return std::max(1, s.instances);
}
std::string BatchingKnob(int max_batch, double delay_us) {
  return fmt::format(
      R"(model file: "max_batch_size": {}, "dynamic_batching": {{"max_queue_delay_microseconds": {}}})",
      max_batch, static_cast<long>(delay_us));
}
// The stage group decides only if it matters: the instances are busy (more of them would help), or, where
// busy time is not exported (LLM), it is a real share of the latency. An idle server is under-fed instead.
bool Matters(const Signals& s, double group_s, const Thresholds& t) {
  if (Has(s.instance_busy)) return s.instance_busy >= t.matters_busy;
  return Ge(Ratio(group_s, s.latency_s), t.matters_latency);
}
// GPU rules apply when the device stages are most of the service time, or when there is no ledger.
bool DeviceDominates(const Signals& s, const Thresholds& t) {
  return s.requests == 0 || !Has(s.service_s) || Ge(Ratio(s.device_s, s.service_s), t.device_share);
}
double GpuBusy(const Signals& s) {
  if (Has(s.gr_active) && Has(s.gpu_util)) return std::max(s.gr_active, s.gpu_util);
  return Has(s.gr_active) ? s.gr_active : s.gpu_util;
}

// Throughput of the sweep's last point / its first (NaN without a sweep of growing concurrency).
double SweepScaling(const Signals& s) {
  if (s.load.size() < 2 || s.load.front().requests_per_s <= 0) return kNaN;
  if (s.load.back().concurrency <= s.load.front().concurrency) return kNaN;
  return s.load.back().requests_per_s / s.load.front().requests_per_s;
}
bool SweepStalls(const Signals& s, const Thresholds& t) {
  return Lt(SweepScaling(s), t.min_scaling);
}

using Rule = std::function<std::optional<Verdict>(const Signals&, const Thresholds&)>;

std::optional<Verdict> KvCapacity(const Signals& s, const Thresholds& t) {
  const double no_blocks = Share(s.admission_share, "no_blocks");
  const bool pressure = Ge(s.preemptions, 1) || no_blocks >= t.no_blocks_share;
  if (!Ge(s.kv_usage_max, t.kv_full) || !pressure) return std::nullopt;
  Verdict v{.bottleneck = "kv_capacity_bound"};
  v.confidence = Ge(s.preemptions, 1) && no_blocks >= t.no_blocks_share ? 0.9 : 0.7;
  v.summary = "The KV cache is full: requests wait for blocks or are preempted and recomputed.";
  v.evidence.push_back(
      Ev("llm.kv_usage_max", s.kv_usage_max, ">=", t.kv_full, "ratio", "peak KV-cache usage"));
  v.evidence.push_back(Ev("llm.preemptions", Has(s.preemptions) ? s.preemptions : 0, ">=", 1, "count",
                          "sequences preempted in the window"));
  v.evidence.push_back(Ev("llm.admission_no_blocks_share", no_blocks, ">=", t.no_blocks_share, "ratio",
                          "steps whose admission stopped for lack of KV blocks"));
  if (Has(s.waiting_mean))
    v.evidence.push_back(Ev("llm.waiting_mean", s.waiting_mean, "", kNaN, "requests", ""));
  const long blocks = Has(s.kv_blocks_total) ? static_cast<long>(s.kv_blocks_total) : 0;
  const std::string fewer = Has(s.running_mean) && s.running_mean >= 2
                                ? fmt::format("--max-num-seqs {}", std::max(1, int(s.running_mean * 0.75)))
                                : "";
  if (Ge(s.fb_used_ratio, t.fb_full)) {
    // The GPU's memory is allocated already: the pool cannot double. A smaller cache entry, or fewer
    // sequences; a larger --gpu-memory-fraction only where activations leave room.
    v.evidence.push_back(Ev("gpu.fb_used_ratio", s.fb_used_ratio, ">=", t.fb_full, "ratio",
                            "GPU memory allocated: no room for more blocks"));
    v.next_step = KvIs8Bit(s) ? ""
                              : fmt::format(
                                    "--kv-cache-dtype fp8 ({}): half the bytes per cached token, twice the "
                                    "blocks in the same memory; ",
                                    s.kv_cache_dtype.empty() ? "unless the cache is 8-bit already"
                                                             : "now " + s.kv_cache_dtype);
    v.next_step += fewer.empty() ? "fewer concurrent sequences" : fewer;
    v.next_step += fmt::format(
        " (the GPU's memory is {:.0f}% allocated, so --kv-blocks cannot grow here; a larger "
        "--gpu-memory-fraction only if activations leave room)",
        100 * s.fb_used_ratio);
  } else {
    v.next_step =
        blocks > 0 ? fmt::format("--kv-blocks {} (now {}), or a larger --kv-cache-bytes", 2 * blocks, blocks)
                   : "a larger --kv-cache-bytes (or --kv-blocks)";
    if (!fewer.empty()) v.next_step += "; if memory is fixed: " + fewer;
  }
  v.why = Ge(s.fb_used_ratio, t.fb_full)
              ? "the GPU has no memory left for blocks: smaller cache entries or fewer sequences stop the "
                "preemption churn"
              : "more KV blocks let the running batch grow without evicting; fewer sequences stop the "
                "preemption churn";
  return v;
}

std::optional<Verdict> HostBound(const Signals& s, const Thresholds& t) {
  const double host = Ratio(s.host_s, s.service_s);
  const double io = Ratio(s.io_s, s.latency_s);
  const bool host_fires = Ge(host, t.host_share) && Matters(s, s.host_s, t);
  const bool io_fires = Ge(io, t.io_share) && (Ge(s.io_s, t.io_min_s) || SweepStalls(s, t));
  if (!host_fires && !io_fires) return std::nullopt;
  Verdict v{.bottleneck = "host_bound"};
  if (host_fires) {
    const double pre = s.stage_s.count("preprocess") ? s.stage_s.at("preprocess") : 0;
    const double post = s.stage_s.count("postprocess") ? s.stage_s.at("postprocess") : 0;
    const bool pre_dominates = pre >= post;
    v.confidence = Margin(host, t.host_share, 0.9);
    v.summary = fmt::format(
        "CPU work per request ({} {:.2f} ms) dominates the service time; the GPU waits on the host.",
        pre_dominates ? "preprocess" : "postprocess", 1e3 * std::max(pre, post));
    v.evidence.push_back(Ev("ledger.host_share", host, ">=", t.host_share, "ratio",
                            "preprocess + postprocess (+ schedule) / service time"));
    // The stage that makes the share, and the device time beside it: the evidence names what to move.
    const std::string stage = pre_dominates ? "preprocess" : "postprocess";
    v.evidence.push_back(Ev("ledger." + stage + "_ms", 1e3 * std::max(pre, post), "", kNaN, "ms",
                            pre_dominates ? "per request, on the host (images: decode, resize, normalise; "
                                            "text: tokenise)"
                                          : "per request, on the host (top-k, sampling, output tensors)"));
    if (Has(s.device_s))
      v.evidence.push_back(Ev("ledger.device_ms", 1e3 * s.device_s, "", kNaN, "ms",
                              "per request: compute (the model itself)"));
    if (Has(s.instance_busy))
      v.evidence.push_back(
          Ev("batcher.instance_busy", s.instance_busy, ">=", t.matters_busy, "ratio",
             "fraction of the window each instance executed (or the host share of latency)"));
    if (Has(s.gr_active))
      v.evidence.push_back(Ev("gpu.gr_engine_active", s.gr_active, "", kNaN, "ratio", ""));
    if (IsLlm(s)) {
      const bool async_on = Has(s.step_output_ms) && s.step_output_ms > 0;
      v.next_step = pre_dominates ? "--http-threads 2x (tokenisation runs per request on the HTTP threads)"
                    : OnCpu(s) ? "--device cuda where a GPU is present (on the CPU the model, sampling and "
                                 "detokenising share the same cores; --async-output measured level there)"
                    : async_on ? "--sampling device (sample on the GPU; only token ids reach the host)"
                               : "--async-output on (detokenising, stop strings and events on an output "
                                 "thread while the model runs the next step); --sampling device where "
                                 "requests sample on the host";
    } else {
      v.next_step = fmt::format(
          "--instances {} (each instance has its own CPU thread; model file: \"instance_group\": "
          "[{{\"count\": {}}}])",
          2 * Instances(s), 2 * Instances(s));
      if (pre_dominates)
        v.next_step +=
            "; an image model with the model on the GPU: --preprocess nvjpeg (JPEG decode and resize on the "
            "GPU; --preprocess gpu moves only the resize)";
    }
    v.why =
        "the host stage runs once per request on one thread per instance: more instances overlap it with the "
        "GPU; longer term, move the work to the GPU";
  } else {
    v.confidence = Margin(io, t.io_share, 0.9);
    v.summary = "Reading requests and writing responses (recv + send) dominates the latency.";
    v.evidence.push_back(Ev("ledger.io_share", io, ">=", t.io_share, "ratio", "recv + send / latency"));
    if (Ge(s.io_s, t.io_min_s)) {
      v.evidence.push_back(
          Ev("ledger.io_ms", 1e3 * s.io_s, ">=", 1e3 * t.io_min_s, "ms", "recv + send per request"));
    } else {
      v.evidence.push_back(Ev("load.throughput_scaling", SweepScaling(s), "<", t.min_scaling, "ratio",
                              "throughput at the last sweep point / the first: more clients, no more work"));
    }
    v.next_step = IsLlm(s) ? "--http-threads 2x"
                           : "send tensors in binary (KServe binary extension) or over gRPC "
                             "(--grpc-port), and --http-threads 2x";
    v.why = "JSON tensors cost parsing and formatting per element on the HTTP threads";
  }
  return v;
}

std::optional<Verdict> CopyBound(const Signals& s, const Thresholds& t) {
  const double copy = Ratio(s.copy_s, s.service_s);
  if (!Ge(copy, t.copy_share) || !Matters(s, s.copy_s, t)) return std::nullopt;
  Verdict v{.bottleneck = "copy_bound", .confidence = Margin(copy, t.copy_share, 0.8)};
  v.summary =
      fmt::format("Host<->device copies (h2d + d2h {:.2f} ms per request) are a large share of the work.",
                  1e3 * s.copy_s);
  v.evidence.push_back(
      Ev("ledger.copy_share", copy, ">=", t.copy_share, "ratio", "h2d + d2h / service time"));
  if (Has(s.pcie_bytes_per_s))
    v.evidence.push_back(Ev("gpu.pcie_bytes_per_s", s.pcie_bytes_per_s, "", kNaN, "bytes/s", "PCIe tx + rx"));
  v.next_step =
      "pinned host buffers for the copies (model file: \"buffers\": \"pinned\"); keep data on the GPU "
      "between stages";
  if (s.max_batch_size > 0 && Has(s.mean_batch_size) && s.mean_batch_size < 0.5 * s.max_batch_size) {
    v.next_step += "; batch the copies: " + BatchingKnob(s.max_batch_size, 2000);
  }
  v.why =
      "pageable copies go through a bounce buffer and block the stream (H200: 55 GB/s pinned vs 15.6 "
      "pageable)";
  return v;
}

// The trace's kernel figures as evidence (they decide only where the GPM counters are missing).
void TraceEvidence(const TraceSignals& tr, const Thresholds& t, std::vector<Evidence>* ev) {
  if (tr.gpu_events && Has(tr.gap_mean_us)) {  // no kernel records: the engine's steps timed by CUDA events
    ev->push_back(Ev("trace.gap_mean_us", tr.gap_mean_us, "", kNaN, "us",
                     fmt::format("mean GPU idle gap between engine steps (CUDA events; {} gaps, largest {:.0f} "
                                 "us); GPU busy {:.0f}% of the trace",
                                 tr.gaps, tr.largest_gap_us, 100 * tr.busy_share)));
    return;
  }
  if (!tr.gpu_timeline) return;
  ev->push_back(Ev("trace.mean_kernel_us", tr.mean_kernel_us, "<", t.tiny_kernel_us, "us",
                   fmt::format("mean duration of {} kernels in a {:.1f} s trace", tr.kernels, tr.seconds)));
  if (Has(tr.kernels_per_request))
    ev->push_back(Ev("trace.kernels_per_request", tr.kernels_per_request, ">=", t.many_kernels_per_request,
                     "count", fmt::format("{} requests finished in the trace", tr.requests)));
  if (Has(tr.gap_mean_us))
    ev->push_back(Ev("trace.gap_mean_us", tr.gap_mean_us, "", kNaN, "us",
                     fmt::format("mean idle gap between GPU records ({} gaps, largest {:.0f} us); GPU busy "
                                 "{:.0f}% of the trace",
                                 tr.gaps, tr.largest_gap_us, 100 * tr.busy_share)));
}

// Launch-bound from the trace alone (no SM-activity counter to judge by): many kernels per request, each
// launch-sized.
bool TraceSaysLaunchBound(const Signals& s, const Thresholds& t) {
  const TraceSignals& tr = s.trace;
  return !Has(s.sm_active) && tr.gpu_timeline && Lt(tr.mean_kernel_us, t.tiny_kernel_us) &&
         Ge(tr.kernels_per_request, t.many_kernels_per_request) && DeviceDominates(s, t);
}

std::optional<Verdict> LaunchBound(const Signals& s, const Thresholds& t) {
  const double busy = GpuBusy(s);
  const bool counters = Ge(busy, t.gpu_busy) && Lt(s.sm_active, t.sm_low) && DeviceDominates(s, t);
  const bool from_trace = !counters && TraceSaysLaunchBound(s, t);
  if (!counters && !from_trace) return std::nullopt;
  if (Ge(s.dram_active, t.dram_high) || Ge(s.tensor_active, t.tensor_high)) return std::nullopt;
  Verdict v{.bottleneck = "launch_bound"};
  if (counters) {
    v.confidence = std::min(Margin(busy, t.gpu_busy, 1.0), Margin(-s.sm_active, -t.sm_low, -0.1));
    v.summary = fmt::format(
        "GPU-Util reads {:.0f}% but only {:.0f}% of the SMs are active: many small or serial "
        "kernels keep the GPU 'busy' without filling it.",
        100 * busy, 100 * s.sm_active);
    if (s.trace.gpu_timeline) {
      v.summary += fmt::format(" The trace: {:.0f} kernels per request, {:.1f} us each on average.",
                               s.trace.kernels_per_request, s.trace.mean_kernel_us);
    }
    v.evidence.push_back(Ev("gpu.util_or_gr_active", busy, ">=", t.gpu_busy, "ratio", "a kernel is running"));
    v.evidence.push_back(
        Ev("gpu.sm_active", s.sm_active, "<", t.sm_low, "ratio", "SMs with a warp resident"));
    if (Has(s.dram_active))
      v.evidence.push_back(Ev("gpu.dram_active", s.dram_active, "<", t.dram_high, "ratio", ""));
  } else {
    // Without the SM counter the kernel sizes are inferred, not seen: medium confidence at most.
    v.confidence = 0.6 * Margin(-s.trace.mean_kernel_us, -t.tiny_kernel_us, -1.0);
    v.summary = fmt::format(
        "The trace shows {:.0f} kernels per request lasting {:.1f} us on average: launch-sized kernels, "
        "so launches and the gaps between them set the pace (no SM-activity counter to confirm).",
        s.trace.kernels_per_request, s.trace.mean_kernel_us);
  }
  TraceEvidence(s.trace, t, &v.evidence);
  if (IsLlm(s)) {
    v.next_step = "--cuda-graphs on (replay decode steps as CUDA graphs)";
  } else {
    const int mb = std::max(16, 2 * s.max_batch_size);
    v.next_step =
        BatchingKnob(mb, 2000) + " so each launch does more rows; fuse kernels or capture a CUDA graph";
  }
  v.why =
      "launch overhead and one-block grids leave SMs idle; graphs remove launch gaps, bigger batches widen "
      "grids";
  return v;
}

// An LLM's next step from the trace's kernel split, with its evidence added to v: attention over the KV cache
// heavy -> an 8-bit KV cache (or, when it is 8-bit already, fewer sequences per step); matmuls heavy with
// unquantised weights -> fp8 weights. Empty (v unchanged) without a kernel split or when neither applies.
std::optional<std::string> KernelSplitNextStep(const Signals& s, const Thresholds& t, Verdict* v) {
  const TraceSignals& tr = s.trace;
  if (!IsLlm(s) || !tr.gpu_timeline || !Has(tr.attention_share)) return std::nullopt;
  if (Ge(tr.attention_share, t.attention_heavy)) {
    std::string largest;
    for (const TraceSignals::TopKernel& k : tr.top_kernels) {
      if (k.kind == "attention") {
        largest = "largest " + k.name;
        break;
      }
    }
    v->evidence.push_back(
        Ev("trace.attention_share", tr.attention_share, ">=", t.attention_heavy, "ratio",
           "of GPU kernel time in attention kernels" + (largest.empty() ? "" : "; " + largest)));
    if (KvIs8Bit(s)) {
      const int cap = Has(s.running_max) ? static_cast<int>(s.running_max) : 0;
      return fmt::format(
          "the KV cache ({}) is read every step by attention ({:.0f}% of kernel time): its bytes grow with "
          "sequences x context; {} lowers TPOT at the cost of tokens/s; a GPU with more bandwidth raises "
          "both",
          s.kv_cache_dtype, 100 * tr.attention_share,
          cap > 1 ? fmt::format("--max-num-seqs {} (now {})", cap / 2, cap)
                  : std::string("--max-num-seqs 0.5x"));
    }
    return fmt::format(
        "--kv-cache-dtype fp8{}: attention over the KV cache is {:.0f}% of GPU kernel time; fp8 halves the "
        "bytes it reads (the load's consistency gate checks it; int8 also works)",
        s.kv_cache_dtype.empty() ? " (unless the cache is 8-bit already)" : " (now " + s.kv_cache_dtype + ")",
        100 * tr.attention_share);
  }
  const bool unquantised = s.weight_quantization.empty() || s.weight_quantization == "none";
  if (Ge(tr.matmul_share, t.matmul_heavy) && unquantised) {
    v->evidence.push_back(Ev("trace.matmul_share", tr.matmul_share, ">=", t.matmul_heavy, "ratio",
                             "of GPU kernel time in GEMMs / GEMVs"));
    return fmt::format(
        "--quantization fp8{}: the matmuls are {:.0f}% of GPU kernel time; fp8 weights halve their bytes and "
        "the FP8 GEMMs run ~1.35-1.6x bf16's from 512 tokens per step (the consistency gate checks it)",
        s.weight_quantization.empty() ? " (unless the weights are quantised already)" : "",
        100 * tr.matmul_share);
  }
  return std::nullopt;
}

// An LLM whose GPU verdict leaves the host a share of every step (the GPU idle between the model's runs):
// the share as evidence, and with async output off on a GPU model, --async-output on added to v's next step.
void HostGapNote(const Signals& s, const Thresholds& t, Verdict* v) {
  if (!IsLlm(s) || !Has(s.step_host_ms) || !Has(s.step_ms) || s.step_ms <= 0) return;
  const double share = s.step_host_ms / s.step_ms;
  if (!Ge(share, t.step_host_gap)) return;
  const bool async_on = Has(s.step_output_ms) && s.step_output_ms > 0;
  v->evidence.push_back(Ev("step.host_share", share, ">=", t.step_host_gap, "ratio",
                           async_on ? "host time between the model's runs / step, with async output on "
                                      "already: planning and step inputs"
                                    : "host time between the model's runs / step: the GPU idles for it"));
  if (async_on || OnCpu(s)) return;
  v->next_step += fmt::format(
      "; then --async-output on: the host's {:.2f} ms of each {:.2f} ms step (detokenising, stop strings, "
      "event hand-off) would run while the GPU computes the next step",
      s.step_host_ms, s.step_ms);
}

std::optional<Verdict> BandwidthBound(const Signals& s, const Thresholds& t) {
  if (!DeviceDominates(s, t)) return std::nullopt;
  const bool saturated = Ge(s.dram_active, t.dram_high);
  // Matrix-vector work (decode at small batch): memory traffic with the tensor cores idle and the SMs busy
  // waiting on it. DRAM active reads lower than for a pure copy, yet memory is what limits it.
  const bool streaming = !saturated && Ge(s.dram_active, t.dram_streaming) && Has(s.tensor_active) &&
                         s.tensor_active < t.tensor_idle && Ge(s.sm_active, t.sm_busy_streaming);
  // An LLM step memory-heavy by its own model at the device's rates, with DRAM busy and the tensor pipes
  // short of their ceiling: what the SMs wait on is memory, whatever SM active reads (batched decode: some
  // tensor work, so `streaming` does not hold).
  const bool modelled = !saturated && !streaming && MemoryBoundByModel(s, t);
  if (!saturated && !streaming && !modelled) return std::nullopt;
  const double mem_ms = s.step_memory_ms, math_ms = s.step_math_ms;
  const bool at_rates = StepAtRates(s);  // else judged by FLOPs per byte
  const double fpb = StepFlopPerByte(s);
  Verdict v{.bottleneck = "bandwidth_bound",
            .confidence =
                saturated   ? Margin(s.dram_active, t.dram_high, 0.8)
                : streaming ? 0.9 * Margin(s.dram_active, t.dram_streaming, 0.7)
                : at_rates
                    ? 0.9 * Margin(mem_ms / math_ms, t.step_memory_heavy, 2 * t.step_memory_heavy)
                    : 0.8 * Margin(-fpb, -t.memory_heavy_flop_per_byte, -0.5 * t.memory_heavy_flop_per_byte)};
  if (modelled) {
    const double bytes = StepBytes(s);
    if (at_rates) {
      v.summary = fmt::format(
          "Each step reads {:.1f} GB of weights and KV ({:.2f} ms at {:g} GB/s) for {:.2f} ms of math at the "
          "tensor rate: memory sets the pace ({:.0f}% DRAM active); busy SMs are waiting on it.",
          bytes / 1e9, mem_ms, s.hbm_gbps, math_ms, 100 * s.dram_active);
      v.evidence.push_back(
          Ev("step.memory_ms", mem_ms, ">=", t.step_memory_heavy * math_ms, "ms",
             fmt::format("weights + KV at the device's bandwidth, against {:g} x the {:.2f} ms of "
                         "matmul + attention at its tensor rate",
                         t.step_memory_heavy, math_ms)));
    } else {
      v.summary = fmt::format(
          "Each step reads {:.1f} GB of weights and KV for {:.2f} TFLOP: {:.0f} FLOP per byte, below what "
          "any "
          "current GPU computes per byte it reads; memory sets the pace ({:.0f}% DRAM active) and busy SMs "
          "are "
          "waiting on it.",
          bytes / 1e9, fpb * bytes / 1e12, fpb, 100 * s.dram_active);
      v.evidence.push_back(
          Ev("step.flop_per_byte", fpb, "<", t.memory_heavy_flop_per_byte, "FLOP/byte",
             "the step's matmul + attention FLOPs per byte of weights + KV (give --hbm-gbps and "
             "--tensor-tflops to time it at this device's rates)"));
    }
    v.evidence.push_back(
        Ev("gpu.dram_active", s.dram_active, ">=", t.dram_streaming, "ratio", "DRAM transfer cycles"));
    if (Has(s.tensor_active))
      v.evidence.push_back(Ev("gpu.tensor_active", s.tensor_active, "<", t.tensor_high, "ratio", ""));
    if (Has(s.sm_active)) v.evidence.push_back(Ev("gpu.sm_active", s.sm_active, "", kNaN, "ratio", ""));
  } else if (saturated) {
    v.summary = fmt::format("DRAM bandwidth is saturated ({:.0f}% active; ~80% is the practical maximum).",
                            100 * s.dram_active);
    v.evidence.push_back(
        Ev("gpu.dram_active", s.dram_active, ">=", t.dram_high, "ratio", "DRAM transfer cycles"));
  } else {
    v.summary = fmt::format(
        "The kernels stream memory ({:.0f}% DRAM active) with the tensor cores idle ({:.0f}%): matrix-vector "
        "work, limited by bytes read per step, not by arithmetic.",
        100 * s.dram_active, 100 * s.tensor_active);
    v.evidence.push_back(
        Ev("gpu.dram_active", s.dram_active, ">=", t.dram_streaming, "ratio", "DRAM transfer cycles"));
    v.evidence.push_back(
        Ev("gpu.tensor_active", s.tensor_active, "<", t.tensor_idle, "ratio", "no matrix-multiply work"));
    v.evidence.push_back(Ev("gpu.sm_active", s.sm_active, ">=", t.sm_busy_streaming, "ratio",
                            "SMs resident, waiting on memory"));
  }
  if (saturated && Has(s.sm_active))
    v.evidence.push_back(Ev("gpu.sm_active", s.sm_active, "", kNaN, "ratio", ""));
  if (IsLlm(s)) {
    // A backlog: the running-set cap holds sequences back. None (a closed loop's turnover, about one
    // waiting): the clients set the batch.
    const bool backlog = Ge(s.waiting_mean, Turnover(s));
    v.next_step =
        backlog || !Has(s.running_mean)
            ? "more sequences per step to amortise weight reads (--max-num-seqs 2x), or lower-precision "
              "weights/KV (fp8)"
            : fmt::format(
                  "more sequences per step to amortise weight reads: more concurrent requests (~{:.0f} "
                  "running, none waiting: the clients set the batch; --max-num-seqs must admit them), "
                  "or lower-precision weights/KV (fp8)",
                  s.running_mean);
    if (std::optional<std::string> k = KernelSplitNextStep(s, t, &v)) v.next_step = *k;
    HostGapNote(s, t, &v);
  } else if (Instances(s) > 1) {
    v.next_step =
        "--instances 1 (instances share the HBM bandwidth: more add latency, not throughput); then "
        "fewer bytes per row (lower precision, fusion)";
  } else {
    v.next_step = "fewer bytes per request: lower-precision weights/activations, fused kernels";
  }
  v.why = "every extra byte costs time once DRAM is the limit; serving knobs cannot add bandwidth";
  return v;
}

std::optional<Verdict> ComputeBound(const Signals& s, const Thresholds& t) {
  const bool tensor = Ge(s.tensor_active, t.tensor_high);
  // Busy SMs say compute only where the step is not memory-heavy by its model (bandwidth_bound speaks then).
  const bool sm = Ge(s.sm_active, t.sm_high) && !Ge(s.dram_active, t.dram_high) && !MemoryBoundByModel(s, t);
  const bool blind = !Has(s.sm_active) && !Has(s.tensor_active) && Ge(s.instance_busy, t.saturated_busy) &&
                     Ge(Ratio(s.device_s, s.service_s), t.device_share);
  if ((!tensor && !sm && !blind) || !DeviceDominates(s, t)) return std::nullopt;
  Verdict v{.bottleneck = "compute_bound"};
  if (tensor || sm) {
    v.confidence =
        tensor ? Margin(s.tensor_active, t.tensor_high, 0.95) : Margin(s.sm_active, t.sm_high, 1.0);
    v.summary = "The GPU's arithmetic is the limit: the chip is filled and busy.";
    if (Has(s.tensor_active))
      v.evidence.push_back(
          Ev("gpu.tensor_active", s.tensor_active, ">=", t.tensor_high, "ratio", "tensor pipes"));
    if (Has(s.sm_active))
      v.evidence.push_back(Ev("gpu.sm_active", s.sm_active, ">=", t.sm_high, "ratio", ""));
  } else {
    v.confidence = 0.45;  // no GPU counters: the device stage is the limit, but what inside it is unknown
    v.summary = "The model's compute stage is the limit (instances saturated); no GPU counters to say more.";
    v.evidence.push_back(Ev("batcher.instance_busy", s.instance_busy, ">=", t.saturated_busy, "ratio", ""));
    v.evidence.push_back(Ev("ledger.device_share", Ratio(s.device_s, s.service_s), ">=", t.device_share,
                            "ratio", "compute / service time"));
  }
  v.next_step = "fewer FLOPs per request: fp8/int8 weights, a smaller model; or more GPUs";
  if (std::optional<std::string> k = KernelSplitNextStep(s, t, &v)) v.next_step = *k;
  HostGapNote(s, t, &v);
  v.why = "serving knobs only reorder work a saturated GPU must do anyway";
  return v;
}

std::string QueueKnob(const Signals& s) {
  if (IsLlm(s)) {
    if (Share(s.admission_share, "token_budget") >= 0.5) return "--max-num-batched-tokens 2x";
    const int cap = Has(s.running_max) ? static_cast<int>(s.running_max) : 0;
    return cap > 0
               ? fmt::format(
                     "--max-num-seqs {} (now {}: admission stops at the running-set cap while KV has room)",
                     2 * cap, cap)
               : "--max-num-seqs 2x (admission stops at the running-set cap while KV has room)";
  }
  const double delay_share = Share(s.close_share, "delay");
  if (s.max_batch_size == 0 || Share(s.close_share, "unbatched") >= 0.5) {
    return BatchingKnob(16, 2000) + " (batching is off)";
  }
  if (delay_share >= 0.5 && Has(s.max_queue_delay_us)) {
    const double svc_us = Has(s.service_s) ? 1e6 * s.service_s : 1000;
    const double to = std::max(100.0, std::min(s.max_queue_delay_us / 10, svc_us));
    return fmt::format(
        "model file: \"max_queue_delay_microseconds\": {} (now {}: batches close on the delay with {:.0f} of "
        "{} rows)",
        static_cast<long>(to), static_cast<long>(s.max_queue_delay_us),
        Has(s.mean_batch_size) ? s.mean_batch_size : 0, s.max_batch_size);
  }
  if (Share(s.close_share, "full") >= 0.5) return BatchingKnob(2 * s.max_batch_size, 2000);
  return fmt::format("--instances {}", 2 * Instances(s));
}

std::optional<Verdict> QueueBound(const Signals& s, const Thresholds& t) {
  const double q = Ratio(s.queue_s, s.latency_s);
  if (!Ge(q, t.queue_share)) return std::nullopt;
  const bool inst_idle = Lt(s.instance_busy, t.saturated_busy);
  const bool gpu_idle = Lt(s.sm_active, t.sm_high) || Lt(GpuBusy(s), t.gpu_busy);
  const bool llm_room = IsLlm(s) && !Has(s.instance_busy) && !Ge(s.kv_usage_max, t.kv_full);
  if (!inst_idle && !(llm_room && (gpu_idle || !Has(s.sm_active)))) return std::nullopt;
  Verdict v{.bottleneck = "queue_bound", .confidence = Margin(q, t.queue_share, 0.9)};
  v.summary = fmt::format(
      "Requests spend {:.0f}% of their latency queued while the workers have room: the "
      "batching/admission policy holds them.",
      100 * q);
  v.evidence.push_back(Ev("ledger.queue_share", q, ">=", t.queue_share, "ratio", "queue / latency"));
  if (Has(s.instance_busy))
    v.evidence.push_back(Ev("batcher.instance_busy", s.instance_busy, "<", t.saturated_busy, "ratio",
                            "fraction of the window the instances executed"));
  if (Has(s.mean_batch_size))
    v.evidence.push_back(Ev("batcher.mean_batch_size", s.mean_batch_size, "", kNaN, "rows",
                            fmt::format("rows per batch, of max_batch_size {}", s.max_batch_size)));
  for (const auto& [reason, share] : s.admission_share)
    if (share > 0) v.evidence.push_back(Ev("llm.admission_share." + reason, share, "", kNaN, "ratio", ""));
  for (const auto& [reason, share] : s.close_share)
    if (share > 0) v.evidence.push_back(Ev("batcher.close_share." + reason, share, "", kNaN, "ratio", ""));
  v.next_step = QueueKnob(s);
  v.why = "the queue, not the model, sets the latency: close batches sooner or admit more at once";
  return v;
}

// An LLM whose engine steps all the time but with few sequences per step, nobody waiting, the KV cache far
// from full and the GPU short of every ceiling: the clients' concurrency sets the batch, and a larger batch
// reads the same weights once per step for more tokens (the H200's 8B at c=64: SM active 0.66, DRAM 0.38,
// tensor 0.21, 7,239 output tok/s; at c=256 13,295). Without GPU counters it says nothing.
std::optional<Verdict> SmallBatches(const Signals& s, const Thresholds& t) {
  if (!IsLlm(s) || s.requests == 0 || !Lt(s.sm_active, t.sm_high) || !Lt(s.dram_active, t.dram_high) ||
      Ge(s.tensor_active, t.tensor_high) || !Ge(s.running_mean, 1) || Ge(s.kv_usage_max, t.kv_full) ||
      SweepStalls(s, t))
    return std::nullopt;
  const double turnover = Turnover(s);
  if (!Lt(s.waiting_mean, turnover)) return std::nullopt;
  const double busy = Has(s.engine_busy) ? s.engine_busy : GpuBusy(s);
  if (!Ge(busy, t.idle_busy)) return std::nullopt;  // an idle engine: the general rule below speaks
  Verdict v{.bottleneck = "under_fed", .confidence = Margin(-s.sm_active, -t.sm_high, 0)};
  v.summary = fmt::format(
      "The engine steps {:.0f}% of the time, but each step carries ~{:.0f} sequences and the GPU has room: "
      "the offered concurrency sets the batch.",
      100 * busy, s.running_mean);
  v.evidence.push_back(Ev("llm.running_mean", s.running_mean, "", kNaN, "sequences", "per step"));
  v.evidence.push_back(Ev("llm.waiting_mean", s.waiting_mean, "<", turnover, "requests",
                          "no backlog: max(1, 5 % of the running)"));
  v.evidence.push_back(Ev("gpu.sm_active", s.sm_active, "<", t.sm_high, "ratio", ""));
  v.evidence.push_back(Ev("gpu.dram_active", s.dram_active, "<", t.dram_high, "ratio", ""));
  if (Has(s.tensor_active))
    v.evidence.push_back(Ev("gpu.tensor_active", s.tensor_active, "<", t.tensor_high, "ratio", ""));
  if (Has(s.kv_usage_max))
    v.evidence.push_back(Ev("llm.kv_usage_max", s.kv_usage_max, "<", t.kv_full, "ratio", ""));
  v.next_step =
      "send more concurrent requests: a step reads the weights once for all its sequences, so a larger batch "
      "raises tokens/s; each token then waits longer (TPOT grows with the step): weigh it against the SLO "
      "(`stoke tune --slo-tpot-ms`)";
  v.why = "no part of the GPU is near its ceiling and no request waits: the load is what is missing";
  return v;
}

std::optional<Verdict> UnderFed(const Signals& s, const Thresholds& t) {
  const double busy = Has(s.instance_busy) ? s.instance_busy : GpuBusy(s);
  const double q = Ratio(s.queue_s, s.latency_s);
  // No request finished, and nothing was busy either: idle. A busy engine (GPU or engine thread) with none
  // finished is serving requests longer than the window (1000 tokens at c=512 on the H200: ~30 s each), not
  // idle.
  const bool no_traffic = s.requests == 0;
  if (no_traffic && (Ge(busy, t.idle_busy) || (IsLlm(s) && Ge(s.engine_busy, t.idle_busy))))
    return std::nullopt;
  // A lone request waits out the batching delay for companions that never come: that queue is the missing
  // traffic, not a policy holding work back (while it stays under queue_share; above, queue_bound speaks).
  const bool delay_waits = !IsLlm(s) && Lt(q, t.queue_share) && Share(s.close_share, "delay") >= 0.5 &&
                           s.max_batch_size > 0 && Has(s.mean_batch_size) &&
                           s.mean_batch_size < 0.5 * s.max_batch_size;
  if (!no_traffic && IsLlm(s)) {
    if (std::optional<Verdict> v = SmallBatches(s, t)) return v;
  }
  if (!no_traffic && (!Lt(busy, t.idle_busy) || (Ge(q, t.idle_queue_share) && !delay_waits)))
    return std::nullopt;
  if (IsLlm(s) && Ge(s.waiting_mean, 1)) return std::nullopt;
  // With the doctor's own sweep: more clients must have brought more throughput, else something saturated.
  const double scaling = SweepScaling(s);
  if (!no_traffic && SweepStalls(s, t)) return std::nullopt;
  Verdict v{.bottleneck = "under_fed", .confidence = no_traffic ? 0.9 : Margin(-busy, -t.idle_busy, 0)};
  v.summary = no_traffic ? "No request finished in the window: the server is idle."
                         : fmt::format(
                               "The server works {:.0f}% of the time and nothing queues: it waits for "
                               "requests.",
                               100 * busy);
  v.evidence.push_back(Ev("server.busy", busy, "<", t.idle_busy, "ratio", "instances (or GPU engine) busy"));
  // A queue made of lone requests waiting out the delay is judged against queue_share (see delay_waits).
  const bool delay_queue = delay_waits && Ge(q, t.idle_queue_share);
  v.evidence.push_back(Ev("ledger.queue_share", Has(q) ? q : 0, "<",
                          delay_queue ? t.queue_share : t.idle_queue_share, "ratio",
                          delay_queue ? "the batching delay's wait, not a backlog" : ""));
  v.evidence.push_back(Ev("server.requests_per_s", s.requests_per_s, "", kNaN, "req/s", ""));
  if (Has(scaling))
    v.evidence.push_back(Ev("load.throughput_scaling", scaling, ">=", t.min_scaling, "ratio",
                            "throughput at the last sweep point / the first"));
  v.next_step = "send more concurrent requests (clients, or a larger client pool)";
  if (!IsLlm(s) && s.max_batch_size == 0) v.next_step += "; then turn batching on: " + BatchingKnob(16, 2000);
  if (delay_queue) {
    v.evidence.push_back(Ev("batcher.close_share.delay", Share(s.close_share, "delay"), ">=", 0.5, "ratio",
                            fmt::format("batches close on the delay with {:.1f} of {} rows: lone requests wait "
                                        "it out",
                                        s.mean_batch_size, s.max_batch_size)));
    v.next_step += Has(s.max_queue_delay_us)
                       ? fmt::format("; at this traffic the batching delay ({} us) only adds latency: "
                                     "\"max_queue_delay_microseconds\": 0 until the load grows",
                                     static_cast<long>(s.max_queue_delay_us))
                       : "; at this traffic the batching delay only adds latency";
  }
  if (Has(busy) && busy > 0.01)
    v.next_step += fmt::format(" -- at this rate the server could take ~{:.0f}x the load", 0.8 / busy);
  v.why = "nothing in the server limits throughput yet; the offered load does";
  return v;
}

std::optional<Verdict> Throttled(const Signals& s, const Thresholds& t) {
  const double viol = std::max(Has(s.power_violation_share) ? s.power_violation_share : 0.0,
                               Has(s.thermal_violation_share) ? s.thermal_violation_share : 0.0);
  double reasons = 0;
  std::string active;
  for (const auto& [r, share] : s.clock_reason_share) {
    const bool power_or_thermal =
        r.find("power") != std::string::npos || r.find("thermal") != std::string::npos || r == "hw_slowdown";
    if (power_or_thermal && share > 0) {
      reasons = std::max(reasons, share);
      active += (active.empty() ? "" : ", ") + r;
    }
  }
  const bool counters = Has(s.power_violation_share) || Has(s.thermal_violation_share);
  if (!(viol >= t.throttle_share || (!counters && reasons >= t.reason_share))) return std::nullopt;
  Verdict v{.bottleneck = "throttled"};
  v.confidence = counters ? Margin(viol, t.throttle_share, 0.5) : 0.5;
  v.summary = fmt::format(
      "Clocks are held down by power/thermal limits ({}); every figure is measured below full "
      "speed.",
      active.empty() ? "violation counters" : active);
  if (counters) {
    v.evidence.push_back(Ev("gpu.power_violation_share", s.power_violation_share, ">=", t.throttle_share,
                            "ratio", "of the window, DCGM_FI_DEV_POWER_VIOLATION"));
    v.evidence.push_back(Ev("gpu.thermal_violation_share", s.thermal_violation_share, ">=", t.throttle_share,
                            "ratio", "DCGM_FI_DEV_THERMAL_VIOLATION"));
  }
  v.evidence.push_back(Ev("gpu.clock_reason_share", reasons, ">=", t.reason_share, "ratio", active));
  if (Has(s.sm_clock_mhz)) v.evidence.push_back(Ev("gpu.sm_clock_mhz", s.sm_clock_mhz, "", kNaN, "MHz", ""));
  if (Has(s.power_w))
    v.evidence.push_back(Ev("gpu.power_w", s.power_w, "", s.power_limit_w, "W", "threshold: limit"));
  v.next_step =
      "do not tune against it: check cooling and the power limit (nvidia-smi -q -d PERFORMANCE,POWER); "
      "re-run doctor once clocks are steady";
  v.why = "power-capped clocks change every other number; a fix elsewhere may just move the cap";
  return v;
}

}  // namespace

std::vector<Verdict> Diagnose(const Signals& s, const Thresholds& t) {
  static const Rule kRules[] = {KvCapacity,     HostBound,    CopyBound, LaunchBound,
                                BandwidthBound, ComputeBound, QueueBound};
  std::vector<Verdict> out;
  for (const Rule& rule : kRules) {
    if (std::optional<Verdict> v = rule(s, t)) out.push_back(std::move(*v));
  }
  if (out.empty()) {  // "waits for work" only when nothing in the server is a limit
    if (std::optional<Verdict> v = UnderFed(s, t)) out.push_back(std::move(*v));
  }
  if (std::optional<Verdict> v = Throttled(s, t)) out.push_back(std::move(*v));
  if (out.empty()) {
    Verdict v{.bottleneck = "none", .confidence = s.requests >= t.min_requests ? 0.6 : 0.4};
    v.summary = "No rule fired: the server is busy without a dominant limit (or the window was too quiet).";
    v.evidence.push_back(
        Ev("ledger.queue_share", Ratio(s.queue_s, s.latency_s), "<", t.queue_share, "ratio", ""));
    v.evidence.push_back(Ev("batcher.instance_busy", s.instance_busy, "", kNaN, "ratio", ""));
    v.next_step = "nothing to change; to find the ceiling run `stoke bench --concurrency 1:256`";
    v.why = "";
    out.push_back(std::move(v));
  }
  if (s.requests > 0 && s.requests < t.min_requests) {
    for (Verdict& v : out) v.confidence *= 0.7;
  }
  return out;
}

}  // namespace stoke::doctor
