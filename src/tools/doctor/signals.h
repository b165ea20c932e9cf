// What `stoke doctor` measured over one window, as plain numbers (NaN = not available), and what it
// concludes. Signals come from the server's public endpoints only (/metrics, /v1/gpu, the model config);
// extract.h turns scrapes into Signals, rules.h turns Signals into Verdicts (a pure function).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace stoke::doctor {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline bool Has(double v) {
  return !std::isnan(v);
}

// One load point the doctor drove itself (--load auto).
struct LoadPoint {
  int concurrency = 0;
  double requests_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
  int64_t errors = 0;
};

// What a short trace taken inside the window says about the GPU's work (CUPTI kernel and copy records on the
// "GPU <i>" tracks) and the requests, batches and steps it served.
struct TraceSignals {
  bool taken = false;               // a trace was recorded in the window
  bool gpu_timeline = false;        // it holds kernel records
  bool gpu_events = false;          // no kernel records, but the engine's steps timed by CUDA events: busy_share
                                    // and the gaps below come from those (kernel counts stay 0 / unknown)
  std::string note;                 // no GPU timeline: why (the trace's otherData.kernel_track), or a failure
  double seconds = kNaN;            // the trace's window
  int64_t dropped = 0;              // events past the trace's budget (the counts below are then lower bounds)
  int64_t kernels = 0, copies = 0;  // kernel records; memcpy/memset records
  int64_t requests = 0;             // request spans (requests that finished inside the trace)
  int64_t batches = 0;              // dynamic batcher "batch" spans and engine "step" spans
  double kernels_per_request = kNaN, kernels_per_batch = kNaN;
  double mean_kernel_us = kNaN;  // mean kernel duration
  double busy_share = kNaN;      // union of kernel + copy records (or event-timed steps) / first start -> last
                                 // end (busiest GPU)
  int64_t gaps = 0;              // idle intervals between records on that GPU
  double gap_mean_us = kNaN, largest_gap_us = kNaN;
  // Where that GPU's kernel time went (tools/trace KernelKind, KernelShortName): shares of all its kernel
  // time by kind, and the kernels with the most time, largest first (at most 5).
  double attention_share = kNaN, matmul_share = kNaN, other_share = kNaN;
  struct TopKernel {
    std::string name;
    std::string kind;
    double share = 0;         // of the GPU's kernel time
    double us_per_batch = 0;  // per batch / step in the trace (0 when it has none)
    int64_t count = 0;
  };
  std::vector<TopKernel> top_kernels;
};

struct Signals {
  double window_s = 0;
  std::string model;
  std::string kind;  // "classic" (dynamic batcher) | "llm" (engine loop) | "" (unknown)
  // The served precision (GET /v1/models "precision"; "" when the server does not say): the KV cache's dtype
  // ("bf16", "fp8", "int8", ...) and the weights' quantisation ("none", "fp8", ...).
  std::string kv_cache_dtype, weight_quantization;
  // Where an LLM runs (GET /v1/models "device": "cpu", "cuda:0 (NVIDIA H200)"; "" when the server does not
  // say): knobs that only pay on a GPU (--async-output) are not named for a CPU model.
  std::string device;

  // The ledger, over the requests that finished in the window: mean seconds per request in each stage
  // (stoke:request_stage_seconds{stage}), and the groups the rules read (see extract.cc StageGroup).
  int64_t requests = 0;
  double requests_per_s = kNaN;
  std::map<std::string, double> stage_s;
  double latency_s = kNaN;  // sum of the stage means
  double queue_s = kNaN, io_s = kNaN, host_s = kNaN, copy_s = kNaN, device_s = kNaN;
  double service_s = kNaN;  // host + copy + device: the time an instance / the engine works on a request

  // Dynamic batcher (classic models) and the model's config (/v2/models/M/config).
  double mean_batch_size = kNaN;
  int max_batch_size = 0;                     // 0: batching off or unknown
  double max_queue_delay_us = kNaN;           // NaN: no dynamic_batching section
  int instances = 0;                          // instance_group count (or the busy-time series seen)
  std::map<std::string, double> close_share;  // batch close reason -> fraction of the window's batches
  double instance_busy = kNaN;                // mean fraction of the window each instance executed (0..1)
  double pending_mean = kNaN;                 // stoke:inference_pending_request_count, mean of the scrapes

  // LLM engine.
  double kv_usage_max = kNaN, kv_usage_mean = kNaN;
  double kv_blocks_total = kNaN;  // used + free at the last scrape
  double preemptions = kNaN;      // increase of stoke:num_preemptions_total
  double waiting_mean = kNaN, waiting_max = kNaN, running_mean = kNaN, running_max = kNaN;
  std::map<std::string, double> admission_share;  // stop reason -> fraction of the window's steps
  // The engine's steps in the window (stoke:step_duration_seconds, step_seconds_total{part},
  // step_read_bytes_total{kind}, step_flops_total{kind}; docs/doctor.md "Step split"), means per step.
  double steps = kNaN;
  double engine_busy = kNaN;  // step time / window: the rest the engine thread waited for work
  double step_ms = kNaN, step_model_ms = kNaN, step_host_ms = kNaN;
  // The output thread's time per step (stoke:step_output_seconds_total; --async-output on), overlapped with
  // the model and not part of step_ms: > 0 says async output is on. NaN when the server does not export it.
  double step_output_ms = kNaN;
  double step_prefill_tokens = kNaN, step_decode_tokens = kNaN;
  double step_weight_bytes = kNaN, step_kv_bytes = kNaN;  // modelled from the model's shape and storage
  double step_matmul_flops = kNaN, step_attention_flops = kNaN;
  // The same at the device's rates (--hbm-gbps, --tensor-tflops; NaN without them): ms to stream the weights
  // and the KV, ms of matmul and attention math, and the step's floor max(bytes / bandwidth, FLOPs / rate).
  double hbm_gbps = kNaN, tensor_tflops = kNaN;
  double step_weights_ms = kNaN, step_kv_ms = kNaN, step_matmul_ms = kNaN, step_attention_ms = kNaN;
  double step_memory_ms = kNaN, step_math_ms = kNaN;  // weights + KV ms; matmul + attention ms
  double step_floor_ms = kNaN;

  // GPU (/v1/gpu), the busiest device, means over the samples in the window. Ratios 0..1.
  int gpu_samples = 0;
  double gpu_util = kNaN;  // DCGM_FI_DEV_GPU_UTIL / 100: duty cycle, one tiny kernel reads 1.0
  double gr_active = kNaN, sm_active = kNaN, sm_occupancy = kNaN, tensor_active = kNaN, dram_active = kNaN;
  double pcie_bytes_per_s = kNaN;                                       // tx + rx
  double fb_used_ratio = kNaN;                                          // FB_USED / FB_TOTAL
  double power_violation_share = kNaN, thermal_violation_share = kNaN;  // of the window, from the ns counters
  double sm_clock_mhz = kNaN, power_w = kNaN, power_limit_w = kNaN;
  std::map<std::string, double> clock_reason_share;  // reason -> fraction of samples it was active

  // The GPU timeline: a short trace (POST /v1/debug/trace) inside the window, read by trace_signals.h.
  TraceSignals trace;

  // Load the doctor drove (empty with --load none).
  std::vector<LoadPoint> load;
};

// Every threshold a rule uses; defaults documented in docs/doctor.md.
struct Thresholds {
  int min_requests = 20;          // fewer requests in the window: every verdict's confidence is lowered
  double host_share = 0.5;        // host stages / service time
  double io_share = 0.5;          // recv + send / latency, and either
  double io_min_s = 0.005;        // recv + send at least this long, or the sweep's throughput not scaling
  double copy_share = 0.3;        // h2d + d2h / service time
  double matters_busy = 0.5;      // the instances work at least this much of the window, or
  double matters_latency = 0.3;   // the stage group is at least this share of the latency
  double queue_share = 0.5;       // queue / latency
  double saturated_busy = 0.7;    // instances busier than this are the limit (not the queue policy)
  double idle_busy = 0.3;         // instances / GPU engine busy less than this: under-fed
  double idle_queue_share = 0.2;  // ... and the queue below this share of the latency
  double min_scaling = 1.3;       // ... and (--load auto) the sweep's throughput grew at least this much
  double gpu_busy = 0.8;          // GPU-Util or GR engine active at or above this: kernels always running
  double sm_low = 0.5;            // SM activity below this while busy: launch-bound (kernels too small)
  double dram_high = 0.7;         // DRAM active at or above this: bandwidth-bound
  // Streaming (GEMV-like) work: DRAM active at or above dram_streaming while the tensor cores idle below
  // tensor_idle and SMs are busy (>= sm_busy_streaming): the SMs wait on memory. The 8B decode at batch 1 on
  // the H200, at 77 % of the measured HBM roofline, reads DRAM 0.60, SM 0.73, tensor 0.00.
  double dram_streaming = 0.5;
  double tensor_idle = 0.1;
  double sm_busy_streaming = 0.5;
  double tensor_high = 0.7;   // tensor active at or above this: compute-bound
  double sm_high = 0.8;       // SM active at or above this (DRAM below dram_high): compute-bound
  // An LLM's step at the device's rates (--hbm-gbps and --tensor-tflops given): its bytes (weights + KV) take
  // at least this many times its math (matmul + attention): memory-heavy by its own model, so busy SMs wait
  // on memory (bandwidth_bound, and not compute_bound, once DRAM active is at least dram_streaming). The 8B
  // shape in bf16 at c=64 on an H100: 27.6 GB = 9.2 ms at 3,012 GB/s against 1.9 TFLOP = 2.3 ms at 830
  // TFLOP/s (4.1x), SM active 0.83, tensor 0.18, DRAM 0.66; at c=512 with fp8 weights on an H200 the ratio is
  // ~1x.
  double step_memory_heavy = 2.0;
  // Without the device's rates: a step doing fewer FLOPs per byte it reads than this is memory-heavy on any
  // current datacenter GPU (bf16 ridge points from the published dense peaks and HBM bandwidths: A100 ~156,
  // H200 ~206, H100 ~295 FLOP/byte; fp8 doubles them). The same H100 window: 1.94 TFLOP / 27.6 GB = 70; the
  // H200's fp8 c=512 step 12.2 TFLOP / 60.6 GB = 201.
  double memory_heavy_flop_per_byte = 100;
  double device_share = 0.5;  // GPU rules apply when device stages are this share of service time
  // An LLM's step: host time between the model's runs (step_host_ms / step_ms) at or above this share is
  // named beside a GPU verdict (the GPU idles for it each step). Served 8B at c=512 on an H100: 2.5 of 44.9
  // ms (0.056), 3.46 of 60.7 (0.057).
  double step_host_gap = 0.03;
  // The trace (when it has kernel records): kernels shorter than this on average are launch-sized (a launch
  // costs ~2-5 us of CPU and a few us of GPU front end); with many per request and no GPM counters to judge
  // by, the trace alone says launch_bound.
  double tiny_kernel_us = 20;
  double many_kernels_per_request = 50;
  double kv_full = 0.9;          // KV usage at or above this
  double no_blocks_share = 0.1;  // steps whose admission stopped on no_blocks
  // GPU memory allocated at or above this share (FB used / total): the KV pool already has what
  // --gpu-memory-fraction leaves, so kv_capacity_bound cannot name more blocks (the H200 serving the 8B
  // shape read 0.89 at the default fraction 0.9).
  double fb_full = 0.85;
  double throttle_share = 0.1;   // power/thermal violation time / window
  double reason_share = 0.5;     // without the counters: power/thermal reason active in this share of samples
  // The trace's kernel split (an LLM's bandwidth- or compute-bound verdict): attention kernels at or above
  // this share of the GPU's kernel time name the KV cache as what to shrink; matmuls at or above
  // matmul_heavy name the weights. On an H100 serving the 8B shape at c=512 with fp8 KV, attention was 44-55
  // % (bench/results/gpu_served_kernel_split_h100_2026-12-05.json).
  double attention_heavy = 0.35;
  double matmul_heavy = 0.5;
};

inline constexpr const char* kBottlenecks[] = {
    "under_fed",       "queue_bound",   "host_bound",        "copy_bound", "launch_bound",
    "bandwidth_bound", "compute_bound", "kv_capacity_bound", "throttled",  "none"};

struct Evidence {
  std::string signal;  // e.g. "ledger.host_share"
  double value = kNaN;
  std::string op;  // ">=", "<", ... : how value compares with threshold for the rule to fire
  double threshold = kNaN;
  std::string unit;  // "ratio", "ms", "count", ...
  std::string note;  // what the number is, in words
};

struct Verdict {
  std::string bottleneck;  // one of kBottlenecks
  double confidence = 0;   // 0..1
  std::string summary;     // one sentence for a person
  std::vector<Evidence> evidence;
  std::string next_step;  // a concrete flag or config change
  std::string why;        // why that knob
};

inline const char* ConfidenceWord(double c) {
  return c >= 0.75 ? "high" : (c >= 0.5 ? "medium" : "low");
}

}  // namespace stoke::doctor
