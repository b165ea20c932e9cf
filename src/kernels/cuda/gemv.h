// Decode's skinny matrix products, y[m, n] = x[m, k] · W^T for m <= kGemvMaxRows, written for the memory
// roofline (at batch 1 a step's time is the time to stream the weights once). Measured on the H200
// (cuda_bench --only gemv, 8B shapes, bench/results/gpu_llm_8b_decode_h200_2026-12-02_s3.json): with one warp
// per row 2.4-4.3 TB/s at m = 1, level with cuBLASLt (the small QKV/O matrices lose to ramp-up and tail in
// both); two warps per row took the 8B batch-1 step from 4.87 to 4.62 ms (2026-12-03). At m = 4-8 far behind
// cuBLASLt (each warp re-reads every activation row per weight chunk), so the decoder uses it for m = 1 only.
//
//   W = [n, k] bf16 row-major (PyTorch Linear layout), x = [m, k] bf16 (row stride k), y = [m, ldy].
//
// `split` warps per output row (1, 2, 4 or 8; each a contiguous slice of k): lanes read 16-byte chunks (a
// warp reads 512 contiguous bytes per load, 8 loads in flight per lane), bypassing L1 so x stays there; fp32
// accumulation, a warp-shuffle sum, the slices added in order through shared memory. split = 0 (auto,
// GemvSplitFor): one-row products with k >= 4096 use 2 warps per row (measured best of 1/2/4 on the 8B step,
// bench/results/gpu_llm_8b_decode_h200_2026-12-03.json), others 1. Rows > 1 always use one warp per row.
// Checked against cpu::MatMul (kernels/cuda/ops_gpu_test.cc).
//
// Programmatic dependent launch (sm_90, `pdl` = true): the kernel may start while the previous kernel on the
// stream still runs. It issues its first weight loads (weights never depend on earlier kernels), then waits
// for the previous grid (griddepcontrol.wait) before reading x or writing y. The small kernels before it
// (norms, RoPE, attention, ...) let dependents launch early (PdlLaunchDependents in common.cuh), so the
// weight stream of the next projection overlaps their latency-bound tails. Works under CUDA graph capture.
// The GEMVs alone with PDL measured within noise on the 8B step; with the whole chain (norms, RoPE, attention)
// batch 1 gained 1.1-1.8 % on the H100, so the decoder's default (--pdl auto) uses it in the GEMV steps
// (bench/results/gpu_pdl_chain_h100_2026-12-06.json).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

inline constexpr int kGemvMaxRows = 8;

// The warps per row a product of m rows and depth k runs with, for `split` as below.
int GemvSplitFor(int64_t m, int64_t k, int split);

// y[r, c] = Σ_j x[r, j] · w[c, j] for r < m, c < n; ldy = row stride of y (>= n). k % 8 == 0, w and x
// 16-byte aligned, 1 <= m <= kGemvMaxRows. y must not alias x.
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
                __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m, float* y,
                int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);

// The fused gate|up projection with SwiGLU: w = [2 inter, k] (gate rows, then up rows), y = [m, inter]:
//   y[r, c] = bf16(silu(g) * u),  g = bf16(x[r]·w[c]), u = bf16(x[r]·w[inter + c])
// (g and u rounded to bf16 first, as the unfused GEMM + SiluMulFused path stores them).
Status Bf16GemvSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const __nv_bfloat16* x, int64_t m,
                       __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split = 0);

// fp8 E4M3 weights (--quantization fp8): w = [n, k] bytes with one fp32 scale per row (w_scale[n]), x bf16:
//   y[r, c] = w_scale[c] · Σ_j e4m3(w[c, j]) · x[r, j]
// One row of x (m = 1), or any m with split = 1, 2, 4, 8: the bf16 GEMV's CUDA-core kernel, 16 weights per
// 16-byte load, each byte pair converted by one cvt to half2 and multiplied in fp32; split = 0 picks the
// warps per row (Fp8GemvSplitFor: 2 when a row has at least two rounds of loads, k >= 8192). m = 2-8 with
// split = 0: on tensor cores. A warp takes 16 rows over 1/8 of k, each byte pair one cvt into an fp16 A
// fragment, the x rows (converted to fp16: exact for |x| <= 65,504, larger values clamped to +-65,504) the B
// fragment's columns, mma.sync m16n8k16 with fp32 accumulators, the block's 8 slices added in order: 2 to 8
// rows cost what one does. Measured on the H100 (cuda_bench --only gemv8,
// bench/results/gpu_fp8_gemv_mma_h100_2026-12-06.json): at m = 2-8 it took 0.56-0.92x the time of
// QuantizeRowsFp8 + cuBLASLt's FP8 GEMM on the 8B layer shapes (the lm_head 1.09-1.10x: it stays on cuBLASLt
// there); at m = 1 it was 1.10-1.35x slower than the CUDA-core kernel (its 64-byte row pieces and 2 blocks
// per SM stream at 1.4-2.3 TB/s), so one row stays there.
// k % 16 == 0, w and x 16-byte aligned. Checked against the dequantised weights' product
// (kernels/cuda/fp8_gpu_test.cc).
int Fp8GemvSplitFor(int64_t m, int64_t k, int split);
Status Fp8Gemv(const uint8_t* w, const float* w_scale, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
               __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);
Status Fp8Gemv(const uint8_t* w, const float* w_scale, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
               float* y, int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);
// Bf16GemvSiluMul over fp8 weights: w = [2 inter, k] (gate rows, then up rows), w_scale = [2 inter].
Status Fp8GemvSiluMul(const uint8_t* w, const float* w_scale, int64_t inter, int64_t k, const __nv_bfloat16* x,
                      int64_t m, __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split = 0);

// GGUF Q8_0 weights decoded from their 8-bit values (about half the bf16 bytes): w = [n, k] int8 and w_d =
// [n, k / 32] fp16 block scales, the layout RepackQ8_0 (quant.h) makes from the file's 34-byte blocks:
//   y[r, c] = Σ_b w_d[c, b] · Σ_{j in block b} w[c, j] · x[r, j]
// (each 16-value chunk's fp32 sum scaled by its block's d; x stays bf16). k % 32 == 0, w and x 16-byte
// aligned; split as Fp8Gemv. Checked against the dequantised weights' product (kernels/cuda/ops_gpu_test.cc).
Status Q8Gemv(const int8_t* w, const __half* w_d, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
              __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);
Status Q8Gemv(const int8_t* w, const __half* w_d, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
              float* y, int64_t ldy, bool pdl, cudaStream_t stream, int split = 0);
// Bf16GemvSiluMul over Q8_0 weights: w = [2 inter, k] (gate rows, then up rows), w_d = [2 inter, k / 32].
Status Q8GemvSiluMul(const int8_t* w, const __half* w_d, int64_t inter, int64_t k, const __nv_bfloat16* x,
                     int64_t m, __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split = 0);

}  // namespace stoke::cuda
