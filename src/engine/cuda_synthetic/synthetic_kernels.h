// The synthetic model's one kernel (synthetic_kernels.cu), callable from host C++: a launch burns FMAs on
// registers, reads and writes a region of device memory, and (the last launch of a batch) writes the output
// rows from the input rows. Plain host header: no device code, no fmt.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace stoke::cuda {

struct SynthLaunch {
  int blocks = 1;               // grid size (>= 1)
  int threads = 256;            // block size
  int64_t fma_iters = 0;        // per thread: iterations of 8 independent FMAs (16 FLOPs)
  int64_t tensor_iters = 0;     // per warp: iterations of 4 wmma fp16 16x16x16 multiply-adds (tensor cores)
  float* region = nullptr;      // read + written in place, as float4
  int64_t region_float4s = 0;   // 16-byte elements in `region`
  const uint8_t* in = nullptr;  // [rows, in_bytes] on the device; with `out`, the output rows are written
  uint8_t* out = nullptr;       // [rows, out_bytes]; null: no output this launch
  int64_t rows = 0, in_bytes = 1, out_bytes = 0;
  float* sink = nullptr;  // one float, written only if the FMA result is impossible (keeps the work)
};

// Enqueues one launch on `stream`; returns the launch error (cudaGetLastError), if any.
cudaError_t LaunchSynth(const SynthLaunch& l, cudaStream_t stream);

}  // namespace stoke::cuda
