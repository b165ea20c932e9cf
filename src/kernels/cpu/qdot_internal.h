// Internal to kernels/cpu: SIMD helpers shared by the integer dot-product kernels (qdot.cc, qdot_k.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/qdot.h"

namespace stoke::cpu::qdot_internal {

inline int16_t LoadU16(const void* p) {  // raw fp16 bits
  int16_t h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}

// Four fp16 values -> 4 floats. Assembled in a 64-bit integer register (scalar ALU ports) rather than with
// vector inserts, which compete with the kernels' horizontal adds for the shuffle port.
inline __m128 Fp16x4(int16_t a, int16_t b, int16_t c, int16_t d) {
  const uint64_t bits = uint64_t{static_cast<uint16_t>(a)} | uint64_t{static_cast<uint16_t>(b)} << 16 |
                        uint64_t{static_cast<uint16_t>(c)} << 32 | uint64_t{static_cast<uint16_t>(d)} << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(bits)));
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
  // The 16 bytes in both halves (a load-only broadcast), the high half shifted down a nibble.
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
}

// 8 int32 partial sums of the 32 products w_j · a_j (each lane: 4 adjacent products). Exact: maddubs cannot
// saturate (|pair| <= 2 · 31 · 127 unsigned; 2 · 128 · 127 with the sign trick).
// m16: the int16 weights of the pair sums (ones, or Q6_K's per-16 sub-block scales).
template <bool kSigned>
inline __m256i BlockDotI32(__m256i w, __m256i a, __m256i m16 = _mm256_set1_epi16(1)) {
  __m256i p;
  if constexpr (kSigned) {
    p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));  // |w| · (a · sign(w))
  } else {
    p = _mm256_maddubs_epi16(w, a);
  }
  return _mm256_madd_epi16(p, m16);
}

// Column c's 32 values are 8 dwords (chunks of 4 values); an 8×8 dword transpose stores chunk q of all 8
// columns as vector q, column c in lane c (the PackedCols layout of one block).
inline void StoreTransposed8x8(const __m256i* r, uint8_t* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // columns 0-3 (h = 0) and 4-7
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  __m256i* q = reinterpret_cast<__m256i*>(out);
  for (int j = 0; j < 4; ++j) {  // u[j] holds chunks j (low 128) and j + 4 (high) of columns 0-3
    _mm256_storeu_si256(q + j, _mm256_permute2x128_si256(u[j], u[4 + j], 0x20));
    _mm256_storeu_si256(q + j + 4, _mm256_permute2x128_si256(u[j], u[4 + j], 0x31));
  }
}

// Column sums of 4 columns' 8-lane partials: lane c of the result = Σ lanes of p[c].
inline __m128i ReduceColumns4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The K-quant kernels (qdot_k.cc).
QDotTileFn GetQDotTileK(DType wt, int mr);
void PackColsQ4_K(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out);
void PackColsQ6_K(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out);

// The packed kernels for signed values (Q6_K, Q8_0) and the Q8_0 packer (qdot_signed.cc).
PackedTileFn GetPackedTileSigned(DType wt, int mr);
void PackColsQ8_0(const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out);

}  // namespace stoke::cpu::qdot_internal
