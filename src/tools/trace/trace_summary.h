// What `stoke trace` prints about a timeline: counts per process, drops, and, where the file has GPU kernel
// or copy records (tracks of a "GPU <i>" process other than its counters), how long the GPU sat idle
// between them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

struct GpuIdle {
  int64_t records = 0;  // kernel and copy spans
  double span_us = 0;   // first record's start -> last record's end
  double busy_us = 0;   // union of the records
  int64_t gaps = 0;     // idle intervals between records
  int64_t gaps_over_1ms = 0;
  double largest_gap_us = 0;
};

// GPU time of one kernel (or copy kind) across a trace's GPU records, by its short name
// (KernelShortName).
struct KernelTime {
  std::string name;
  int64_t count = 0;
  double total_us = 0;
};

// The engine's steps in the trace ("step (...)" spans of an "engine <model>" process).
struct StepTotals {
  int64_t steps = 0;
  double total_us = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
};

struct TraceSummary {
  int64_t events = 0;
  int64_t dropped = 0;
  int64_t tracks = 0;
  std::map<std::string, int64_t> spans_per_process;  // "X" events by process name
  int64_t counters = 0;                              // "C" events
  int64_t requests = 0;                              // request spans (process "requests", with an id)
  std::map<std::string, GpuIdle> gpu;                // by process ("GPU 0")
  int64_t gpu_incomplete = 0;                        // GPU records with no timestamps (skipped)
  std::map<std::string, std::string> info;           // otherData strings (kernel_track, note, ...)
  std::vector<KernelTime> kernels;                   // every GPU's records by name, most time first
  StepTotals steps;
};

// "void stoke::cuda::(anonymous namespace)::DecodeFragKernel<128, true>(const __nv_bfloat16*, ...)" or its
// mangled form (CUPTI's records carry the mangled name) -> "DecodeFragKernel<128, true>"; names that are not
// C++ signatures (cuBLASLt's "nvjet_..." kernels, copy kinds) stay as they are.
std::string KernelShortName(std::string_view name);

// What a kernel's short name says it does: "attention" (stoke's decode / prefill / encoder attention kernels
// and their split merge), "matmul" (cuBLASLt's nvjet / sm90 GEMMs, cutlass, stoke's GEMVs), "copy" (memcpy /
// memset records) or "other" (norms, RoPE, activations, quantisers, sampling, embeddings).
std::string_view KernelKind(std::string_view short_name);

// InvalidArgument when `json` is not a trace-event file.
StatusOr<TraceSummary> SummarizeTrace(std::string_view json);
// A few lines for a terminal.
std::string FormatTraceSummary(const TraceSummary& s);

}  // namespace stoke
