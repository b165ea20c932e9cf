#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "kernels/cpu/kv_quant.h"
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

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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

namespace {

// Lane j of the result = Σ of the 8 lanes of a_j, summed as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
inline __m128 ReduceLanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// scores[g][t] = scale · q_g · k_t for G query heads sharing one KV head, t < len; k_t at k + t * k_stride.
// A score is 8 lanes of FMAs over head_dim in order (lane l: dims ≡ l mod 8), a fixed reduction tree, then
// the scalar tail of head_dim % 8: its bits do not depend on P, len, the neighbouring positions or how a
// prompt is chunked. Each key vector is loaded once for the G heads; P positions at a time give independent
// FMA chains (P · G accumulators).
template <int G, int P>
void GroupScores(const float* const* q, const float* k, int64_t k_stride, int64_t len, int hd, float scale,
                 float* const* scores) {
  static_assert(P == 2 || P == 4);
  for (int64_t t0 = 0; t0 < len; t0 += P) {
    const int np = static_cast<int>(std::min<int64_t>(P, len - t0));
    const float* kt[P];
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) kt[j] = k + (t0 + std::min(j, np - 1)) * k_stride;
    __m256 acc[G][P];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int j = 0; j < P; ++j) acc[g][j] = _mm256_setzero_ps();
    }
    int c = 0;
    for (; c + 8 <= hd; c += 8) {
      __m256 kv[P];
#pragma GCC unroll 8
      for (int j = 0; j < P; ++j) kv[j] = _mm256_loadu_ps(kt[j] + c);
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const __m256 qv = _mm256_loadu_ps(q[g] + c);
#pragma GCC unroll 8
        for (int j = 0; j < P; ++j) acc[g][j] = _mm256_fmadd_ps(qv, kv[j], acc[g][j]);
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      float sums[4];
      if constexpr (P == 4) {
        _mm_storeu_ps(sums, ReduceLanes4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));
      } else {
        _mm_storeu_ps(sums, ReduceLanes4(acc[g][0], acc[g][1], acc[g][0], acc[g][1]));
      }
      for (int j = 0; j < np; ++j) {
        float d = sums[j];
        for (int cc = c; cc < hd; ++cc) d += q[g][cc] * kt[j][cc];
        scores[g][t0 + j] = scale * d;
      }
    }
  }
}

void GroupScoresAny(int group, const float* const* q, const float* k, int64_t k_stride, int64_t len, int hd,
                    float scale, float* const* scores) {
  switch (group) {
    case 1:
      return GroupScores<1, 4>(q, k, k_stride, len, hd, scale, scores);
    case 2:
      return GroupScores<2, 4>(q, k, k_stride, len, hd, scale, scores);
    case 3:
      return GroupScores<3, 2>(q, k, k_stride, len, hd, scale, scores);
    default:
      return GroupScores<4, 2>(q, k, k_stride, len, hd, scale, scores);
  }
}

// out_g[c0 .. c0+32) = Σ_t p_g[t] · v_t[c0 .. c0+32) for G heads sharing the values, t < len: the 4×G
// accumulators stay in registers while the value rows stream. v_t at v + t * v_stride.
template <int G>
void GroupValues32(const float* const* p, const float* v, int64_t v_stride, int64_t len,
                   __m256 (&acc)[G][4]) {
  for (int64_t t = 0; t < len; ++t) {
    const float* vt = v + t * v_stride;
    const __m256 v0 = _mm256_loadu_ps(vt), v1 = _mm256_loadu_ps(vt + 8), v2 = _mm256_loadu_ps(vt + 16),
                 v3 = _mm256_loadu_ps(vt + 24);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m256 pg = _mm256_set1_ps(p[g][t]);
      acc[g][0] = _mm256_fmadd_ps(pg, v0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(pg, v1, acc[g][1]);
      acc[g][2] = _mm256_fmadd_ps(pg, v2, acc[g][2]);
      acc[g][3] = _mm256_fmadd_ps(pg, v3, acc[g][3]);
    }
  }
}

// out_g = Σ_t p_g[t] · v_t over the block table, for G query heads of one KV head.
template <int G>
void GroupOutputs(float* const* p, const float* v_base, const int32_t* block_table, int bs,
                  int64_t slot_stride, int64_t ctx, int hd, float* const* out) {
  int c0 = 0;
  for (; c0 + 32 <= hd; c0 += 32) {
    __m256 acc[G][4];
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
    }
    for (int64_t pos0 = 0; pos0 < ctx; pos0 += bs) {
      const int64_t base_slot = static_cast<int64_t>(block_table[pos0 / bs]) * bs;
      const float* pp[G];
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) pp[g] = p[g] + pos0;
      GroupValues32<G>(pp, v_base + base_slot * slot_stride + c0, slot_stride,
                       std::min<int64_t>(bs, ctx - pos0), acc);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out[g] + c0 + 8 * j, acc[g][j]);
    }
  }
  if (c0 == hd) return;
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) std::fill(out[g] + c0, out[g] + hd, 0.0f);
  for (int64_t pos0 = 0; pos0 < ctx; pos0 += bs) {
    const int64_t base_slot = static_cast<int64_t>(block_table[pos0 / bs]) * bs;
    const int64_t len = std::min<int64_t>(bs, ctx - pos0);
    for (int64_t t = 0; t < len; ++t) {
      const float* vt = v_base + (base_slot + t) * slot_stride;
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) Axpy(p[g][pos0 + t], vt + c0, out[g] + c0, hd - c0);
    }
  }
}

void GroupOutputsAny(int group, float* const* p, const float* v_base, const int32_t* block_table, int bs,
                     int64_t slot_stride, int64_t ctx, int hd, float* const* out) {
  switch (group) {
    case 1:
      return GroupOutputs<1>(p, v_base, block_table, bs, slot_stride, ctx, hd, out);
    case 2:
      return GroupOutputs<2>(p, v_base, block_table, bs, slot_stride, ctx, hd, out);
    case 3:
      return GroupOutputs<3>(p, v_base, block_table, bs, slot_stride, ctx, hd, out);
    default:
      return GroupOutputs<4>(p, v_base, block_table, bs, slot_stride, ctx, hd, out);
  }
}

constexpr int kMaxGroup = 4;  // query heads handled together; larger GQA groups run in chunks of 4

}  // namespace

void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, float* out, ThreadPool& pool) {
  const int hd = kv.head_dim;
  const int bs = kv.block_size;
  const int nkv = kv.num_kv_heads;
  const int group = heads / nkv;
  const int64_t slot_stride = static_cast<int64_t>(nkv) * hd;
  const int64_t ctx_max = start_pos + n;
  // One item = (token, kv head, chunk of <= 4 query heads): ~2 · ctx · head_dim · heads_in_chunk
  // multiply-adds.
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t items = n * nkv * chunks;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{1} << 15) / std::max<int64_t>(1, 2 * ctx_max * hd * std::min(group, kMaxGroup)));
  pool.ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;  // [kMaxGroup, ctx] scores
    scratch.resize(static_cast<size_t>(kMaxGroup * ctx_max));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / (nkv * chunks);
      const int kvh = static_cast<int>(item / chunks % nkv);
      const int h0 = kvh * group + static_cast<int>(item % chunks) * kMaxGroup;
      const int g_count = std::min(kMaxGroup, kvh * group + group - h0);
      const int64_t ctx = start_pos + i + 1;  // positions 0 .. start_pos + i
      const float* qs[kMaxGroup];
      float* os[kMaxGroup];
      float* sc[kMaxGroup];
      for (int g = 0; g < g_count; ++g) {
        qs[g] = q + (i * heads + h0 + g) * hd;
        os[g] = out + (i * heads + h0 + g) * hd;
        sc[g] = scratch.data() + g * ctx_max;
      }
      // Scores, a block of the table at a time.
      for (int64_t pos0 = 0; pos0 < ctx; pos0 += bs) {
        const int64_t base_slot = static_cast<int64_t>(block_table[pos0 / bs]) * bs;
        const int64_t len = std::min<int64_t>(bs, ctx - pos0);
        float* scp[kMaxGroup];
        for (int g = 0; g < g_count; ++g) scp[g] = sc[g] + pos0;
        GroupScoresAny(g_count, qs, kv.k + base_slot * slot_stride + kvh * hd, slot_stride, len, hd, scale,
                       scp);
      }
      for (int g = 0; g < g_count; ++g) SoftmaxInPlace(sc[g], ctx);
      GroupOutputsAny(g_count, sc, kv.v + kvh * hd, block_table, bs, slot_stride, ctx, hd, os);
    }
  });
}

void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const QuantPagedKvLayer& kv, float scale, float* out, ThreadPool& pool) {
  const int hd = kv.head_dim;
  const int bs = kv.block_size;
  const int nkv = kv.num_kv_heads;
  const int group = heads / nkv;
  const int64_t eb = KvElementBytes(kv.dtype);
  const bool scaled = KvCacheDtypeIsQuantized(kv.dtype);
  const int64_t ctx_max = start_pos + n;
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int64_t items = n * nkv * chunks;
  // Each item also dequantises 2 · ctx · head_dim values.
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{1} << 15) / std::max<int64_t>(1, 2 * ctx_max * hd * (std::min(group, kMaxGroup) + 1)));
  const int32_t zero_block = 0;
  pool.ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
    // scores [kMaxGroup, ctx], then the item's K and V rows dequantised: [ctx, head_dim] each, dense.
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>((kMaxGroup + 2 * hd) * ctx_max));
    float* kd = scratch.data() + kMaxGroup * ctx_max;
    float* vd = kd + ctx_max * hd;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / (nkv * chunks);
      const int kvh = static_cast<int>(item / chunks % nkv);
      const int h0 = kvh * group + static_cast<int>(item % chunks) * kMaxGroup;
      const int g_count = std::min(kMaxGroup, kvh * group + group - h0);
      const int64_t ctx = start_pos + i + 1;
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t row = (static_cast<int64_t>(block_table[p / bs]) * bs + p % bs) * nkv + kvh;
        const float m = kv.dequant_scale_multiplier;
        DequantizeKvRow(kv.k + row * hd * eb, hd, scaled ? kv.k_scale[row] * m : 1.0f, kv.dtype, kd + p * hd);
        DequantizeKvRow(kv.v + row * hd * eb, hd, scaled ? kv.v_scale[row] * m : 1.0f, kv.dtype, vd + p * hd);
      }
      const float* qs[kMaxGroup];
      float* os[kMaxGroup];
      float* sc[kMaxGroup];
      for (int g = 0; g < g_count; ++g) {
        qs[g] = q + (i * heads + h0 + g) * hd;
        os[g] = out + (i * heads + h0 + g) * hd;
        sc[g] = scratch.data() + g * ctx_max;
      }
      GroupScoresAny(g_count, qs, kd, hd, ctx, hd, scale, sc);
      for (int g = 0; g < g_count; ++g) SoftmaxInPlace(sc[g], ctx);
      // The dense rows as one block of ctx_max slots (block 0, row stride head_dim).
      GroupOutputsAny(g_count, sc, vd, &zero_block, static_cast<int>(ctx_max), hd, ctx, hd, os);
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
