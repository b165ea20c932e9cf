// Decode's skinny matrix products, y[m, n] = x[m, k] · W^T for m <= kGemvMaxRows, written for the memory
// roofline (at batch 1 a step's time is the time to stream the weights once). Measured on the H200
// (cuda_bench --only gemv, 8B shapes, bench/results/gpu_llm_8b_decode_h200_2026-12-02_s3.json): 2.4-4.3 TB/s at
// m = 1, level with cuBLASLt (the small QKV/O matrices lose to ramp-up and tail in both); at m = 4-8 far
// behind (each warp re-reads every activation row per weight chunk), so the decoder uses it for m = 1 only.
//
//   W = [n, k] bf16 row-major (PyTorch Linear layout), x = [m, k] bf16 (row stride k), y = [m, ldy].
//
// One warp per output row: lanes read 16-byte chunks of the row (a warp reads 512 contiguous bytes per load,
// 8 loads in flight per lane), bypassing L1 so x stays there; fp32 accumulation, a warp-shuffle sum at the
// end. Checked against cpu::MatMul (kernels/cuda/ops_gpu_test.cc).
//
// Programmatic dependent launch (sm_90, `pdl` = true): the kernel may start while the previous kernel on the
// stream still runs. It issues its first weight loads (weights never depend on earlier kernels), then waits
// for the previous grid (griddepcontrol.wait) before reading x or writing y. The small kernels before it
// (norms, RoPE, attention, ...) let dependents launch early (PdlLaunchDependents in common.cuh), so the
// weight stream of the next projection overlaps their latency-bound tails. Works under CUDA graph capture;
// measured within run-to-run noise on the 8B step, so the decoder leaves it off by default.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

inline constexpr int kGemvMaxRows = 8;

// Optional lookahead: once a block's own weight loads are done it asks L2 (bulk prefetch, a hint) for its
// share of [ptr, ptr + bytes), normally the leading part of the next projection's weights, so that the HBM
// keeps streaming through this kernel's tail and the latency-bound kernels after it. ptr 16-byte aligned;
// bytes rounded down to 16. Results never depend on it.
struct GemvPrefetch {
  const void* ptr = nullptr;
  int64_t bytes = 0;
};

// y[r, c] = Σ_j x[r, j] · w[c, j] for r < m, c < n; ldy = row stride of y (>= n). k % 8 == 0, w and x
// 16-byte aligned, 1 <= m <= kGemvMaxRows. y must not alias x.
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
                __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, const GemvPrefetch& next = {});
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m, float* y,
                int64_t ldy, bool pdl, cudaStream_t stream, const GemvPrefetch& next = {});

// The fused gate|up projection with SwiGLU: w = [2 inter, k] (gate rows, then up rows), y = [m, inter]:
//   y[r, c] = bf16(silu(g) * u),  g = bf16(x[r]·w[c]), u = bf16(x[r]·w[inter + c])
// (g and u rounded to bf16 first, as the unfused GEMM + SiluMulFused path stores them).
Status Bf16GemvSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const __nv_bfloat16* x, int64_t m,
                       __nv_bfloat16* y, bool pdl, cudaStream_t stream, const GemvPrefetch& next = {});

// One-token decode with the layer's pre-norm and residual add fused in (no AddRmsNorm kernels between the
// projections; CudaLlama with Options::fused_norm). residual = [k] fp32, norm_weight = [k] fp32, k <= 24576:
//   Bf16GemvNorm:        y[c] = bf16(W[c] · h),  h = bf16(rmsnorm(residual) * norm_weight)   (AddRmsNorm's h)
//   Bf16GemvNormSiluMul: y[c] = bf16(silu(bf16(Wg[c]·h)) * bf16(Wu[c]·h)), w = [2 inter, k] as Bf16GemvSiluMul
//   Bf16GemvAddResidual: residual[c] += bf16(W[c] · x)                  (x = [k] bf16, residual = [n] fp32)
// Each block recomputes the norm of the residual (from L2) while its first weight loads are in flight.
Status Bf16GemvNorm(const __nv_bfloat16* w, int64_t n, int64_t k, const float* residual, const float* norm_weight,
                    float eps, __nv_bfloat16* y, bool pdl, cudaStream_t stream, const GemvPrefetch& next = {});
Status Bf16GemvNormSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const float* residual,
                           const float* norm_weight, float eps, __nv_bfloat16* y, bool pdl, cudaStream_t stream,
                           const GemvPrefetch& next = {});
Status Bf16GemvAddResidual(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, float* residual,
                           bool pdl, cudaStream_t stream, const GemvPrefetch& next = {});

}  // namespace stoke::cuda
