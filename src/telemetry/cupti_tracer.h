// GPU kernels and copies on the timeline: CUPTI activity records (kernels with their stream, grid and
// block; memcpys with their kind, bytes and host memory, pinned or pageable; memsets), loaded at run time
// with dlopen like NVML, only while a trace is on. Each record becomes a span on track "GPU <device>" /
// "stream <id>" in the trace (telemetry/trace.h), on the trace's monotonic clock.
//
//   CuptiTracer& cupti = CuptiTracer::Get();
//   cupti.Start(recorder);   // at trace start: loads libcupti once, enables the activity kinds
//   cupti.Stop(recorder);    // before the trace stops: flushes the buffers into it, disables the kinds
//
// Degrades instead of failing: a build without the CUDA toolkit, no libcupti, no GPU, or another CUPTI
// subscriber (ncu/nsys hold the only slot on CUDA <= 13.2) -> no kernel track; Start() records why in the
// trace's otherData.kernel_track ("cupti" when it works).
//
// Which file: $STOKE_CUPTI_LIBRARY if set (as NVML's $STOKE_NVML_LIBRARY), else libcupti.so.13 /
// libcupti.so, then the CUDA install's lib64 and extras/CUPTI/lib64.
#pragma once

#include <mutex>
#include <string>

namespace stoke {

class TraceRecorder;

inline constexpr const char* kCuptiLibraryEnv = "STOKE_CUPTI_LIBRARY";

class CuptiTracer {
 public:
  static CuptiTracer& Get();  // process-wide: CUPTI's activity callbacks are process-wide

  // Returns true when kernel records will be collected; otherwise the reason is in the trace.
  bool Start(TraceRecorder& recorder);
  void Stop(TraceRecorder& recorder);

 private:
  CuptiTracer() = default;
  std::mutex mu_;
  bool active_ = false;  // guarded by mu_
};

}  // namespace stoke
