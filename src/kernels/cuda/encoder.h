// The BERT encoder's kernels that the decoder does not share: the fused embedding sum + LayerNorm, the fused
// bias + residual + LayerNorm of a post-LN layer, a bias add, bidirectional variable-length attention, and
// mean pooling + L2 normalisation. Checked against the CPU encoder (engine/model/bert.cc) and
// cpu::EncoderAttention. Device pointers; asynchronous on `stream`. Statistics and accumulation in fp32.
//
// A batch is never padded: sequence s owns rows cu_seqlens[s] .. cu_seqlens[s+1]-1 of every activation
// (cu_seqlens = [num_seqs + 1] int32, cu_seqlens[0] = 0), as on the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

// x[r, :] = LayerNorm(word[ids[r], :] + pos[positions[r], :] + type0[:]) * gamma + beta, written both as fp32
// (x_f32, the residual stream) and bf16 (x_bf16, the next GEMM's input). word = [vocab, dim] bf16,
// pos = [max_pos, dim] bf16, type0/gamma/beta = [dim] fp32. ids and positions are validated on the host
// (an id outside [0, vocab) or position outside [0, max_pos) yields a row of zeros before the norm).
Status EmbeddingLayerNorm(const __nv_bfloat16* word, int64_t vocab, const __nv_bfloat16* pos, int64_t max_pos,
                          const float* type0, const float* gamma, const float* beta, const int32_t* ids,
                          const int32_t* positions, int64_t rows, int64_t dim, float eps, float* x_f32,
                          __nv_bfloat16* x_bf16, cudaStream_t stream);

// Post-LN residual step: x[r, :] = LayerNorm(y[r, :] + bias[:] + x[r, :]) * gamma + beta (x updated in place,
// fp32) and x_bf16 = bf16(x). y = [rows, dim] fp32 (a GEMM's output), bias/gamma/beta = [dim] fp32.
Status BiasResidualLayerNorm(const float* y, const float* bias, float* x, const float* gamma,
                             const float* beta, int64_t rows, int64_t dim, float eps, __nv_bfloat16* x_bf16,
                             cudaStream_t stream);

// The same step with a bf16 residual stream (the fused-epilogue path: the GEMM already added the bias):
// x[r, :] = bf16(LayerNorm(y[r, :] + x[r, :]) * gamma + beta), in place. y, x = [rows, dim] bf16, 16-byte
// aligned; gamma/beta = [dim] fp32; dim % 8 == 0 and dim <= 2048 (ResidualLayerNormBf16Supports).
// One warp per row, the row in registers: reads y and x once, writes x once (6 bytes an element).
Status ResidualLayerNormBf16(const __nv_bfloat16* y, __nv_bfloat16* x, const float* gamma, const float* beta,
                             int64_t rows, int64_t dim, float eps, cudaStream_t stream);
bool ResidualLayerNormBf16Supports(int64_t dim);

// x[r, c] += bias[c] in place; x = [rows, dim] bf16, bias = [dim] fp32.
Status AddBias(__nv_bfloat16* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream);

// Bidirectional (unmasked within a sequence) multi-head attention over a variable-length batch.
// qkv = [total_tokens, 3 * heads * head_dim] bf16: each row is q | k | v, head h at columns h * head_dim.
// out = [total_tokens, heads * head_dim] bf16. max_len bounds every sequence's length. head_dim: 32, 64, 96
// or 128 (others: InvalidArgument). One block per (16 queries, head, sequence); keys in tiles of 64 through
// shared memory, online softmax in fp32 (exact, on CUDA cores, not tensor-core tiled).
//   kVectorized: 16-byte shared-memory loads for scores and P.V (head_dim 32/64/128; 96 runs kSimple).
//   kSimple:     4-byte loads, one lane per output dim: the first version, kept as the reference and
//   fallback.
//   kTensorCore: EncoderAttentionTiled below (head_dim 32/64/128; others run kVectorized / kSimple).
//   kTensorCoreWide: the same with 32 query rows per warp (warp_rows 32: each K/V fragment from shared memory
//                serves two mma tiles); head_dim 32/64 (128 runs kTensorCore).
//   kTensorCoreAuto: kTensorCoreWide when the call has at least kWideTilesPerSm tiles of 128 queries (over
//                sequences and heads) per SM, else kTensorCore: 32 rows per warp read each K/V fragment once
//                for two mma tiles but give half the CTAs, which at small batches leaves SMs idle in the last
//                wave (H100 kernel: BERT-large 64 x 384 0.177 vs 0.190 ms, 8 x 384 0.036 vs 0.034 ms;
//                bench/results/gpu_encoder_attention_keytile_h100_2026-12-06.json).
enum class EncoderAttentionImpl { kVectorized, kSimple, kTensorCore, kTensorCoreWide, kTensorCoreAuto };
inline constexpr int kWideTilesPerSm = 8;
// Query rows per warp (16 or 32) that EncoderAttention's tensor-core forms launch with for a call of num_seqs
// sequences up to max_len tokens on a GPU of `sms` SMs.
int EncoderAttentionWarpRows(EncoderAttentionImpl impl, int num_seqs, int max_len, int heads, int head_dim,
                             int sms);
Status EncoderAttention(const __nv_bfloat16* qkv, const int32_t* cu_seqlens, int num_seqs, int max_len,
                        int heads, int head_dim, float scale, __nv_bfloat16* out, cudaStream_t stream,
                        EncoderAttentionImpl impl = EncoderAttentionImpl::kVectorized);
bool EncoderAttentionSupports(int head_dim);

// The same attention on tensor cores (kernels/cuda/prefill_flash.cu, the decoder's FlashAttention-2 style
// prefill kernel in its dense bidirectional form): a CTA of 4 warps per (64 queries, head, sequence), 64-key
// K/V tiles by cp.async into double-buffered shared memory, S = Q·K^T and O += P·V on mma.sync m16n8k16 with
// P rounded to bf16, fp32 online softmax, only the sequence's last key tile masked. qkv and out 16-byte
// aligned; head_dim 32, 64 or 128. warp_rows: query rows per warp, 16, or 32 for head_dim <= 64 (a CTA then
// takes 128 queries, and each K/V fragment read from shared memory feeds two mma tiles).
Status EncoderAttentionTiled(const __nv_bfloat16* qkv, const int32_t* cu_seqlens, int num_seqs, int max_len,
                             int heads, int head_dim, float scale, __nv_bfloat16* out, cudaStream_t stream,
                             int warp_rows = 16);
bool EncoderAttentionTiledSupports(int head_dim);

// out[s, :] = normalize(mean over rows of sequence s of x) (L2, eps 1e-12 as torch.nn.functional.normalize).
// x = [total_tokens, dim] fp32, out = [num_seqs, dim] fp32.
Status MeanPoolNormalize(const float* x, const int32_t* cu_seqlens, int num_seqs, int64_t dim, float* out,
                         cudaStream_t stream);
// The same from a bf16 x (sums in fp32).
Status MeanPoolNormalize(const __nv_bfloat16* x, const int32_t* cu_seqlens, int num_seqs, int64_t dim,
                         float* out, cudaStream_t stream);

}  // namespace stoke::cuda
