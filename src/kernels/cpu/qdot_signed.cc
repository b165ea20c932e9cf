// Packed kernels (see PackedCols in qdot.h) for signed weight values: Q6_K (q − 32, scaled per 16 values by
// int8 sub-block scales) and Q8_0. The packed |w| goes to maddubs' unsigned side and the activation takes
// w's sign, as in the unpacked kernels; the integer sums and the FMA sequence are the same as theirs.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/qdot_internal.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu::qdot_internal {
namespace {

// kGroup chunks of 4 values summed in int16 before widening: Q6_K |pair| <= 2 · 32 · 127, four chunks (one
// 16-value half, one scale) stay below 32768; Q8_0 pairs reach 2 · 128 · 127, so one chunk at a time.
// kScaled: the widening madd weights the pairs with the half's scale (Q6_K) instead of 1.
template <int MR, int kGroup, bool kScaled>
void PackedKernelSigned(const PackedCols& w, const QuantizedActs& x, float* y, int64_t ldy, int ncols) {
  const int64_t nb = x.k / kQK;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i* wa = reinterpret_cast<const __m256i*>(w.q + b * kQK * kPackCols);
    const __m256i* ws = reinterpret_cast<const __m256i*>(w.qsign + b * kQK * kPackCols);
    const __m256 wd = _mm256_loadu_ps(w.d + b * kPackCols);
    // Chunk-outer, row-inner: each packed weight vector is loaded once for the MR rows, and only the MR
    // partial sums stay live (a row-outer loop keeps all 16 weight vectors in registers and spills).
    __m256i s16[MR], isum[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      s16[r] = _mm256_setzero_si256();
      isum[r] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      const __m256i wq = _mm256_loadu_si256(wa + q);
      const __m256i wsq = _mm256_loadu_si256(ws + q);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        int32_t a4;
        std::memcpy(&a4, x.qs + r * x.k + b * kQK + 4 * q, 4);
        const __m256i sa = _mm256_sign_epi8(_mm256_set1_epi32(a4), wsq);
        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(wq, sa));
      }
      if ((q + 1) % kGroup == 0) {
        __m256i m16 = ones;
        if constexpr (kScaled) {
          m16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.hs + (b * 2 + q / 4) * 16));
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], m16));
          s16[r] = _mm256_setzero_si256();
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256 scale = _mm256_mul_ps(wd, _mm256_set1_ps(x.d[r * nb + b]));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[r]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (ncols == kPackCols) {
      _mm256_storeu_ps(y + r * ldy, acc[r]);
    } else {
      float out[kPackCols];
      _mm256_storeu_ps(out, acc[r]);
      for (int c = 0; c < ncols; ++c) y[r * ldy + c] = out[c];
    }
  }
}

}  // namespace

PackedTileFn GetPackedTileSigned(DType wt, int mr) {
  if (mr < 1 || mr > kQDotMaxRows) return nullptr;
  static constexpr PackedTileFn kQ6[kQDotMaxRows] = {
      PackedKernelSigned<1, 4, true>, PackedKernelSigned<2, 4, true>, PackedKernelSigned<3, 4, true>,
      PackedKernelSigned<4, 4, true>};
  static constexpr PackedTileFn kQ8[kQDotMaxRows] = {
      PackedKernelSigned<1, 1, false>, PackedKernelSigned<2, 1, false>, PackedKernelSigned<3, 1, false>,
      PackedKernelSigned<4, 1, false>};
  if (wt == DType::kQ6_K) return kQ6[mr - 1];
  if (wt == DType::kQ8_0) return kQ8[mr - 1];
  return nullptr;
}

void PackColsQ8_0(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out) {
  const uint8_t* rows[kPackCols];
  for (int c = 0; c < kPackCols; ++c) rows[c] = w + std::min(c, ncols - 1) * w_stride;
  for (int64_t b = 0; b < out.k / kQK; ++b) {
    __m256i r[kPackCols], ra[kPackCols];
    int16_t dbits[kPackCols];
    for (int c = 0; c < kPackCols; ++c) {
      const uint8_t* blk = rows[c] + b * sizeof(BlockQ8_0);
      r[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ8_0, qs)));
      ra[c] = _mm256_sign_epi8(r[c], r[c]);  // |w|, with -128 -> 128 as unsigned, as the unpacked kernel
      dbits[c] = LoadU16(blk + offsetof(BlockQ8_0, d));
      out.off[b * kPackCols + c] = 0.0f;
    }
    _mm256_storeu_ps(out.d + b * kPackCols,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dbits))));
    StoreTransposed8x8(ra, out.q + b * kQK * kPackCols);
    StoreTransposed8x8(r, reinterpret_cast<uint8_t*>(out.qsign) + b * kQK * kPackCols);
  }
}

}  // namespace stoke::cpu::qdot_internal
