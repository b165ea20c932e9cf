#include "kernels/cpu/qdot.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

inline float LoadF16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// Sum of 8 lanes in a fixed order.
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles -> 32 bytes 0..15: low nibbles are elements 0..15, high nibbles 16..31.
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// The Q5 fifth bits: byte j = 0x10 when bit j of the little-endian u32 qh is set.
inline __m256i UnpackHighBits(const uint8_t* qh) {
  uint32_t x32;
  std::memcpy(&x32, qh, sizeof(x32));
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  bytes = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
  return _mm256_and_si256(bytes, _mm256_set1_epi8(0x10));
}

// Per-format traits. A weight block is x_j = Scale · q_j + Offset with q_j the unpacked byte (unsigned for
// the 4/5-bit formats, signed for Q8_0), so Σ x_j a_j = Scale·da·Σ q_j qa_j + Offset·(da·Σ qa_j) = ... +
// Offset·s.
struct Q4_0Traits {
  using Block = BlockQ4_0;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const Block* b) { return UnpackNibbles(b->qs); }
  static float Scale(const Block* b) { return LoadF16(&b->d); }
  static float Offset(const Block* b) { return -8.0f * LoadF16(&b->d); }
};
struct Q4_1Traits {
  using Block = BlockQ4_1;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const Block* b) { return UnpackNibbles(b->qs); }
  static float Scale(const Block* b) { return LoadF16(&b->d); }
  static float Offset(const Block* b) { return LoadF16(&b->m); }
};
struct Q5_0Traits {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const Block* b) {
    return _mm256_or_si256(UnpackNibbles(b->qs), UnpackHighBits(b->qh));
  }
  static float Scale(const Block* b) { return LoadF16(&b->d); }
  static float Offset(const Block* b) { return -16.0f * LoadF16(&b->d); }
};
struct Q5_1Traits {
  using Block = BlockQ5_1;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const Block* b) {
    return _mm256_or_si256(UnpackNibbles(b->qs), UnpackHighBits(b->qh));
  }
  static float Scale(const Block* b) { return LoadF16(&b->d); }
  static float Offset(const Block* b) { return LoadF16(&b->m); }
};
struct Q8_0Traits {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true;
  static constexpr bool kHasOffset = false;
  static __m256i Unpack(const Block* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
  }
  static float Scale(const Block* b) { return LoadF16(&b->d); }
  static float Offset(const Block*) { return 0.0f; }
};

// 8 partial sums (as fp32) of the 32 products w_j · a_j. Exact: |partial| <= 4 · 128 · 127 < 2^24.
template <bool kSigned>
inline __m256 BlockDot(__m256i w, __m256i a) {
  __m256i p;
  if constexpr (kSigned) {
    // maddubs needs an unsigned left operand: |w| · (a · sign(w)).
    p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  } else {
    p = _mm256_maddubs_epi16(w, a);  // <= 2 · 31 · 127: no int16 saturation
  }
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

// MR activation rows × NR weight rows. Each weight block is unpacked once and used for MR rows; each
// activation block is loaded once and used for NR weight rows. Per (r, j) the operations and their order are
// the same for every MR/NR, which is what makes the result independent of the tiling.
template <class T, int MR, int NR>
void QDotKernel(const uint8_t* w, size_t w_stride, const QuantizedActs& x, float* y, int64_t ldy) {
  using Block = typename T::Block;
  const int64_t nb = x.k / kQK;
  const Block* wb[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) wb[j] = reinterpret_cast<const Block*>(w + j * w_stride);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[NR];
    __m256 wd[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      wq[j] = T::Unpack(wb[j] + b);
      wd[j] = _mm256_set1_ps(T::Scale(wb[j] + b));
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + r * x.k + b * kQK));
      const __m256 da = _mm256_set1_ps(x.d[r * nb + b]);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        acc[r][j] = _mm256_fmadd_ps(_mm256_mul_ps(wd[j], da), BlockDot<T::kSigned>(wq[j], aq), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < NR; ++j) {
      float sum = Hsum(acc[r][j]);
      if constexpr (T::kHasOffset) {
        const float* s = x.s + r * nb;
        float off = 0.0f;
        for (int64_t b = 0; b < nb; ++b) off = std::fma(T::Offset(wb[j] + b), s[b], off);
        sum += off;
      }
      y[r * ldy + j] = sum;
    }
  }
}

template <class T>
QDotTileFn Select(int mr, int nr) {
  static constexpr QDotTileFn kTable[kQDotMaxRows][kQDotMaxCols] = {
      {QDotKernel<T, 1, 1>, QDotKernel<T, 1, 2>},
      {QDotKernel<T, 2, 1>, QDotKernel<T, 2, 2>},
      {QDotKernel<T, 3, 1>, QDotKernel<T, 3, 2>},
      {QDotKernel<T, 4, 1>, QDotKernel<T, 4, 2>},
  };
  if (mr < 1 || mr > kQDotMaxRows || nr < 1 || nr > kQDotMaxCols) return nullptr;
  return kTable[mr - 1][nr - 1];
}

}  // namespace

void QuantizeActsRow(const float* x, int64_t k, int8_t* qs, float* d, float* s) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max_abs = _mm_cvtss_f32(m4);
    const float db = max_abs / 127.0f;
    const __m256 id = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    v0 = _mm256_round_ps(_mm256_mul_ps(v0, id), kRound);
    v1 = _mm256_round_ps(_mm256_mul_ps(v1, id), kRound);
    v2 = _mm256_round_ps(_mm256_mul_ps(v2, id), kRound);
    v3 = _mm256_round_ps(_mm256_mul_ps(v3, id), kRound);
    // The rounded values are small integers, so this sum is exact.
    const float qsum = Hsum(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
    __m256i i0 = _mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1));
    __m256i i2 = _mm256_packs_epi32(_mm256_cvtps_epi32(v2), _mm256_cvtps_epi32(v3));
    i0 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i0, i2), perm);  // undo the per-lane interleave
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + b * kQK), i0);
    d[b] = db;
    s[b] = db * qsum;
  }
}

bool HasQDot(DType wt) {
  switch (wt) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

QDotTileFn GetQDotTile(DType wt, int mr, int nr) {
  switch (wt) {
    case DType::kQ4_0:
      return Select<Q4_0Traits>(mr, nr);
    case DType::kQ4_1:
      return Select<Q4_1Traits>(mr, nr);
    case DType::kQ5_0:
      return Select<Q5_0Traits>(mr, nr);
    case DType::kQ5_1:
      return Select<Q5_1Traits>(mr, nr);
    case DType::kQ8_0:
      return Select<Q8_0Traits>(mr, nr);
    default:
      return nullptr;
  }
}

}  // namespace stoke::cpu
