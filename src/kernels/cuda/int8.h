// INT8 encoder GEMMs on the GPU (--quantization int8; docs/precision.md): the activation quantisers and the
// dequantisation after cuBLASLt's int8 x int8 -> int32 GEMM (BlasLtGemm::RunInt8, gemm.h), the same arithmetic
// as the CPU reference (kernels/cpu/int8_gemm.h). Device pointers; async on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke::cuda {

// Per-token scales, one block per row of x [rows, cols] bf16 (row stride cols), as cpu::QuantizeInt8PerToken
// on the same values: y_j = x_j · col_inv[j] (col_inv null = 1), lo / hi its min and max,
//   symmetric: mid 0,             scale = max(-lo, hi) / 127 · multiplier
//   centred:   mid = (lo + hi) / 2, scale = (hi - lo) / 254 · multiplier
// q = clamp(rint((y - mid) · (1 / scale)), -127, 127). A row with scale 0 gets q 0 (mid its value when
// centred); a row holding a non-finite value scale 0, mid 0, q 0.
Status QuantizeInt8PerToken(const __nv_bfloat16* x, int64_t rows, int64_t cols, const float* col_inv,
                            float multiplier, bool centred, int8_t* q, float* scale, float* mid,
                            cudaStream_t stream);

// Static scales, as cpu::QuantizeInt8Static / QuantizeInt8Columns: q = clamp(rint(x · inv), -127, 127) with
// inv = col_inv[j] (col_inv non-null: SmoothQuant's factors folded in) or inv_scale; NaN -> 0.
Status QuantizeInt8Static(const __nv_bfloat16* x, int64_t rows, int64_t cols, float inv_scale,
                          const float* col_inv, int8_t* q, cudaStream_t stream);

// y [m, n] (kBF16 or kF32) from the int32 products acc [m, n], as cpu::DequantizeInt8Gemm(PerToken) without
// the bias (the encoder's bias kernels add it after):
//   per-token (x_scale non-null, [m]): y = acc · (x_scale[i] · w_scale[j]) + x_mid[i] · w_sum[j]
//                                       (x_mid, w_sum null: no centre term)
//   static (x_scale null):             y = acc · (static_scale · w_scale[j])
Status DequantizeInt8Gemm(const int32_t* acc, int64_t m, int64_t n, const float* x_scale, const float* x_mid,
                          float static_scale, const float* w_scale, const float* w_sum, void* y, DType out,
                          cudaStream_t stream);

}  // namespace stoke::cuda
