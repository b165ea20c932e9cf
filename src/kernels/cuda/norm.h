// Normalisations on the GPU, one block per row, statistics in fp32. Checked against cpu::RmsNorm / cpu::Add
// and cpu::LayerNorm. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

// The pre-norm residual step of a decoder layer, fused:
//   residual[r, :] = x[r, :] + residual[r, :]          (stored in T: bf16 residuals are rounded here)
//   out[r, :]      = residual[r, :] / sqrt(mean(residual[r, :]^2) + eps) * weight[:]
// x, residual, out = [rows, dim] of T; weight = [dim] fp32. out may alias x (not residual).
Status RmsNormResidual(const float* x, float* residual, const float* weight, int64_t rows, int64_t dim,
                       float eps, float* out, cudaStream_t stream);
Status RmsNormResidual(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* weight, int64_t rows,
                       int64_t dim, float eps, __nv_bfloat16* out, cudaStream_t stream);

// Plain RMSNorm of bf16 rows (the fp32 version is in rms_norm.h). out may alias x.
Status RmsNorm(const __nv_bfloat16* x, const float* weight, int64_t rows, int64_t dim, float eps,
               __nv_bfloat16* out, cudaStream_t stream);

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta (biased variance, as PyTorch).
// x, out = [rows, dim] of T (out may alias x); gamma, beta = [dim] fp32.
Status LayerNorm(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t dim, float eps,
                 float* out, cudaStream_t stream);
Status LayerNorm(const __nv_bfloat16* x, const float* gamma, const float* beta, int64_t rows, int64_t dim,
                 float eps, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace stoke::cuda
