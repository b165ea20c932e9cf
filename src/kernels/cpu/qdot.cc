#include "kernels/cpu/qdot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/qdot_internal.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

using namespace qdot_internal;

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

// Per-format traits. A weight block is x_j = d · q_j + off with q_j the unpacked byte (unsigned 0..15 / 0..31
// for the 4/5-bit formats, signed for Q8_0), so Σ_j x_j a_j = d·da·Σ q_j qa_j + off·(da·Σ qa_j) = ... +
// off·s. Offsets: Q4_1/Q5_1 store m; Q4_0 and Q5_0 centre their values: off = -8d / -16d.
struct Q4_0Traits {
  using Block = BlockQ4_0;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const uint8_t* b) { return UnpackNibbles(b + offsetof(Block, qs)); }
  static uint16_t D(const uint8_t* b) { return LoadU16(b + offsetof(Block, d)); }
  static __m128 Offsets(const uint8_t* const*, __m128 d) { return _mm_mul_ps(d, _mm_set1_ps(-8.0f)); }
};
struct Q4_1Traits {
  using Block = BlockQ4_1;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const uint8_t* b) { return UnpackNibbles(b + offsetof(Block, qs)); }
  static uint16_t D(const uint8_t* b) { return LoadU16(b + offsetof(Block, d)); }
  static __m128 Offsets(const uint8_t* const* b, __m128) {
    constexpr size_t m = offsetof(Block, m);
    return Fp16x4(LoadU16(b[0] + m), LoadU16(b[1] + m), LoadU16(b[2] + m), LoadU16(b[3] + m));
  }
};
struct Q5_0Traits {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const uint8_t* b) {
    return _mm256_or_si256(UnpackNibbles(b + offsetof(Block, qs)), UnpackHighBits(b + offsetof(Block, qh)));
  }
  static uint16_t D(const uint8_t* b) { return LoadU16(b + offsetof(Block, d)); }
  static __m128 Offsets(const uint8_t* const*, __m128 d) { return _mm_mul_ps(d, _mm_set1_ps(-16.0f)); }
};
struct Q5_1Traits {
  using Block = BlockQ5_1;
  static constexpr bool kSigned = false;
  static constexpr bool kHasOffset = true;
  static __m256i Unpack(const uint8_t* b) {
    return _mm256_or_si256(UnpackNibbles(b + offsetof(Block, qs)), UnpackHighBits(b + offsetof(Block, qh)));
  }
  static uint16_t D(const uint8_t* b) { return LoadU16(b + offsetof(Block, d)); }
  static __m128 Offsets(const uint8_t* const* b, __m128) {
    constexpr size_t m = offsetof(Block, m);
    return Fp16x4(LoadU16(b[0] + m), LoadU16(b[1] + m), LoadU16(b[2] + m), LoadU16(b[3] + m));
  }
};
struct Q8_0Traits {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true;
  static constexpr bool kHasOffset = false;
  static __m256i Unpack(const uint8_t* b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(Block, qs)));
  }
  static uint16_t D(const uint8_t* b) { return LoadU16(b + offsetof(Block, d)); }
  static __m128 Offsets(const uint8_t* const*, __m128) { return _mm_setzero_ps(); }
};

// MR activation rows × 4 weight rows (columns of Y), one column per lane of a 4-wide accumulator.
// Per block b, the exact integer dot of each (row, column) is formed (maddubs/madd, then a horizontal add
// tree that leaves column c in lane c), and then
//   acc[r][c] = fma(fl(d_c · da_rb), isum, acc[r][c]);  acc[r][c] = fma(off_c, s_rb, acc[r][c])
// in block order. That is the whole floating-point semantics of a result, identical for every MR, column
// position and caller, so tiling and threading never change a bit.
// Columns >= ncols repeat the last valid weight row and are not stored.
template <class T, int MR>
void QDotKernel(const uint8_t* w, size_t w_stride, int ncols, const QuantizedActs& x, float* y, int64_t ldy) {
  constexpr size_t kBlockBytes = sizeof(typename T::Block);
  const int64_t nb = x.k / kQK;
  const uint8_t* wb[kQDotCols];
  for (int c = 0; c < kQDotCols; ++c) {
    wb[c] = w + std::min(c, ncols - 1) * w_stride;
  }
  __m128 acc[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) acc[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kBlockBytes;
    const uint8_t* blk[kQDotCols] = {wb[0] + off, wb[1] + off, wb[2] + off, wb[3] + off};
    __m256i wq[kQDotCols];
#pragma GCC unroll 4
    for (int c = 0; c < kQDotCols; ++c) wq[c] = T::Unpack(blk[c]);
    const __m128 wd = Fp16x4(T::D(blk[0]), T::D(blk[1]), T::D(blk[2]), T::D(blk[3]));
    const __m128 woff = T::Offsets(blk, wd);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m256i aq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + r * x.k + b * kQK));
      const __m256i h01 =
          _mm256_hadd_epi32(BlockDotI32<T::kSigned>(wq[0], aq), BlockDotI32<T::kSigned>(wq[1], aq));
      const __m256i h23 =
          _mm256_hadd_epi32(BlockDotI32<T::kSigned>(wq[2], aq), BlockDotI32<T::kSigned>(wq[3], aq));
      const __m256i h =
          _mm256_hadd_epi32(h01, h23);  // lane c (+4): column c's sum over the low (high) 16 bytes
      const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      const __m128 scale = _mm_mul_ps(wd, _mm_set1_ps(x.d[r * nb + b]));
      acc[r] = _mm_fmadd_ps(scale, _mm_cvtepi32_ps(isum), acc[r]);
      if constexpr (T::kHasOffset) acc[r] = _mm_fmadd_ps(woff, _mm_set1_ps(x.s[r * nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float out[kQDotCols];
    _mm_storeu_ps(out, acc[r]);
    for (int c = 0; c < ncols; ++c) y[r * ldy + c] = out[c];
  }
}

template <class T>
QDotTileFn Select(int mr) {
  static constexpr QDotTileFn kTable[kQDotMaxRows] = {QDotKernel<T, 1>, QDotKernel<T, 2>, QDotKernel<T, 3>,
                                                      QDotKernel<T, 4>};
  if (mr < 1 || mr > kQDotMaxRows) return nullptr;
  return kTable[mr - 1];
}

// Packed path. kGroup: maddubs results (int16, each 2 products) that can be summed before widening:
// 8 × 2 × 15 × 127 = 30480 for 4-bit values, 4 × 2 × 31 × 127 = 31496 for 5-bit, both < 32768.
template <int MR, int kGroup>
void PackedKernel(const PackedCols& w, const QuantizedActs& x, float* y, int64_t ldy, int ncols) {
  const int64_t nb = x.k / kQK;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i* wq = reinterpret_cast<const __m256i*>(w.q + b * kQK * kPackCols);
    const __m256 wd = _mm256_loadu_ps(w.d + b * kPackCols);
    const __m256 woff = _mm256_loadu_ps(w.off + b * kPackCols);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const int8_t* a = x.qs + r * x.k + b * kQK;
      __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; g += kGroup) {
        __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int q = g; q < g + kGroup; ++q) {
          int32_t a4;
          std::memcpy(&a4, a + 4 * q, 4);
          s16 =
              _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_loadu_si256(wq + q), _mm256_set1_epi32(a4)));
        }
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(s16, ones));
      }
      const __m256 scale = _mm256_mul_ps(wd, _mm256_set1_ps(x.d[r * nb + b]));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc[r]);
      acc[r] = _mm256_fmadd_ps(woff, _mm256_set1_ps(x.s[r * nb + b]), acc[r]);
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

template <class T>
void PackColsT(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out) {
  constexpr size_t kBlockBytes = sizeof(typename T::Block);
  const int64_t nb = out.k / kQK;
  const uint8_t* wb[kPackCols];
  for (int c = 0; c < kPackCols; ++c) wb[c] = w + std::min(c, ncols - 1) * w_stride;
  for (int64_t b = 0; b < nb; ++b) {
    // Column c's 32 values are 8 dwords (chunks of 4); an 8×8 dword transpose puts chunk q of all 8
    // columns into output vector q, column c in lane c.
    __m256i r[kPackCols];
    int16_t dbits[kPackCols];
    const uint8_t* blk[kPackCols];
    for (int c = 0; c < kPackCols; ++c) {
      blk[c] = wb[c] + b * kBlockBytes;
      r[c] = T::Unpack(blk[c]);
      dbits[c] = T::D(blk[c]);
    }
    StoreTransposed8x8(r, out.q + b * kQK * kPackCols);
    const __m128 d_lo = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dbits)));
    const __m128 d_hi = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dbits + 4)));
    _mm_storeu_ps(out.d + b * kPackCols, d_lo);
    _mm_storeu_ps(out.d + b * kPackCols + 4, d_hi);
    _mm_storeu_ps(out.off + b * kPackCols, T::Offsets(blk, d_lo));
    _mm_storeu_ps(out.off + b * kPackCols + 4, T::Offsets(blk + 4, d_hi));
  }
}

}  // namespace

bool HasPackedQDot(DType wt) {
  switch (wt) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ8_0:
      return true;
    default:
      return false;
  }
}

void PackCols(DType wt, const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out) {
  switch (wt) {
    case DType::kQ4_0:
      return PackColsT<Q4_0Traits>(w, w_stride, ncols, out);
    case DType::kQ4_1:
      return PackColsT<Q4_1Traits>(w, w_stride, ncols, out);
    case DType::kQ5_0:
      return PackColsT<Q5_0Traits>(w, w_stride, ncols, out);
    case DType::kQ5_1:
      return PackColsT<Q5_1Traits>(w, w_stride, ncols, out);
    case DType::kQ4_K:
      return qdot_internal::PackColsQ4_K(w, w_stride, ncols, out);
    case DType::kQ6_K:
      return qdot_internal::PackColsQ6_K(w, w_stride, ncols, out);
    case DType::kQ8_0:
      return qdot_internal::PackColsQ8_0(w, w_stride, ncols, out);
    default:
      return;
  }
}

PackedTileFn GetPackedTile(DType wt, int mr) {
  if (!HasPackedQDot(wt) || mr < 1 || mr > kQDotMaxRows) return nullptr;
  if (wt == DType::kQ6_K || wt == DType::kQ8_0) return qdot_internal::GetPackedTileSigned(wt, mr);
  static constexpr PackedTileFn k4Bit[kQDotMaxRows] = {PackedKernel<1, 8>, PackedKernel<2, 8>,
                                                       PackedKernel<3, 8>, PackedKernel<4, 8>};
  static constexpr PackedTileFn k5Bit[kQDotMaxRows] = {PackedKernel<1, 4>, PackedKernel<2, 4>,
                                                       PackedKernel<3, 4>, PackedKernel<4, 4>};
  const bool five = wt == DType::kQ5_0 || wt == DType::kQ5_1;
  return (five ? k5Bit : k4Bit)[mr - 1];
}

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
    case DType::kQ4_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

QDotTileFn GetQDotTile(DType wt, int mr) {
  switch (wt) {
    case DType::kQ4_0:
      return Select<Q4_0Traits>(mr);
    case DType::kQ4_1:
      return Select<Q4_1Traits>(mr);
    case DType::kQ5_0:
      return Select<Q5_0Traits>(mr);
    case DType::kQ5_1:
      return Select<Q5_1Traits>(mr);
    case DType::kQ8_0:
      return Select<Q8_0Traits>(mr);
    case DType::kQ4_K:
    case DType::kQ6_K:
      return qdot_internal::GetQDotTileK(wt, mr);
    default:
      return nullptr;
  }
}

}  // namespace stoke::cpu
