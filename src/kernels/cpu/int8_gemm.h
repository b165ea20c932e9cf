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

// Per-token (dynamic) activation scales: for each row i of x [rows, cols], y_j = x[i, j] · col_inv[j]
// (col_inv: SmoothQuant's 1 / s_j, null = 1), lo / hi = min / max_j y_j, and
//   symmetric (centred = false): mid[i] = 0, scale[i] = max(-lo, hi) / 127 · multiplier;
//   centred:                     mid[i] = (lo + hi) / 2, scale[i] = (hi - lo) / 254 · multiplier;
// q[i, j] = clamp(rint((y_j - mid[i]) · (1 / scale[i])), -127, 127), so y_j ≈ scale[i] · q[i, j] + mid[i].
// Centred, the row's whole range uses all 255 levels (a GELU output, floor -0.17 and a long positive tail,
// gets about twice the resolution of amax / 127). A row with scale 0 (constant, or all zero) gets q 0 (and
// mid = its value when centred); a non-finite one scale 0, mid 0, q 0. multiplier is 1 but in tests (a broken
// quantiser). The CUDA kernels compute the same values in the same order (bit-exact q, scale, mid).
void QuantizeInt8PerToken(const float* x, int64_t rows, int64_t cols, const float* col_inv, float multiplier,
                          bool centred, int8_t* q, float* scale, float* mid);

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

// The per-token form: y [m, n] = acc · (x_scale[i] · w_scale[j]) + x_mid[i] · w_sum[j] + bias[j], where
// w_sum[j] = w_scale[j] · Σ_k Wq[j, k] (the centre's share: Σ_k mid · W[j, k]).
void DequantizeInt8GemmPerToken(const int32_t* acc, int64_t m, int64_t n, const float* x_scale,
                                const float* x_mid, const float* w_scale, const float* w_sum,
                                const float* bias, float* y);

}  // namespace stoke::cpu
