#include "kernels/cpu/attention.h"

namespace stoke::cpu {

void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const int32_t* slots, int64_t tokens) {}
void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, float* out, ThreadPool& pool) {}
void EncoderAttention(const float* q, const float* k, const float* v, int64_t len, int heads, int head_dim,
                      float scale, float* out, ThreadPool& pool) {}

}  // namespace stoke::cpu
