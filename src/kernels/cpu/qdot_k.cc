// Integer dot products for the K-quants (Q4_K, Q6_K). A 256-value super-block is handled as 8 virtual
// 32-value blocks, each with an exact fp32 scale (and offset), so the activations use the same 32-block
// quantisation and the results follow the same per-column FMA sequence as the 32-block formats (qdot.h).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/qdot_internal.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu::qdot_internal {
namespace {

constexpr int kSub = kQK_K / kQK;  // virtual 32-blocks per super-block

inline float LoadHalf(const uint8_t* p) {
  return _cvtsh_ss(static_cast<uint16_t>(LoadU16(p)));
}

// Q4_K: value j of sub-block s is d·sc_s·q − dmin·mn_s with q a nibble, so per virtual block
// scale = d·sc_s and offset = −dmin·mn_s, both exact in fp32 (11-bit × 6-bit products), as ggml forms them.
struct Q4_KDecoder {
  static constexpr int kBlockBytes = sizeof(BlockQ4_K);
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static constexpr bool kHalfScales = false;
  static void Decode(const uint8_t* blk, __m256i* q, float* d, float* off, int16_t (*)[2]) {
    const float dd = LoadHalf(blk + offsetof(BlockQ4_K, d));
    const float dmin = LoadHalf(blk + offsetof(BlockQ4_K, dmin));
    const uint8_t* sc = blk + offsetof(BlockQ4_K, scales);
    for (int s = 0; s < kSub; ++s) {  // ggml's get_scale_min_k4
      int scale, mn;
      if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
      } else {
        scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      }
      d[s] = dd * static_cast<float>(scale);
      off[s] = -(dmin * static_cast<float>(mn));
    }
    // 4 chunks of 32 bytes: low nibbles are sub-block 2c, high nibbles 2c + 1.
    const uint8_t* qs = blk + offsetof(BlockQ4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      q[2 * c] = _mm256_and_si256(v, m4);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
  }
};

// Q6_K: value = d·sc·(q − 32) with a 6-bit q and an int8 scale per 16 values. Per virtual block the values
// q − 32 are signed bytes, the two int8 scales weight the pair sums (madd), and the fp32 scale is d.
struct Q6_KDecoder {
  static constexpr int kBlockBytes = sizeof(BlockQ6_K);
  static constexpr bool kSigned = true;
  static constexpr bool kHasOffset = false;
  static constexpr bool kHalfScales = true;
  static void Decode(const uint8_t* blk, __m256i* q, float* d, float* off, int16_t (*hs)[2]) {
    const uint8_t* ql = blk + offsetof(BlockQ6_K, ql);
    const uint8_t* qh = blk + offsetof(BlockQ6_K, qh);
    const auto* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6_K, scales));
    const float dd = LoadHalf(blk + offsetof(BlockQ6_K, d));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03), bias = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {  // two halves of 128 values
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      for (int j = 0; j < 4;
           ++j) {  // out[32j + l]: ql byte l (+32 for odd j), nibble j / 2, qh bits 2j..2j+1
        const __m256i lo_src = (j & 1) ? l1 : l0;
        const __m256i lo = _mm256_and_si256(j >= 2 ? _mm256_srli_epi16(lo_src, 4) : lo_src, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), m2);
        q[4 * h + j] = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), bias);
        hs[4 * h + j][0] = sc[8 * h + 2 * j];
        hs[4 * h + j][1] = sc[8 * h + 2 * j + 1];
      }
    }
    for (int s = 0; s < kSub; ++s) {
      d[s] = dd;
      off[s] = 0.0f;
    }
  }
};

// MR activation rows × 4 weight rows; see QDotKernel in qdot.cc for the (identical) float semantics.
template <class D, int MR>
void QDotKernelK(const uint8_t* w, size_t w_stride, int ncols, const QuantizedActs& x, float* y,
                 int64_t ldy) {
  const uint8_t* rows[kQDotCols];
  for (int c = 0; c < kQDotCols; ++c) rows[c] = w + std::min(c, ncols - 1) * w_stride;
  const int64_t nb = x.k / kQK;
  const int64_t nsb = x.k / kQK_K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m128 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256i q[kQDotCols][kSub];
    alignas(16) float d[kSub][kQDotCols], off[kSub][kQDotCols];
    int16_t hs[kQDotCols][kSub][2];
    for (int c = 0; c < kQDotCols; ++c) {
      float dc[kSub], oc[kSub];
      D::Decode(rows[c] + sb * D::kBlockBytes, q[c], dc, oc, hs[c]);
      for (int s = 0; s < kSub; ++s) {
        d[s][c] = dc[s];
        off[s][c] = oc[s];
      }
    }
    for (int s = 0; s < kSub; ++s) {
      const int64_t b = sb * kSub + s;
      const __m128 wd = _mm_load_ps(d[s]);
      const __m128 woff = _mm_load_ps(off[s]);
      __m256i m16[kQDotCols];
      for (int c = 0; c < kQDotCols; ++c) {
        m16[c] = D::kHalfScales ? _mm256_setr_m128i(_mm_set1_epi16(hs[c][s][0]), _mm_set1_epi16(hs[c][s][1]))
                                : ones;
      }
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + r * x.k + b * kQK));
        const __m128i isum = ReduceColumns4(
            BlockDotI32<D::kSigned>(q[0][s], aq, m16[0]), BlockDotI32<D::kSigned>(q[1][s], aq, m16[1]),
            BlockDotI32<D::kSigned>(q[2][s], aq, m16[2]), BlockDotI32<D::kSigned>(q[3][s], aq, m16[3]));
        const __m128 scale = _mm_mul_ps(wd, _mm_set1_ps(x.d[r * nb + b]));
        acc[r] = _mm_fmadd_ps(scale, _mm_cvtepi32_ps(isum), acc[r]);
        if constexpr (D::kHasOffset) acc[r] = _mm_fmadd_ps(woff, _mm_set1_ps(x.s[r * nb + b]), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    float out[kQDotCols];
    _mm_storeu_ps(out, acc[r]);
    for (int c = 0; c < ncols; ++c) y[r * ldy + c] = out[c];
  }
}

template <class D>
QDotTileFn SelectK(int mr) {
  static constexpr QDotTileFn kTable[kQDotMaxRows] = {QDotKernelK<D, 1>, QDotKernelK<D, 2>, QDotKernelK<D, 3>,
                                                      QDotKernelK<D, 4>};
  if (mr < 1 || mr > kQDotMaxRows) return nullptr;
  return kTable[mr - 1];
}

}  // namespace

QDotTileFn GetQDotTileK(DType wt, int mr) {
  switch (wt) {
    case DType::kQ4_K:
      return SelectK<Q4_KDecoder>(mr);
    case DType::kQ6_K:
      return SelectK<Q6_KDecoder>(mr);
    default:
      return nullptr;
  }
}

void PackColsQ4_K(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out) {
  const uint8_t* rows[kPackCols];
  for (int c = 0; c < kPackCols; ++c) rows[c] = w + std::min(c, ncols - 1) * w_stride;
  for (int64_t sb = 0; sb < out.k / kQK_K; ++sb) {
    __m256i q[kPackCols][kSub];
    float d[kPackCols][kSub], off[kPackCols][kSub];
    for (int c = 0; c < kPackCols; ++c) {
      Q4_KDecoder::Decode(rows[c] + sb * Q4_KDecoder::kBlockBytes, q[c], d[c], off[c], nullptr);
    }
    for (int s = 0; s < kSub; ++s) {
      const int64_t b = sb * kSub + s;
      __m256i r[kPackCols];
      for (int c = 0; c < kPackCols; ++c) {
        r[c] = q[c][s];
        out.d[b * kPackCols + c] = d[c][s];
        out.off[b * kPackCols + c] = off[c][s];
      }
      StoreTransposed8x8(r, out.q + b * kQK * kPackCols);
    }
  }
}

void PackColsQ6_K(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out) {
  const uint8_t* rows[kPackCols];
  for (int c = 0; c < kPackCols; ++c) rows[c] = w + std::min(c, ncols - 1) * w_stride;
  for (int64_t sb = 0; sb < out.k / kQK_K; ++sb) {
    __m256i q[kPackCols][kSub];
    float d[kPackCols][kSub], off[kPackCols][kSub];
    int16_t hs[kPackCols][kSub][2];
    for (int c = 0; c < kPackCols; ++c) {
      Q6_KDecoder::Decode(rows[c] + sb * Q6_KDecoder::kBlockBytes, q[c], d[c], off[c], hs[c]);
    }
    for (int s = 0; s < kSub; ++s) {
      const int64_t b = sb * kSub + s;
      __m256i r[kPackCols], ra[kPackCols];
      for (int c = 0; c < kPackCols; ++c) {
        r[c] = q[c][s];
        ra[c] = _mm256_abs_epi8(r[c]);
        out.d[b * kPackCols + c] = d[c][s];
        out.off[b * kPackCols + c] = 0.0f;
        for (int h = 0; h < 2; ++h) {
          out.hs[(b * 2 + h) * 16 + 2 * c] = hs[c][s][h];
          out.hs[(b * 2 + h) * 16 + 2 * c + 1] = hs[c][s][h];
        }
      }
      StoreTransposed8x8(ra, out.q + b * kQK * kPackCols);
      StoreTransposed8x8(r, reinterpret_cast<uint8_t*>(out.qsign) + b * kQK * kPackCols);
    }
  }
}

}  // namespace stoke::cpu::qdot_internal
