// INT8 GEMM on the CPU: the reference arithmetic of --quantization int8 (encoders; docs/precision.md), exact
// in integers, for the consistency gate and for the CUDA int8 path to be checked against.
//
//   weights, per output channel r of W [n, k]: amax = max |W[r, :]|, w_scale[r] = amax / 127,
//            Wq[r, :] = clamp(rint(W[r, :] · (127 / amax)), -127, 127)   (cpu::QuantizeKvRow's int8 branch)
//   activations, one static scale s per GEMM input (from calibration): inv = 1 / s,
//            Xq = clamp(rint(X · inv), -127, 127)   (saturating: values beyond 127 s clip)
//   GEMM:    acc[i, j] = sum_k Xq[i, k] · Wq[j, k]   (int32, exact: |acc| <= 127² k < 2³¹ for k < 133,000)
//   output:  Y[i, j] = acc[i, j] · (s · w_scale[j]) + bias[j]   (fp32)
// rint rounds half to even (the default rounding mode), as CUDA's __float2int_rn. -127..127: the int8 range
// made symmetric, so that -x quantises to -q.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/thread_pool.h"

namespace stoke::cpu {

// Xq = clamp(rint(x · inv_scale), -127, 127) for n values; NaN becomes 0. inv_scale 0 (a tensor that was all
// zeros in calibration): every q is 0.
void QuantizeInt8Static(const float* x, int64_t n, float inv_scale, int8_t* q);

// The same with one inverse scale per column: x [rows, cols], inv_scale [cols] (SmoothQuant's per-channel
// factors folded into the tensor's scale).
void QuantizeInt8Columns(const float* x, int64_t rows, int64_t cols, const float* inv_scale, int8_t* q);

// One row's per-channel weight quantisation (above); returns its scale (0 for an all-zero or non-finite row,
// whose q are then 0).
float QuantizeInt8Row(const float* w, int64_t n, int8_t* q);

// acc [m, n] = x [m, k] · w [n, k]ᵀ in int32 (row-major; w in PyTorch Linear layout [out, in]), on `pool`.
// InvalidArgument when k is so large that the int32 sum could overflow (k > 133,143).
Status MatMulInt8(const int8_t* x, int64_t m, int64_t k, const int8_t* w, int64_t n, int32_t* acc,
                  ThreadPool& pool);

// y [m, n] = acc · (x_scale · w_scale[j]) + bias[j] (bias may be null), row by row.
void DequantizeInt8Gemm(const int32_t* acc, int64_t m, int64_t n, float x_scale, const float* w_scale,
                        const float* bias, float* y);

}  // namespace stoke::cpu
