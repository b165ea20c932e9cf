// Attention on the CPU: causal over a paged KV cache (decoders) and bidirectional over one dense sequence
// (encoders). The reference for the GPU attention kernels.
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace stoke::cpu {

// Paged KV for one layer. k, v = [num_blocks, block_size, num_kv_heads, head_dim] fp32, dense: the vector
// of (slot, kv_head) starts at (slot * num_kv_heads + kv_head) * head_dim, slot = block * block_size +
// offset.
struct PagedKvLayer {
  float* k;
  float* v;
  int num_blocks;
  int block_size;
  int num_kv_heads;
  int head_dim;
};

// Stores the keys/values of `tokens` new tokens: token t goes to slot slots[t] (all kv heads).
// k, v = [tokens, num_kv_heads, head_dim]. A sequence's slot for position pos is
//   block_table[pos / block_size] * block_size + pos % block_size.
// A negative slot skips that token (padding). Slots must be < num_blocks * block_size.
void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const int32_t* slots, int64_t tokens);

// Causal attention for one sequence: n query tokens at positions start_pos .. start_pos + n - 1; query token
// i attends to KV positions [0, start_pos + i], which must already be written (WriteKv before this call, so a
// chunk attends to itself). block_table maps logical block j (positions j*block_size ..) to a physical block
// of kv and must cover position start_pos + n - 1.
// GQA: query head h uses kv head h / (heads / num_kv_heads); heads % num_kv_heads == 0.
// q, out = [n, heads, head_dim] (head_dim == kv.head_dim). scores = scale · q·k (scale usually
// 1/sqrt(head_dim)), softmax in fp32. out must not alias q. Parallel over (token, KV head) on `pool`.
// A token's output is bit-identical however the prompt is chunked (n, start_pos), whatever the block size,
// block placement and pool.
void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, float* out, ThreadPool& pool);

// Bidirectional attention for encoders over one sequence of `len` real tokens (no padding, no mask):
// q, k, v, out = [len, heads, head_dim]; every query attends to all len keys. out must not alias q, k or v.
void EncoderAttention(const float* q, const float* k, const float* v, int64_t len, int heads, int head_dim,
                      float scale, float* out, ThreadPool& pool);

}  // namespace stoke::cpu
