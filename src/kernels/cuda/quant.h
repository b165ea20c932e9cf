// GGUF block-quantised weights on the GPU: Q4_1 and Q8_0 (layouts in kernels/cpu/quants.h, blocks of 32
// values along the contiguous dimension) and the K-quants Q4_K and Q6_K (super-blocks of 256 values; their
// block arithmetic is kquant_blocks.h, shared with a CPU test). Checked against cpu::DequantizeRow. Device
// pointers; async on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke::cuda {

// dst[i] = bf16(value i) for n values of blocks `src` of type t (kQ4_1 or kQ8_0: n % 32 == 0; kQ4_K or kQ6_K:
// n % 256 == 0); the fp32 value is computed exactly as ggml's reference (no FMA), then rounded to nearest
// even: bit-identical to Fp32ToBf16(cpu::DequantizeRow(...)). src must be 2-byte aligned (4-byte for Q4_1).
Status DequantizeToBf16(DType t, const void* src, int64_t n, __nv_bfloat16* dst, cudaStream_t stream);

// The m = 1 matrix-vector product straight from the quantised blocks (decode's GEMV; no dequantised copy):
//   y[r] = Σ_c W[r, c] · x[c],  W = [n, k] row-major in t (kQ4_1 or kQ8_0 with k % 32 == 0; kQ4_K or kQ6_K
//   with k % 256 == 0), x = [k], y = [n].
// x and w must be 16-byte aligned; y must not alias x. Accumulation in fp32. Q4_1 / Q8_0: one warp per output
// row. K-quants: eight lanes per super-block, a warp reading four at a time, and rows_per_warp (1, 2 or 4; 0
// = KGemvRowsPerWarp's choice) rows per warp sharing the activations it loads, multiplied as `math` says
// (cuda_bench --only gemvk measures each choice):
//   kFp32            each weight value as an exact fp32 times x in fp32 (the dequantised matrix's product);
//   kInt8Activations x quantised per 32-block as cpu::QuantizeActsRow (kernels/cpu/qdot.h) and each block's
//                    product an exact integer sum (dp4a), scaled once: the CPU engine's numerics (and
//                    llama.cpp's), equal to cpu::MatMul over the same blocks but for fp32 summation order;
//   kAuto            the faster of the two for the type and shape, as KGemvAuto picks it.
// Other types ignore both.
enum class KGemvMath { kAuto, kFp32, kInt8Activations };
// The choices kAuto and rows_per_warp = 0 stand for, for a K-quant type t and `rows` output rows a launch
// computes (a QuantGemvSiluMul launch: 2 * inter). Measured on the H200 (8B shapes, cuda_bench --only gemvk,
// bench/results/gpu_gemvk_rows_2026-12-05.json): int8 activations win on every Q4_K shape (1.16-1.42x
// the previous kernel) and on Q6_K with >= 8192 rows (gate|up, lm_head: 1.26x, 1.30x); fp32 wins on the
// smaller Q6_K shapes (qkv, o, down: int8 0.82-0.94x of fp32 there). Four rows per warp pay off with int8 on
// Q4_K or >= 8192 rows; two rows otherwise (four are 0.79-0.90x of two on the small Q6_K shapes).
KGemvMath KGemvAuto(DType t, int64_t rows);
int KGemvRowsPerWarp(DType t, int64_t rows, KGemvMath math);
// "auto", "fp32" or "int8" (the --kquant-gemv values).
const char* KGemvMathName(KGemvMath math);
Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const float* x, float* y, cudaStream_t stream,
                 int rows_per_warp = 0, KGemvMath math = KGemvMath::kAuto);
Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const __nv_bfloat16* x, __nv_bfloat16* y,
                 cudaStream_t stream, int rows_per_warp = 0, KGemvMath math = KGemvMath::kAuto);
// bf16 activations, fp32 results (the lm_head's logits).
Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const __nv_bfloat16* x, float* y,
                 cudaStream_t stream, int rows_per_warp = 0, KGemvMath math = KGemvMath::kAuto);

// SwiGLU straight from K-quant blocks (Q4_K or Q6_K, both matrices of type t): y[o] = silu(bf16(g_o)) ·
// bf16(u_o) with g_o = Σ_c gate[o, c] · x[c] and u_o = Σ_c up[o, c] · x[c], as QuantGemv of the two followed
// by SiluMulFused computes it but in one launch. gate and up are [inter, k], x = [k], y = [inter].
Status QuantGemvSiluMul(DType t, const void* w_gate, const void* w_up, int64_t inter, int64_t k,
                        const __nv_bfloat16* x, __nv_bfloat16* y, cudaStream_t stream, int rows_per_warp = 0,
                        KGemvMath math = KGemvMath::kAuto);

// Q8_0 blocks (34 bytes: fp16 d, 32 int8) of a [rows, cols] matrix split into the Q8Gemv layout (gemv.h):
// q = [alloc_rows, cols] int8 values and d = [alloc_rows, cols / 32] fp16 scales, bit copies of the file's;
// rows past `rows` (padding up to alloc_rows) are zero. cols % 32 == 0.
Status RepackQ8_0(const void* src, int64_t rows, int64_t cols, int64_t alloc_rows, int8_t* q, __half* d,
                  cudaStream_t stream);

// fp8 E4M3 rows with one fp32 scale per row (--quantization fp8: weights per output channel at load,
// activations per token before an FP8 GEMM), exactly as cpu::QuantizeKvRow(kFp8) (kernels/cpu/kv_quant.h):
//   amax = max |x[r, :]|, q[r, j] = e4m3_rne_satfinite(x[r, j] · (448 / amax)), scale[r] = amax / 448
// (an all-zero or non-finite row: q 0, scale 0), then scale[r] *= scale_multiplier (1 except in the tests'
// deliberately broken quantiser). x = [rows, cols] bf16 with row stride ldx, q = [rows, cols] (stride cols).
// `vec8` (--vector-elementwise): 8 values per thread access (16-byte loads, 8-byte stores) where cols and ldx
// are multiples of 8 and x (16 bytes) and q (8 bytes) are aligned, else one value per access: the same bytes.
Status QuantizeRowsFp8(const __nv_bfloat16* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                       float* scale, float scale_multiplier, cudaStream_t stream, bool vec8 = false);
// The inverse into bf16: y[r, j] = bf16(e4m3(q[r, j]) · scale[r]).
Status DequantizeRowsFp8(const uint8_t* q, const float* scale, int64_t rows, int64_t cols, __nv_bfloat16* y,
                         cudaStream_t stream);

}  // namespace stoke::cuda
