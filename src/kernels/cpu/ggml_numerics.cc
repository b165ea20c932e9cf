// Compiled with -ffp-contract=off: every fused multiply-add below is written out (intrinsics / std::fma),
// every other product and sum is rounded on its own, as in ggml's build of the same expressions.
#include "kernels/cpu/ggml_numerics.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/qdot.h"
#include "kernels/cpu/qdot_internal.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu::ggml {
namespace {

inline float F16Round(float x) {
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

// Σ of 8 lanes as ggml's hsum_float_8 and tinyBLAS's hsum: ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)).
inline float HsumTree(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// exp(x) for 8 lanes, ggml_v_expf's algorithm: n = round(x / ln2) by the 1.5·2^23 shift, b = x - n·ln2 in two
// parts, exp(b) - 1 ≈ j from a degree-5 minimax polynomial, 2^n · (1 + j) by exponent arithmetic; |n| > 126
// scales in two steps (and flushes to 0 / inf beyond 192). Constants and operation order are ggml's: the
// bits must agree.
inline __m256 VExp(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
  const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
  const __m256 j =
      _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, lo), u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (_mm256_movemask_ps(big) == 0) return _mm256_fmadd_ps(j, k, k);
  const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
  const __m256 normal = _mm256_fmadd_ps(k, j, k);
  return _mm256_or_ps(
      _mm256_and_ps(huge, _mm256_mul_ps(s1, s1)),
      _mm256_andnot_ps(huge, _mm256_or_ps(_mm256_and_ps(big, scaled), _mm256_andnot_ps(big, normal))));
}

// ---- matmul -------------------------------------------------------------------------------------------

constexpr int64_t kMinMacsPerChunk = int64_t{1} << 16;

// quantize_row_q8_1 / quantize_row_q8_0: per block of 32, d = amax/127 (stored as fp16), q = x · (127/amax)
// rounded half-even, s = fp16(d · Σq) with the fp32 d. d and s are returned as the fp32 values of the fp16s.
void QuantizeRow(const float* x, int64_t k, int8_t* qs, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max_abs = _mm_cvtss_f32(m4);
    const float db = max_abs / 127.0f;
    const __m256 id = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), kRound));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), kRound));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), kRound));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), kRound));
    const __m256i sum8 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    const int isum = _mm_cvtsi128_si32(s4);
    const __m256i packed = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), perm);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), packed);
    d[b] = F16Round(db);
    s[b] = F16Round(db * static_cast<float>(isum));
  }
}

// 8 weight columns (packed, kPackCols) × one activation row. Lane q of ggml's per-block accumulator is the
// 4-value chunk q of the block, which is packed vector q here (8 columns, one per lane): one accumulator per
// chunk, vectorised over the columns.
template <bool kQ4_1>
void Kernel8(const PackedCols& w, const int8_t* aq, const float* ad, const float* as, int64_t nb,
             float* out) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) acc[q] = _mm256_setzero_ps();
  __m256 summs = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i* wq = reinterpret_cast<const __m256i*>(w.q + b * kQK * kPackCols);
    const __m256i* ws = reinterpret_cast<const __m256i*>(w.qsign + b * kQK * kPackCols);
    const __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(w.d + b * kPackCols), _mm256_set1_ps(ad[b]));
    if constexpr (kQ4_1) {
      summs = _mm256_fmadd_ps(_mm256_loadu_ps(w.off + b * kPackCols), _mm256_set1_ps(as[b]), summs);
    }
    const int8_t* a = aq + b * kQK;
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      int32_t a4;
      std::memcpy(&a4, a + 4 * q, 4);
      __m256i p;
      if constexpr (kQ4_1) {
        p = _mm256_maddubs_epi16(_mm256_loadu_si256(wq + q), _mm256_set1_epi32(a4));
      } else {  // |w| · (a · sign(w)): exact, as ggml's mul_sum_i8_pairs
        p = _mm256_maddubs_epi16(_mm256_loadu_si256(wq + q),
                                 _mm256_sign_epi8(_mm256_set1_epi32(a4), _mm256_loadu_si256(ws + q)));
      }
      acc[q] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[q]);
    }
  }
  const __m256 t0 = _mm256_add_ps(acc[4], acc[0]), t1 = _mm256_add_ps(acc[5], acc[1]);
  const __m256 t2 = _mm256_add_ps(acc[6], acc[2]), t3 = _mm256_add_ps(acc[7], acc[3]);
  __m256 r = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
  if constexpr (kQ4_1) r = _mm256_add_ps(r, summs);
  _mm256_storeu_ps(out, r);
}

// The same with AVX512-VNNI's u8×s8 dot (one instruction for maddubs + madd; identical integers).
template <bool kQ4_1>
__attribute__((target("avx512vnni,avx512vl"))) void Kernel8Vnni(const PackedCols& w, const int8_t* aq,
                                                                const float* ad, const float* as, int64_t nb,
                                                                float* out) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int q = 0; q < 8; ++q) acc[q] = _mm256_setzero_ps();
  __m256 summs = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i* wq = reinterpret_cast<const __m256i*>(w.q + b * kQK * kPackCols);
    const __m256i* ws = reinterpret_cast<const __m256i*>(w.qsign + b * kQK * kPackCols);
    const __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(w.d + b * kPackCols), _mm256_set1_ps(ad[b]));
    if constexpr (kQ4_1) {
      summs = _mm256_fmadd_ps(_mm256_loadu_ps(w.off + b * kPackCols), _mm256_set1_ps(as[b]), summs);
    }
    const int8_t* a = aq + b * kQK;
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      int32_t a4;
      std::memcpy(&a4, a + 4 * q, 4);
      __m256i p;
      if constexpr (kQ4_1) {
        p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_loadu_si256(wq + q), _mm256_set1_epi32(a4));
      } else {  // |w| · (a · sign(w)): exact, as ggml's mul_sum_i8_pairs
        p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_loadu_si256(wq + q),
                                _mm256_sign_epi8(_mm256_set1_epi32(a4), _mm256_loadu_si256(ws + q)));
      }
      acc[q] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), acc[q]);
    }
  }
  const __m256 t0 = _mm256_add_ps(acc[4], acc[0]), t1 = _mm256_add_ps(acc[5], acc[1]);
  const __m256 t2 = _mm256_add_ps(acc[6], acc[2]), t3 = _mm256_add_ps(acc[7], acc[3]);
  __m256 r = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
  if constexpr (kQ4_1) r = _mm256_add_ps(r, summs);
  _mm256_storeu_ps(out, r);
}

// One weight row × one activation row straight from the GGML blocks (ggml_vec_dot_q4_1_q8_1 /
// _q8_0_q8_0 as such): for few activation rows, where packing 8 weight rows would cost more than it saves.
template <bool kQ4_1>
float VecDot(const uint8_t* wrow, const int8_t* aq, const float* ad, const float* as, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + b * kQK));
    __m256i p;
    float dw;
    if constexpr (kQ4_1) {
      const uint8_t* blk = wrow + b * sizeof(BlockQ4_1);
      dw = _cvtsh_ss(static_cast<uint16_t>(qdot_internal::LoadU16(blk + offsetof(BlockQ4_1, d))));
      const float mw = _cvtsh_ss(static_cast<uint16_t>(qdot_internal::LoadU16(blk + offsetof(BlockQ4_1, m))));
      summs = std::fma(mw, as[b], summs);
      p = _mm256_maddubs_epi16(qdot_internal::UnpackNibbles(blk + offsetof(BlockQ4_1, qs)), qa);
    } else {
      const uint8_t* blk = wrow + b * sizeof(BlockQ8_0);
      dw = _cvtsh_ss(static_cast<uint16_t>(qdot_internal::LoadU16(blk + offsetof(BlockQ8_0, d))));
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ8_0, qs)));
      p = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
    }
    const __m256 dd = _mm256_set1_ps(dw * ad[b]);
    acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc);
  }
  if constexpr (kQ4_1) return HsumTree(acc) + summs;
  return HsumTree(acc);
}

// Below this many activation rows, VecDot on the raw blocks; from it on, packed weights.
constexpr int64_t kPackedMinRows = 4;

// ---- attention ------------------------------------------------------------------------------------------

// tinyBLAS's f16 dot (both operands already fp16 values): 8 lanes by index mod 8, fma in index order.
inline float DotTiny(const float* x, const float* y, int n) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
  return HsumTree(acc);
}

// The reduction of ggml_vec_dot_f16's 4 accumulators (GGML_F32x8_REDUCE).
inline float ReduceVecDot(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

// ggml_vec_dot_f16: 4 accumulators of 8 lanes over steps of 32, the reduction above, the rest in double.
inline float DotVecF16(const float* x, const float* y, int n) {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int np = n & ~31;
  for (int i = 0; i < np; i += 32) {
    for (int j = 0; j < 4; ++j) {
      a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j), a[j]);
    }
  }
  double sum = ReduceVecDot(a[0], a[1], a[2], a[3]);
  for (int i = np; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

}  // namespace

void RoundToF16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) x[i] = F16Round(x[i]);
}

void ExpF(const float* x, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, VExp(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float in[8] = {}, res[8];
    std::copy(x + i, x + n, in);
    _mm256_storeu_ps(res, VExp(_mm256_loadu_ps(in)));
    std::copy(res, res + (n - i), out + i);
  }
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const float sq = xr[i] * xr[i];
      sum += static_cast<double>(sq);
    }
    const float mean = static_cast<float>(sum / static_cast<double>(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const float y = xr[i] * scale;
      o[i] = y * weight[i];
    }
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = VExp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    const float silu = g / (1.0f + std::exp(-g));
    out[i] = silu * up[i];
  }
}

void Rope(float* x, const int32_t* positions, int64_t tokens, int heads, int head_dim, const RopeParams& p) {
  const int half = head_dim / 2;
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(head_dim));
  std::vector<float> cs(half), sn(half);
  for (int64_t t = 0; t < tokens; ++t) {
    float theta = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      const float ff = p.freq_factors != nullptr ? p.freq_factors[i] : 1.0f;
      const float angle = p.freq_scale * (theta / ff);
      cs[i] = std::cos(angle);
      sn[i] = std::sin(angle);
      theta *= theta_scale;
    }
    for (int h = 0; h < heads; ++h) {
      float* a = x + (t * heads + h) * head_dim;
      float* b = a + half;
      for (int i = 0; i < half; ++i) {
        const float x0 = a[i], x1 = b[i];
        const float x1s = x1 * sn[i], x1c = x1 * cs[i];
        a[i] = std::fma(x0, cs[i], -x1s);
        b[i] = std::fma(x0, sn[i], x1c);
      }
    }
  }
}

bool HasMatMul(DType wt) {
  return wt == DType::kQ4_1 || wt == DType::kQ8_0;
}

Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool) {
  if (!HasMatMul(wt)) {
    return InvalidArgumentError("ggml::MatMul: no ggml-exact kernel for weight dtype {}",
                                GetDTypeInfo(wt).name);
  }
  if (m < 0 || k < 0 || n < 0 || k % kQK != 0) {
    return InvalidArgumentError("ggml::MatMul: shape m={} k={} n={} (k must be a multiple of {})", m, k, n,
                                kQK);
  }
  if (m == 0 || n == 0) return OkStatus();
  const int64_t nb = k / kQK;
  const DTypeInfo& info = GetDTypeInfo(wt);
  const size_t row_bytes = static_cast<size_t>(nb) * info.block_bytes;
  thread_local std::vector<int8_t> qs;
  thread_local std::vector<float> ds, ss;
  qs.resize(static_cast<size_t>(m * k));
  ds.resize(static_cast<size_t>(m * nb));
  ss.resize(static_cast<size_t>(m * nb));
  int8_t* qsp = qs.data();
  float* dsp = ds.data();
  float* ssp = ss.data();
  pool.ParallelFor(m, std::max<int64_t>(1, kMinMacsPerChunk / (8 * k)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) QuantizeRow(x + r * k, k, qsp + r * k, dsp + r * nb, ssp + r * nb);
  });
  const bool q4_1 = wt == DType::kQ4_1;
  const auto* wb = static_cast<const uint8_t*>(w);
  if (m < kPackedMinRows) {
    pool.ParallelFor(n, std::max<int64_t>(1, kMinMacsPerChunk / (k * m)), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        for (int64_t r = 0; r < m; ++r) {
          const int8_t* aq = qsp + r * k;
          y[r * n + c] = q4_1 ? VecDot<true>(wb + c * row_bytes, aq, dsp + r * nb, ssp + r * nb, nb)
                              : VecDot<false>(wb + c * row_bytes, aq, dsp + r * nb, ssp + r * nb, nb);
        }
      }
    });
    return OkStatus();
  }
  static const bool vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  const int64_t groups = (n + kPackCols - 1) / kPackCols;
  pool.ParallelFor(
      groups, std::max<int64_t>(1, kMinMacsPerChunk / (kPackCols * k * m)), [&](int64_t b, int64_t e) {
        thread_local std::vector<uint8_t> packed_q;
        thread_local std::vector<float> packed_f;
        thread_local std::vector<int16_t> packed_hs;
        const PackedColsSize size(k);
        packed_q.resize(static_cast<size_t>(2 * size.q));
        packed_f.resize(static_cast<size_t>(2 * size.f));
        packed_hs.resize(static_cast<size_t>(size.hs));
        const PackedCols pc{packed_q.data(),  reinterpret_cast<int8_t*>(packed_q.data() + size.q),
                            packed_f.data(),  packed_f.data() + size.f,
                            packed_hs.data(), k};
        float out[kPackCols];
        for (int64_t g = b; g < e; ++g) {
          const int64_t n0 = g * kPackCols;
          const int cols = static_cast<int>(std::min<int64_t>(kPackCols, n - n0));
          PackCols(wt, wb + n0 * row_bytes, row_bytes, cols, pc);
          for (int64_t r = 0; r < m; ++r) {
            if (q4_1) {
              (vnni ? Kernel8Vnni<true> : Kernel8<true>)(pc, qsp + r * k, dsp + r * nb, ssp + r * nb, nb,
                                                         out);
            } else {
              (vnni ? Kernel8Vnni<false> : Kernel8<false>)(pc, qsp + r * k, dsp + r * nb, ssp + r * nb, nb,
                                                           out);
            }
            std::memcpy(y + r * n + n0, out, cols * sizeof(float));
          }
        }
      });
  return OkStatus();
}

void WriteKv(const PagedKvLayer& kv, const float* k, const float* v, const int32_t* slots, int64_t tokens,
             bool interleave_qk) {
  const int hd = kv.head_dim, half = hd / 2;
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * hd;
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    float* kd = kv.k + slots[t] * row;
    float* vd = kv.v + slots[t] * row;
    const float* ks = k + t * row;
    for (int64_t h = 0; h < kv.num_kv_heads; ++h) {
      for (int e = 0; e < hd; ++e) {
        const int dst = interleave_qk ? (e < half ? 2 * e : 2 * (e - half) + 1) : e;
        kd[h * hd + dst] = F16Round(ks[h * hd + e]);
      }
    }
    std::copy(v + t * row, v + (t + 1) * row, vd);
    RoundToF16(vd, row);
  }
}

void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const PagedKvLayer& kv, float scale, bool interleave_qk, float* out, ThreadPool& pool) {
  const int hd = kv.head_dim, half = hd / 2;
  const int bs = kv.block_size;
  const int group = heads / kv.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(kv.num_kv_heads) * hd;
  const int64_t ctx_max = start_pos + n;
  // llama.cpp runs a batch of >= 2 tokens through llamafile's tinyBLAS (which needs k % 8 == 0), one token
  // through ggml_vec_dot_f16.
  const bool tiny_scores = n >= 2 && hd % 8 == 0;
  const bool tiny_values = n >= 2;
  const int64_t items = n * heads;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, 2 * ctx_max * hd));
  pool.ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> q16, sc;
    thread_local std::vector<int64_t> slot_off;  // position -> offset of its slot's row in the cache
    q16.resize(static_cast<size_t>(hd));
    sc.resize(static_cast<size_t>((ctx_max + 31) / 32 * 32));
    slot_off.resize(static_cast<size_t>(ctx_max));
    int64_t known = 0;  // slot_off is valid for positions < known (same table for the whole call)
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / heads;
      const int h = static_cast<int>(item % heads);
      const int kvh = h / group;
      const int64_t ctx = start_pos + i + 1;
      const float* qh = q + (i * heads + h) * hd;
      for (int e = 0; e < hd; ++e) {
        const int dst = interleave_qk ? (e < half ? 2 * e : 2 * (e - half) + 1) : e;
        q16[dst] = F16Round(qh[e]);
      }
      for (; known < ctx; ++known) {
        slot_off[known] = (static_cast<int64_t>(block_table[known / bs]) * bs + known % bs) * slot_stride;
      }
      const int64_t* off = slot_off.data();
      const float* kbase = kv.k + kvh * hd;
      const float* vbase = kv.v + kvh * hd;
      float* s = sc.data();
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < ctx; ++t) {
        const float* kt = kbase + off[t];
        const float dot = tiny_scores ? DotTiny(q16.data(), kt, hd) : DotVecF16(q16.data(), kt, hd);
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      // Softmax over groups of 8 from position 0 (the masked tail of the last group is exactly 0).
      const int64_t ctx8 = (ctx + 7) / 8 * 8;
      const int64_t ctx32 = (ctx + 31) / 32 * 32;
      for (int64_t t = ctx; t < ctx32; ++t) s[t] = 0.0f;
      double sum = 0.0;
      const __m256 vmx = _mm256_set1_ps(mx);
      for (int64_t t0 = 0; t0 < ctx8; t0 += 8) {
        __m256 val = VExp(_mm256_sub_ps(_mm256_loadu_ps(s + t0), vmx));
        if (t0 + 8 > ctx) {  // zero the masked lanes
          alignas(32) float lanes[8];
          _mm256_store_ps(lanes, val);
          for (int64_t t = ctx; t < t0 + 8; ++t) lanes[t - t0] = 0.0f;
          val = _mm256_load_ps(lanes);
        }
        _mm256_storeu_ps(s + t0, val);
        sum += static_cast<double>(HsumTree(val));
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t t = 0; t < ctx; ++t) s[t] = F16Round(s[t] * inv);

      float* o = out + (i * heads + h) * hd;
      for (int e0 = 0; e0 < hd; e0 += 8) {
        const int width = std::min(8, hd - e0);
        auto load_v = [&](int64_t t) {
          const float* vt = vbase + off[t] + e0;
          if (width == 8) return _mm256_loadu_ps(vt);
          float tmp[8] = {};
          std::copy(vt, vt + width, tmp);
          return _mm256_loadu_ps(tmp);
        };
        __m256 r;
        if (tiny_values) {  // lane = position mod 8, then hsum's tree across the 8 classes
          __m256 a[8];
          for (auto& x : a) x = _mm256_setzero_ps();
          const int64_t full = ctx / 8 * 8;
          for (int64_t t0 = 0; t0 < full; t0 += 8) {
#pragma GCC unroll 8
            for (int l = 0; l < 8; ++l)
              a[l] = _mm256_fmadd_ps(_mm256_set1_ps(s[t0 + l]), load_v(t0 + l), a[l]);
          }
          for (int64_t t = full; t < ctx; ++t) {
            a[t - full] = _mm256_fmadd_ps(_mm256_set1_ps(s[t]), load_v(t), a[t - full]);
          }
          const __m256 t0 = _mm256_add_ps(a[4], a[0]), t1 = _mm256_add_ps(a[5], a[1]);
          const __m256 t2 = _mm256_add_ps(a[6], a[2]), t3 = _mm256_add_ps(a[7], a[3]);
          r = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        } else {  // ggml_vec_dot_f16: class = position mod 32 (accumulator (t/8) % 4, lane t % 8)
          __m256 a[32];
          for (auto& x : a) x = _mm256_setzero_ps();
          const int64_t full = ctx / 32 * 32;
          for (int64_t t0 = 0; t0 < full; t0 += 32) {
#pragma GCC unroll 32
            for (int c = 0; c < 32; ++c)
              a[c] = _mm256_fmadd_ps(_mm256_set1_ps(s[t0 + c]), load_v(t0 + c), a[c]);
          }
          for (int64_t t = full; t < ctx; ++t) {
            a[t - full] = _mm256_fmadd_ps(_mm256_set1_ps(s[t]), load_v(t), a[t - full]);
          }
          __m256 bl[8];
          for (int l = 0; l < 8; ++l) {
            bl[l] = _mm256_add_ps(_mm256_add_ps(a[l], a[16 + l]), _mm256_add_ps(a[8 + l], a[24 + l]));
          }
          const __m256 u0 = _mm256_add_ps(bl[0], bl[4]), u1 = _mm256_add_ps(bl[1], bl[5]);
          const __m256 u2 = _mm256_add_ps(bl[2], bl[6]), u3 = _mm256_add_ps(bl[3], bl[7]);
          r = _mm256_add_ps(_mm256_add_ps(u0, u1), _mm256_add_ps(u2, u3));
        }
        if (width == 8) {
          _mm256_storeu_ps(o + e0, r);
        } else {
          float tmp[8];
          _mm256_storeu_ps(tmp, r);
          std::copy(tmp, tmp + width, o + e0);
        }
      }
    }
  });
}

}  // namespace stoke::cpu::ggml
