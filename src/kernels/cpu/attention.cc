#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "kernels/cpu/ops.h"

namespace stoke::cpu {
namespace {

// y[i] += a * x[i]
void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void UseSingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const int32_t* slots, int64_t tokens) {
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;  // floats per slot
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    std::copy(k + t * row, k + (t + 1) * row, kv.k + slots[t] * row);
    std::copy(v + t * row, v + (t + 1) * row, kv.v + slots[t] * row);
  }
}

void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, float* out, ThreadPool& pool) {
  const int hd = kv.head_dim;
  const int bs = kv.block_size;
  const int group = heads / kv.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(kv.num_kv_heads) * hd;
  const int64_t ctx_max = start_pos + n;
  // One (token, head) per item: ~2 · ctx · head_dim multiply-adds.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 2 * ctx_max * hd));
  pool.ParallelFor(n * heads, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(ctx_max));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / heads;
      const int h = static_cast<int>(item % heads);
      const int kvh = h / group;
      const int64_t ctx = start_pos + i + 1;  // positions 0 .. start_pos + i
      const float* qv = q + (i * heads + h) * hd;
      float* o = out + (i * heads + h) * hd;
      // scores[pos] = scale · q · k[pos], walking the block table a block at a time.
      for (int64_t pos0 = 0; pos0 < ctx; pos0 += bs) {
        const int64_t base_slot = static_cast<int64_t>(block_table[pos0 / bs]) * bs;
        const int64_t len = std::min<int64_t>(bs, ctx - pos0);
        for (int64_t t = 0; t < len; ++t) {
          scores[pos0 + t] = scale * Dot(qv, kv.k + (base_slot + t) * slot_stride + kvh * hd, hd);
        }
      }
      SoftmaxInPlace(scores.data(), ctx);
      std::fill(o, o + hd, 0.0f);
      for (int64_t pos0 = 0; pos0 < ctx; pos0 += bs) {
        const int64_t base_slot = static_cast<int64_t>(block_table[pos0 / bs]) * bs;
        const int64_t len = std::min<int64_t>(bs, ctx - pos0);
        for (int64_t t = 0; t < len; ++t)
          Axpy(scores[pos0 + t], kv.v + (base_slot + t) * slot_stride + kvh * hd, o, hd);
      }
    }
  });
}

void EncoderAttention(const float* q, const float* k, const float* v, int64_t len, int heads, int head_dim,
                      float scale, float* out, ThreadPool& pool) {
  if (len <= 0) return;
  UseSingleThreadedBlas();
  const int ld = heads * head_dim;  // row stride of q, k, v, out
  const int L = static_cast<int>(len);
  pool.ParallelFor(heads, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> s;  // [len, len] scores of one head
    s.resize(static_cast<size_t>(len * len));
    for (int64_t h = begin; h < end; ++h) {
      const int64_t off = h * head_dim;
      // S = scale · Q_h K_h^T, Q_h = [len, head_dim] with row stride ld.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, head_dim, scale, q + off, ld, k + off, ld,
                  0.0f, s.data(), L);
      for (int64_t r = 0; r < len; ++r) SoftmaxInPlace(s.data() + r * len, len);
      // O_h = S · V_h
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, head_dim, L, 1.0f, s.data(), L, v + off, ld,
                  0.0f, out + off, ld);
    }
  });
}

}  // namespace stoke::cpu
