// ggml-compatible CPU numerics: the decoder ops computed in exactly the order and precision of ggml's CPU
// backend (AVX2 build, non-flash attention, F16 KV cache), so that a GGUF model gives llama.cpp's logits to
// the bit. Measured against llama-cpp-python 0.3.36 (ggml 0.25) op by op; see docs/numerics.md.
//
// What "ggml's order" means, op by op:
//   - MatMul (Q4_1, Q8_0 weights): activations quantised per block of 32 as quantize_row_q8_1 / _q8_0 do
//     (fp16 scale d = amax/127, q = round-half-even(x · 127/amax), Q8_1's s = fp16(d · Σq)); per block, 8
//     int32 partial sums of 4 products each, each accumulated in its own fp32 lane by fma(dw·da, partial,
//     acc); Q4_1 adds fma(m, s, summs) in a scalar; the 8 lanes are summed in hsum_float_8's tree at the end.
//   - RmsNorm: Σ x² in double (each square rounded to fp32 first), mean rounded to fp32, 1/sqrtf, then
//     (x · scale) · w.
//   - RoPE: per position, theta = pos, then theta *= powf(base, -2/n_dims) per pair (fp32), cosf/sinf;
//     x0' = fma(x0, cos, -(x1·sin)), x1' = fma(x0, sin, x1·cos).
//   - Attention: K, V rounded to fp16 when stored, Q rounded to fp16; scores and the probability-weighted
//     values in llamafile's tinyBLAS order (8 fp32 lanes by index mod 8, fma, then a fixed tree) when the
//     sequence contributes >= 2 query tokens to the step, else in ggml_vec_dot_f16's order (4 × 8 lanes
//     by index mod 32); softmax with ggml's vectorised expf, the sum of 8-lane partials in double, scaled by
//     fp32(1/sum); probabilities rounded to fp16 before the value product.
//   - SwiGLU: x / (1 + v_expf(-x)) · up with ggml's vectorised expf.
#pragma once

#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/cpu/attention.h"

namespace stoke::cpu::ggml {

// x rounded to fp16 (round-half-even) and back, in place.
void RoundToF16(float* x, int64_t n);

// ggml's vectorised expf (ggml_v_expf), 8 lanes; exposed for tests.
void ExpF(const float* x, int64_t n, float* out);

// out[r, :] = ggml_rms_norm(x[r, :]) * weight. out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

// out[i] = silu(gate[i]) * up[i] as ggml_vec_swiglu_f32. out may alias gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

// RoPE in place on x = [tokens, heads, head_dim] with the pair (i, i + head_dim/2) rotated by ggml's angle
// for pair i (HF / NeoX layout; identical arithmetic to ggml's adjacent-pair mode on a GGUF Llama file,
// whose Q/K rows are the interleaved permutation of these). freq_factors: null or [head_dim/2] divisors.
struct RopeParams {
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;
};
void Rope(float* x, const int32_t* positions, int64_t tokens, int heads, int head_dim, const RopeParams& p);

// True for the weight types with a ggml-exact integer kernel (Q4_1, Q8_0); others use cpu::MatMul.
bool HasMatMul(DType wt);
// y[m, n] = x[m, k] · W^T, W = [n, k] of type wt (HasMatMul), bit-identical to ggml_mul_mat on the CPU.
// Each result depends only on its x row and W row, so splitting never changes a bit.
Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool);

// WriteKv with ggml's F16 cache: values rounded to fp16. interleave_qk: K is stored per head in GGUF
// adjacent-pair order (element j·hd/2 + i of a head at 2i + j), the order llama.cpp's K rows have for a
// Llama GGUF, so the dot products below sum in ggml's order.
void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const int32_t* slots, int64_t tokens,
             bool interleave_qk);

// PagedAttention (same contract as cpu::PagedAttention) over a cache written by ggml::WriteKv, in ggml's
// order (see the file comment); interleave_qk as for WriteKv. n >= 2 uses tinyBLAS's order, n == 1
// ggml_vec_dot_f16's, as llama.cpp does for a batch of n tokens of one sequence.
void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, bool interleave_qk, float* out, ThreadPool& pool);

}  // namespace stoke::cpu::ggml
