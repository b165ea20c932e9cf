// Element-wise, normalisation, activation, RoPE and embedding ops on fp32 rows: the CPU reference for the
// GPU kernels. All tensors are dense, row-major; `rows` × `dim` means row r starts at r * dim.
// Unless a comment says otherwise, outputs may alias inputs of the same shape (each element is read before
// it is written), and none of these allocate.
#pragma once

#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke::cpu {

// Σ a[i] · b[i] in fp32 (AVX2, 8-lane partial sums; the same inputs always give the same bits).
float Dot(const float* a, const float* b, int64_t n);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:]   (Llama). weight = [dim]. out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * gamma + beta, biased variance (PyTorch LayerNorm).
// gamma, beta = [dim]. out may alias x.
void LayerNorm(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t dim, float eps,
               float* out);

// out[i] = a[i] + b[i]. out may alias a or b.
void Add(const float* a, const float* b, int64_t n, float* out);

// x[r, :] += bias[:] in place. x = [rows, dim], bias = [dim].
void AddBias(float* x, const float* bias, int64_t rows, int64_t dim);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// x[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2))) in place (exact GELU, as BERT and torch's default).
void GeluErf(float* x, int64_t n);

// x = softmax(x) in place over n values (max-subtracted; n >= 1).
void SoftmaxInPlace(float* x, int64_t n);

// out[i] = x[i] - log(sum_j exp(x[j])) over n values (max-subtracted). out may alias x.
void LogSoftmax(const float* x, int64_t n, float* out);

// NeoX/HF "rotate_half" RoPE in place: for each token t, head h and i < head_dim/2, the pair
// (x[i], x[i + head_dim/2]) is rotated by angle positions[t] * inv_freq[i]:
//   x[i]'          = x[i] * cos - x[i + half] * sin
//   x[i + half]'   = x[i + half] * cos + x[i] * sin
// x = [tokens, heads, head_dim] (dense), positions = [tokens], inv_freq = [head_dim / 2]
// (inv_freq[i] = theta^(-2i/head_dim), possibly rescaled, computed once by the model). head_dim is even.
void RopeNeox(float* x, const int32_t* positions, int64_t tokens, int heads, int head_dim,
              const float* inv_freq);

// out[i, :] = table[ids[i], :] as fp32. table = [vocab, dim] in dtype t (F32, F16, BF16 or a GGML quant type,
// rows of dim values; quantised rows dequantised). out = [n, dim].
// Errors: InvalidArgument naming the id when ids[i] is outside [0, vocab), or for an unsupported dtype /
// dim not a multiple of the block size. On error `out` is unspecified.
Status EmbeddingLookup(const void* table, DType t, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out);

}  // namespace stoke::cpu
