// Decoder attention on the GPU over a paged KV cache, plus the RoPE + cache-write kernel that fills it.
// Checked against cpu::RopeNeox + cpu::WriteKv and cpu::PagedAttention. Device pointers; async on `stream`.
//
// Cache layout (one layer), the same as the CPU's PagedKvLayer:
//   k, v = [num_blocks, block_size, num_kv_heads, head_dim] of T (fp32 or bf16)
//   a sequence's position pos lives in slot = block_table[pos / block_size] * block_size + pos % block_size
// block_tables = [num_seqs, max_blocks_per_seq] int32, row-major (unused tail entries may hold anything).
// GQA: query head h reads kv head h / (heads / num_kv_heads). Softmax and accumulation in fp32.
// Supported head_dim: 64, 128, 256 (others return InvalidArgument).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "api/kv_cache_dtype.h"
#include "base/status.h"

namespace stoke::cuda {

template <typename T>
struct DevicePagedKv {
  T* k = nullptr;
  T* v = nullptr;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Launch choices of the attention kernels (tuning, A/B runs), passed with each call; the defaults are the
// measured best on the H200. Owned by the caller (CudaLlama::Options::attention, from the --decode-* and
// --prefill-attention flags); the kernels never read the environment.
// The default of AttentionLaunchOptions::decode_partition (--decode-partition). 2048 (was 512): on the H100
// (8B shape) one split up to context 2048 is 1.09x the 512-position splits for the fp8 cache's kernel at
// batch 256-512 (context 1500) and 1.22x at batch 64 (context 1000); bf16 1.05x / 1.06x at 256-512, level at
// 64 (gpu_decode_attention_lazy_h100_2026-12-05.json).
inline constexpr int kDecodePartition = 2048;

struct AttentionLaunchOptions {
  // Decode: fewest context positions per split when the batch is split further to fill the GPU (>= 1).
  // Smaller = more blocks and a larger merge for small batches. 16 (was 32): on the H200 (8B, batch 1,
  // context 512) 4.62 ms per step against 4.64 at 32 and 4.65 at 8, within noise
  // (gpu_llm_8b_decode_h200_2026-12-03.json).
  int decode_min_partition = 16;
  // Decode: most context positions per split (>= decode_min_partition, <= 65536): a context longer than this
  // is split even when the batch alone fills the GPU. Larger = fewer splits, less merge work and workspace
  // at large batch; smaller = more blocks per sequence.
  int decode_partition = kDecodePartition;
  // Decode: prefetch the next position's K/V while the current one is reduced (WarpAttend). Off only for A/B.
  bool decode_pipeline = true;
  // Decode (bf16 or 8-bit cache, head_dim 64/128, at most 16 query heads per kv head): true = the tensor-core
  // kernel (decode_tiled.cu: a GQA group's query heads as the rows of an mma tile, each K/V row read once per
  // group, splits of at least 64 positions; 8-bit codes widened to bf16 in shared memory); false = the warp
  // kernel (one warp per position and group). On the H200 (Llama-3.1-8B shape, context 1000) the tiled kernel
  // is 2.0x the warp kernel's KV bandwidth at batch 64 and 256 and the decode step 1.41x / 1.50x; batch 1
  // within 2 % (gpu_decode_attention_tiled_h200_2026-12-05.json).
  bool decode_tiled = true;
  // Decode over an 8-bit cache with decode_tiled: true (--decode-attention tiled, the default) = each warp
  // loads only its own keys and converts the codes straight into fp16 mma fragments in registers (no shared
  // bf16 tile, no block barrier per tile; decode_tiled.cu DecodeFragKernel); false (--decode-attention
  // tiled-smem) = the codes are widened to bf16 in shared memory by the whole block. On the H100 (8B shape,
  // fp8 cache) the fragment form is 1.46-1.48x the widening kernel at batch 32-256 and the decode step 1.11x
  // / 1.19x at batch 64 / 256, context 1000 (gpu_decode_attention_regs_h100_2026-12-05.json). A bf16 cache
  // ignores it.
  bool decode_tiled_fragments = true;
  // Decode over an 8-bit cache with the fragment kernel (decode_tiled_fragments): tiles of 16 keys per warp
  // in its cp.async pipeline, 2..4 (--decode-stages). 2 = double buffering (one tile in flight while one is
  // used); 3 and 4 keep more bytes in flight per warp (the kernel runs 3 blocks of 4 warps per SM, bound by
  // registers) for 1.5x / 2x the shared memory (37 / 56 / 74 KB per block at head_dim 128).
  int decode_stages = 2;
  // Decode: launch the decode kernel and its split merge with programmatic dependent launch (each may start
  // while the kernel before it finishes, and waits for it in PdlWait); CudaLlama sets it from --pdl, with the
  // step's norms, RoPE + cache write and GEMVs.
  bool pdl = false;
  // Prefill (bf16 or 8-bit cache): false = the tiled tensor-core kernel where it applies (head_dim 64/128,
  // aligned); true = always the warp kernel (slow, exact; a way around a tiled-kernel problem, and the 8-bit
  // cache's only prefill kernel before 2026-12-05, for A/B).
  bool prefill_force_warp = false;
};

// NeoX RoPE on q (in place) and k, then k and v stored into the cache:
//   q = [tokens, heads, head_dim] (rotated in place), k, v = [tokens, num_kv_heads, head_dim] (read only),
//   positions = [tokens], slots = [tokens] (negative: token skipped, its q still rotated),
//   inv_freq = [head_dim / 2] fp32. Angle = positions[t] * inv_freq[i] in fp32, as the CPU.
Status RopeWriteKv(float* q, const float* k, const float* v, const int32_t* positions, const int32_t* slots,
                   int64_t tokens, int heads, const float* inv_freq, const DevicePagedKv<float>& kv,
                   cudaStream_t stream);
Status RopeWriteKv(__nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const int32_t* positions,
                   const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                   const DevicePagedKv<__nv_bfloat16>& kv, cudaStream_t stream);

// SplitQkv (decoder_ops.h) and RopeWriteKv in one kernel, for the decoder's bf16 steps: qkv = [tokens,
// heads * hd + 2 * kv_heads * hd] (Q, then K, then V columns), bias = [that width] fp32 or nullptr (added,
// then rounded to bf16, as SplitQkv stores it); writes rotated q = [tokens, heads, hd] and rotated k / plain
// v into the cache at slots[t] (negative: skipped). Bit-identical to SplitQkv followed by RopeWriteKv.
// `warp_heads` (--vector-elementwise): one warp per head, 4 heads per block, instead of a block per (token,
// head), where head_dim % 64 == 0: the same bytes.
Status QkvRopeWriteKv(const __nv_bfloat16* qkv, const float* bias, const int32_t* positions,
                      const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                      const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* q, cudaStream_t stream,
                      bool warp_heads = false, bool pdl = false);

// Decode: one query token per sequence, attending to its
// context_lens[s] cached positions [0, ctx). q, out = [num_seqs, heads, head_dim]. Contexts are split into
// pieces of at most launch.decode_partition positions (smaller pieces, down to 16 positions or
// launch.decode_min_partition, when num_seqs x heads is too small to fill the GPU) processed by separate
// blocks, then merged by a second kernel (log-sum-exp weights); that needs `workspace` of
// DecodeWorkspaceBytes(...) bytes (may be nullptr when it returns 0). The split depends only on (num_seqs,
// heads, max_context_len, launch), so a captured graph keeps it; DecodeWorkspaceBytes must get the same
// launch options as the call. max_context_len bounds every context_lens[s]. A sequence with context 0 gets
// zeros. With launch.pdl the tensor-core kernel over a bf16 cache (decode_tiled; over an 8-bit cache only its
// tiled-smem form) reads block_tables, context_lens and the cache rows of positions below context_lens[s] - 1
// before waiting for the kernel before it (PdlWait): only the newest position's row (the step's token, written
// by the RoPE + cache write just before) and q may still be in flight then.
size_t DecodeWorkspaceBytes(int num_seqs, int heads, int head_dim, int max_context_len,
                            const AttentionLaunchOptions& launch = {});
Status PagedDecodeAttention(const float* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<float>& kv, void* workspace, float* out,
                            cudaStream_t stream, const AttentionLaunchOptions& launch = {});
Status PagedDecodeAttention(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<__nv_bfloat16>& kv, void* workspace,
                            __nv_bfloat16* out, cudaStream_t stream,
                            const AttentionLaunchOptions& launch = {});

// Whether PagedDecodeAttention's tensor-core kernel (AttentionLaunchOptions::decode_tiled) takes this shape,
// over a bf16 or an 8-bit cache (other shapes run the warp kernel whatever the option says).
bool PagedDecodeAttentionTiledSupports(int heads, int num_kv_heads, int head_dim);

// Prefill (chunked, variable length, causal): sequence s contributes tokens cu_seqlens[s] ..
// cu_seqlens[s+1]-1 of q (total_tokens = cu_seqlens[num_seqs]), at positions start_pos[s] .. ; query i of s
// attends to cached positions [0, start_pos[s] + i] (its own chunk must already be in the cache: RopeWriteKv
// first), so a cached prefix is read from the cache like any other block. q, out = [total_tokens, heads,
// head_dim]. bf16 with head_dim 64 or 128 runs PrefillAttentionTiled (tensor cores); fp32 and other head dims
// run PrefillAttentionWarp (as does launch.prefill_force_warp).
Status PrefillAttention(const float* q, const int32_t* cu_seqlens, const int32_t* start_pos, int num_seqs,
                        int64_t total_tokens, const int32_t* block_tables, int max_blocks_per_seq, int heads,
                        float scale, const DevicePagedKv<float>& kv, float* out, cudaStream_t stream,
                        const AttentionLaunchOptions& launch = {});
Status PrefillAttention(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                        int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                        int max_blocks_per_seq, int heads, float scale,
                        const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream,
                        const AttentionLaunchOptions& launch = {});

// One attention call's batch over the paged cache as a single value (as FlashInfer's paged_kv_t): the layer's
// cache plus the batch metadata that travels with it. Decode reads context_lens / max_context_len, prefill
// cu_seqlens / start_pos / total_tokens (see the functions above for each array's shape).
template <typename T>
struct PagedKvBatch {
  DevicePagedKv<T> kv;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int num_seqs = 0;
  const int32_t* context_lens = nullptr;  // decode: [num_seqs]
  int max_context_len = 0;                // decode: bounds every context_lens[s]
  const int32_t* cu_seqlens = nullptr;    // prefill: [num_seqs + 1]
  const int32_t* start_pos = nullptr;     // prefill: [num_seqs]
  int64_t total_tokens = 0;               // prefill: cu_seqlens[num_seqs]
};
// The same kernels as the positional forms above, with the batch as one value.
template <typename T>
Status PagedDecodeAttention(const T* q, const PagedKvBatch<T>& b, int heads, float scale, void* workspace,
                            T* out, cudaStream_t stream, const AttentionLaunchOptions& launch = {}) {
  return PagedDecodeAttention(q, b.block_tables, b.max_blocks_per_seq, b.context_lens, b.num_seqs, heads,
                              b.max_context_len, scale, b.kv, workspace, out, stream, launch);
}
template <typename T>
Status PrefillAttention(const T* q, const PagedKvBatch<T>& b, int heads, float scale, T* out,
                        cudaStream_t stream, const AttentionLaunchOptions& launch = {}) {
  return PrefillAttention(q, b.cu_seqlens, b.start_pos, b.num_seqs, b.total_tokens, b.block_tables,
                          b.max_blocks_per_seq, heads, scale, b.kv, out, stream, launch);
}

// ---- 8-bit KV cache (--kv-cache-dtype int8 | fp8; kernels/cpu/kv_quant.h is the reference quantiser) ----
//   k, v             = [num_blocks, block_size, num_kv_heads, head_dim] bytes: int8, or fp8 E4M3
//   k_scale, v_scale = [num_blocks, block_size, num_kv_heads] fp32, one per (slot, kv head)
// value = q · scale. Written by QkvRopeWriteKvQuant, read (dequantised in registers) by the attention below.
struct DevicePagedKvQuant {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  KvCacheDtype dtype = KvCacheDtype::kInt8;  // kInt8 or kFp8
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// QkvRopeWriteKv into an 8-bit cache: q as there; each K and V row (token, kv head) is first rounded to bf16
// (what the bf16 cache would hold), then quantised as cpu::QuantizeKvRow: scale = amax / 127 (int8) or
// amax / 448 (fp8), q = rint(x · (127 / amax)) or e4m3_satfinite(x · (448 / amax)). head_dim <= 256.
// `warp_heads` (--vector-elementwise): one warp per head, 4 heads per block, instead of one block per (token,
// head), where head_dim % 64 == 0: the same q, bytes and scales.
Status QkvRopeWriteKvQuant(const __nv_bfloat16* qkv, const float* bias, const int32_t* positions,
                           const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                           const DevicePagedKvQuant& kv, __nv_bfloat16* q, cudaStream_t stream,
                           bool warp_heads = false, bool pdl = false);

// PagedDecodeAttention / PrefillAttention over an 8-bit cache: the same contracts, splits and workspace
// (DecodeWorkspaceBytes) as the bf16 forms. Prefill runs the tiled tensor-core kernel (head_dim 64/128,
// aligned; the codes widened to bf16 in shared memory, K scales on the scores, V scales on the softmax
// weights) unless launch.prefill_force_warp, else one warp per (token, head) dequantising in registers.
Status PagedDecodeAttention(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKvQuant& kv, void* workspace, __nv_bfloat16* out,
                            cudaStream_t stream, const AttentionLaunchOptions& launch = {});
Status PrefillAttention(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                        int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                        int max_blocks_per_seq, int heads, float scale, const DevicePagedKvQuant& kv,
                        __nv_bfloat16* out, cudaStream_t stream, const AttentionLaunchOptions& launch = {});

// The two prefill kernels behind PrefillAttention, callable directly (tests, benchmarks); same contract.
// Tiled: FlashAttention-2 style, bf16 only, head_dim 64 or 128, pointers 16-byte aligned, block_size any
// positive value; one CTA per (query tile of tile_rows = 64 (4 warps) or 128 (8 warps) rows, head), 64-key
// K/V tiles gathered from the blocks into shared memory, S = Q·K^T and O += P·V on mma.sync tensor cores,
// online softmax in fp32, causal mask on the diagonal tiles only. At most 65535 query-tile slots
// (total_tokens / tile_rows + num_seqs). InvalidArgument otherwise. PrefillAttention uses tile_rows 64.
// Warp: one warp per (token, head), walking the keys in order: simple and exact, slow.
bool PrefillAttentionTiledSupports(int head_dim);
Status PrefillAttentionTiled(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                             int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                             int max_blocks_per_seq, int heads, float scale,
                             const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream,
                             int tile_rows = 64);
// The same over an 8-bit cache (int8 / fp8 codes with their scales; prefill_flash.cu).
Status PrefillAttentionTiled(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                             int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                             int max_blocks_per_seq, int heads, float scale, const DevicePagedKvQuant& kv,
                             __nv_bfloat16* out, cudaStream_t stream, int tile_rows = 64);
Status PrefillAttentionWarp(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                            int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                            int max_blocks_per_seq, int heads, float scale,
                            const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace stoke::cuda
