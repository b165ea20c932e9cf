// Small glue kernels of the CUDA decoder (engine/cuda/cuda_llama): the fp32 residual stream with bf16
// activations around it, and the QKV split. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

// Pre-norm residual step with an fp32 residual stream and bf16 activations:
//   residual[r, :] += delta[r, :]      (skipped when delta is nullptr)
//   out[r, :] = bf16(residual[r, :] / sqrt(mean(residual[r, :]^2) + eps) * weight[:])
// residual = [rows, dim] fp32, delta = [rows, dim] bf16, out = [rows, dim] bf16, weight = [dim] fp32.
// pdl: launched with programmatic dependent launch (--pdl; the kernel waits for the one before it).
Status AddRmsNorm(const __nv_bfloat16* delta, float* residual, const float* weight, int64_t rows, int64_t dim,
                  float eps, __nv_bfloat16* out, cudaStream_t stream, bool pdl = false);

// The final norm of the rows whose logits are wanted, without touching the residual:
//   out[i, :] = bf16(rmsnorm(residual[rows[i], :] + delta[rows[i], :]) * weight[:])   for i < n
// delta may be nullptr; rows = [n] int32 indices into residual/delta.
Status GatherAddRmsNorm(const float* residual, const __nv_bfloat16* delta, const int32_t* rows, int64_t n,
                        int64_t dim, const float* weight, float eps, __nv_bfloat16* out, cudaStream_t stream,
                        bool pdl = false);

// Splits the fused projection qkv = [tokens, q_dim + 2 kv_dim] (Q, then K, then V columns) into dense
// q = [tokens, q_dim], k, v = [tokens, kv_dim], adding bias = [q_dim + 2 kv_dim] fp32 (nullptr: none) in
// fp32.
Status SplitQkv(const __nv_bfloat16* qkv, const float* bias, int64_t tokens, int64_t q_dim, int64_t kv_dim,
                __nv_bfloat16* q, __nv_bfloat16* k, __nv_bfloat16* v, cudaStream_t stream);

}  // namespace stoke::cuda
