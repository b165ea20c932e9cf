// Embedding gather and the MLP activations on the GPU. Checked against cpu::EmbeddingLookup, cpu::SiluMul,
// cpu::AddBias + cpu::GeluErf. All pointers are device pointers; every call is asynchronous on `stream`.
// Activations come in fp32 and bf16 (math in fp32, bf16 results rounded to nearest even).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

// out[i, :] = table[ids[i], :]. table = [vocab, dim] (fp32 or bf16), ids = [n], out = [n, dim].
// An id outside [0, vocab) yields a row of zeros (ids are validated on the host before they get here).
Status EmbeddingGather(const float* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out, cudaStream_t stream);
Status EmbeddingGather(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out, cudaStream_t stream);
Status EmbeddingGather(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       __nv_bfloat16* out, cudaStream_t stream);

// out[r, c] = silu(gate_up[r, c]) * gate_up[r, inter + c]: gate_up = [rows, 2 * inter] (the fused gate|up
// projection), out = [rows, inter]. out must not alias gate_up.
Status SiluMulFused(const float* gate_up, int64_t rows, int64_t inter, float* out, cudaStream_t stream);
// bf16: `vec8` (--vector-elementwise) has each thread take 8 columns with 16-byte loads and stores where
// inter % 8 == 0 and both pointers are 16-byte aligned (else the one-value-per-thread kernel): the same
// values, bit for bit.
Status SiluMulFused(const __nv_bfloat16* gate_up, int64_t rows, int64_t inter, __nv_bfloat16* out,
                    cudaStream_t stream, bool vec8 = false);
// out[i] = silu(gate[i]) * up[i] over n values (separate tensors). out may alias gate or up.
Status SiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
Status SiluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n, __nv_bfloat16* out,
               cudaStream_t stream);

// x[r, :] = gelu_erf(x[r, :] + bias[:]) in place; x = [rows, dim], bias = [dim] fp32 (nullptr: no bias).
Status GeluBias(float* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream);
Status GeluBias(__nv_bfloat16* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream);

}  // namespace stoke::cuda
