// GGUF K-quant super-blocks (Q4_K: 144 bytes, Q6_K: 210 bytes, 256 values each; layouts in
// kernels/cpu/quants.h) as the GPU reads them, written once for host and device: quant.cu's dequantiser and
// fused-dequant GEMV call these, and kernels/cpu/kquant_blocks_test.cc runs the same code on the CPU against
// cpu::DequantizeRow (bit for bit) and against a double-precision dot product, so the block arithmetic is
// checked where no GPU is.
//
// The GEMV splits a super-block into 8 parts of 32 values, one lane each (a warp covers 4 super-blocks):
//   Q4_K part p: chunk j = p / 2 (64 values: sub-block 2j in the low nibbles, 2j + 1 in the high ones of the
//   same
//     32 bytes), half h = p % 2: bytes qs[32j + 16h, +16) give values a = 64j + 16h + [0, 16) (low nibbles,
//     sub-block 2j) and b = 64j + 32 + 16h + [0, 16) (high nibbles, sub-block 2j + 1).
//   Q6_K part p: half n = p / 4 (128 values), quarter m = p % 4: l in [8m, 8m + 8) gives the four values
//     128n + l + 32g (g = 0..3) from ql[64n + l], ql[64n + 32 + l] and qh[32n + l], with scale sc[8n + l / 16
//     + 2g].
// x for a part: Q4_K xa[16], xb[16] (the a and b values); Q6_K xg[4][8] (g, then l - 8m).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/half.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define STOKE_KQ_FN __host__ __device__ __forceinline__
#define STOKE_KQ_UNROLL _Pragma("unroll")
#else
#define STOKE_KQ_FN inline
#define STOKE_KQ_UNROLL
#endif

namespace stoke::kquant {

inline constexpr int kValues = 256;
inline constexpr int kQ4KBytes = 144;  // d, dmin (fp16), scales[12], qs[128]
inline constexpr int kQ6KBytes = 210;  // ql[128], qh[64], scales[16] (int8), d (fp16)
inline constexpr int kPartsPerBlock = 8;
inline constexpr int kQ4KScales = 4, kQ4KQs = 16;
inline constexpr int kQ6KQh = 128, kQ6KScales = 192, kQ6KD = 208;

// fp32 products and differences rounded once (no FMA contraction), as ggml's reference computes them. Host
// callers compile with -ffp-contract=off.
STOKE_KQ_FN float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STOKE_KQ_FN float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// IEEE binary16 bits to fp32, exactly (subnormals, infinities and NaN included): the device's conversion, or
// base/half.h's on the host.
STOKE_KQ_FN float HalfBitsToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return Fp16ToFp32(h);
#endif
}

// The fp16 at p (2-byte aligned: one 16-bit load on the device). quant.cu's Q4_1 / Q8_0 kernels read their
// block scales with it too.
STOKE_KQ_FN float LoadHalfBits(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return HalfBitsToFloat(*reinterpret_cast<const uint16_t*>(p));
#else
  return HalfBitsToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
#endif
}

STOKE_KQ_FN float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// A small code c (0 <= c < 2^23) as an exact fp32 without an integer-to-float conversion (quarter rate or
// less on Hopper, and the GEMV's bottleneck when it converted every value): c ORed into the mantissa of 2^23
// is 2^23 + c, and subtracting `bias` = 2^23 (+ an offset) leaves c (- the offset) exactly. gemv.cu's Q8
// weights use the same trick.
inline constexpr uint32_t kMagicBits = 0x4B000000u;  // 2^23
inline constexpr float kMagic = 8388608.f;
STOKE_KQ_FN float CodeToFloat(uint32_t c, float bias = kMagic) {
  return BitsToFloat(kMagicBits | c) - bias;
}

// Q4_K sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes (ggml's get_scale_min_k4); byte(k)
// returns packed byte k.
template <typename Byte>
STOKE_KQ_FN void Q4KScaleMin(int j, Byte byte, int* sc, int* mn) {
  if (j < 4) {
    *sc = byte(j) & 63;
    *mn = byte(j + 4) & 63;
  } else {
    *sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
    *mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}
STOKE_KQ_FN void Q4KScaleMin(int j, const uint8_t* q, int* sc, int* mn) {
  Q4KScaleMin(
      j, [q](int k) -> int { return q[k]; }, sc, mn);
}

// Value i (0..255) of a Q4_K super-block, bit-exact with cpu::DequantizeRow: (d·sc)·q − dmin·mn.
STOKE_KQ_FN float Q4KValue(const uint8_t* blk, int i) {
  const int chunk = i / 64, hi = (i / 32) & 1, l = i & 31;
  int sc, mn;
  Q4KScaleMin(2 * chunk + hi, blk + kQ4KScales, &sc, &mn);
  const float d1 = MulRn(LoadHalfBits(blk), static_cast<float>(sc));
  const float m1 = MulRn(LoadHalfBits(blk + 2), static_cast<float>(mn));
  const uint8_t q = blk[kQ4KQs + 32 * chunk + l];
  return SubRn(MulRn(d1, static_cast<float>(hi ? q >> 4 : q & 0xF)), m1);
}

// Value i (0..255) of a Q6_K super-block, bit-exact with cpu::DequantizeRow: (d·sc)·(q − 32).
STOKE_KQ_FN float Q6KValue(const uint8_t* blk, int i) {
  const int n = i / 128, g = (i % 128) / 32, l = i & 31;
  const uint8_t ql = blk[64 * n + l + (g & 1) * 32];
  const int low = (g & 2) ? ql >> 4 : ql & 0xF;
  const int high = (blk[kQ6KQh + 32 * n + l] >> (2 * g)) & 3;
  const int q = (low | (high << 4)) - 32;
  const int sc = static_cast<int8_t>(blk[kQ6KScales + 8 * n + l / 16 + 2 * g]);
  return MulRn(MulRn(LoadHalfBits(blk + kQ6KD), static_cast<float>(sc)), static_cast<float>(q));
}

// Offsets of a part's activations within the super-block's 256 (see the top of the file).
STOKE_KQ_FN int Q4KPartA(int p) {
  return 64 * (p / 2) + 16 * (p % 2);
}
STOKE_KQ_FN int Q6KPartX(int p, int g) {
  return 128 * (p / 4) + 8 * (p % 4) + 32 * g;
}

// Part p's operands of a Q4_K super-block as little-endian words: head = its first 16 bytes (d, dmin,
// scales[12]) and qs = the part's 16 nibble bytes; one 16-byte load each on the device (blk 16-byte aligned).
STOKE_KQ_FN void Q4KLoadPart(const uint8_t* blk, int p, uint32_t (&head)[4], uint32_t (&qs)[4]) {
  const uint8_t* q = blk + kQ4KQs + 32 * (p / 2) + 16 * (p % 2);
#if defined(__CUDA_ARCH__)
  const uint4 h = *reinterpret_cast<const uint4*>(blk), v = *reinterpret_cast<const uint4*>(q);
  head[0] = h.x, head[1] = h.y, head[2] = h.z, head[3] = h.w;
  qs[0] = v.x, qs[1] = v.y, qs[2] = v.z, qs[3] = v.w;
#else
  std::memcpy(head, blk, 16);
  std::memcpy(qs, q, 16);
#endif
}

// What part p of a Q4_K super-block needs from its head words (Q4KLoadPart): d, dmin and the 6-bit scale and
// min of its two sub-blocks 2j and 2j + 1 (j = p / 2). Scale byte k (0..11) is byte 4 + k of the head, word
// 1 + k / 4, selected by value rather than by a dynamic register index (which would put the words in local
// memory on the device).
struct Q4KPartScales {
  float d, dmin;
  int sc_a, mn_a, sc_b, mn_b;
};
STOKE_KQ_FN Q4KPartScales Q4KHeadScales(const uint32_t (&head)[4], int p) {
  const auto byte = [&head](int k) -> int {
    const uint32_t word = k < 4 ? head[1] : (k < 8 ? head[2] : head[3]);
    return static_cast<int>((word >> (8 * (k & 3))) & 0xFFu);
  };
  Q4KPartScales h;
  Q4KScaleMin(2 * (p / 2), byte, &h.sc_a, &h.mn_a);
  Q4KScaleMin(2 * (p / 2) + 1, byte, &h.sc_b, &h.mn_b);
  h.d = HalfBitsToFloat(static_cast<uint16_t>(head[0] & 0xFFFFu));
  h.dmin = HalfBitsToFloat(static_cast<uint16_t>(head[0] >> 16));
  return h;
}

// Σ xa and Σ xb of a part's activations, which multiply the sub-blocks' mins. They do not depend on the
// weights, so a GEMV computing several rows sums them once.
STOKE_KQ_FN void Q4KPartXSums(const float (&xa)[16], const float (&xb)[16], float* sa, float* sb) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  STOKE_KQ_UNROLL
  for (int k = 0; k < 16; k += 2) {
    s[0] += xa[k], s[1] += xa[k + 1], s[2] += xb[k], s[3] += xb[k + 1];
  }
  *sa = s[0] + s[1];
  *sb = s[2] + s[3];
}

// Σ value·x over part p's 32 values of a Q4_K super-block, from Q4KLoadPart's words and Q4KPartXSums' sums:
// d·sc_a·Σq·xa − dmin·mn_a·Σxa, and the same for b. The nibbles become floats through CodeToFloat (a high
// nibble as 16·q, unshifted, the 1/16 applied once at the end), into four independent partial sums.
STOKE_KQ_FN float Q4KPartDot(const uint32_t (&head)[4], const uint32_t (&qs)[4], int p, const float (&xa)[16],
                             const float (&xb)[16], float sa, float sb) {
  float qa[2] = {0.f, 0.f}, qb[2] = {0.f, 0.f};
  STOKE_KQ_UNROLL
  for (int w = 0; w < 4; ++w) {
    STOKE_KQ_UNROLL
    for (int e = 0; e < 4; ++e) {
      const uint32_t byte = qs[w] >> (8 * e);
      const int k = 4 * w + e;
      qa[e & 1] += CodeToFloat(byte & 0xFu) * xa[k];
      qb[e & 1] += CodeToFloat(byte & 0xF0u) * xb[k];
    }
  }
  const Q4KPartScales h = Q4KHeadScales(head, p);
  return h.d * (static_cast<float>(h.sc_a) * (qa[0] + qa[1]) +
                static_cast<float>(h.sc_b) * (qb[0] + qb[1]) * 0.0625f) -
         h.dmin * (static_cast<float>(h.mn_a) * sa + static_cast<float>(h.mn_b) * sb);
}

// The same from the block itself (loads and sums included): what one row's dot needs.
STOKE_KQ_FN float Q4KPartDot(const uint8_t* blk, int p, const float (&xa)[16], const float (&xb)[16]) {
  uint32_t head[4], qs[4];
  Q4KLoadPart(blk, p, head, qs);
  float sa, sb;
  Q4KPartXSums(xa, xb, &sa, &sb);
  return Q4KPartDot(head, qs, p, xa, xb, sa, sb);
}

// Σ value·x over part p's 32 values of a Q6_K super-block: d · Σ_g sc_g · Σ_l (q − 32)·x. blk 2-byte aligned.
STOKE_KQ_FN float Q6KPartDot(const uint8_t* blk, int p, const float (&xg)[4][8]) {
  const int n = p / 4, l0 = 8 * (p % 4);
  const uint8_t* ql = blk + 64 * n + l0;
  const uint8_t* qh = blk + kQ6KQh + 32 * n + l0;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  STOKE_KQ_UNROLL
  for (int t = 0; t < 4; ++t) {  // pairs of l: 16-bit loads
    uint16_t lo, hi, h;
#if defined(__CUDA_ARCH__)
    lo = *reinterpret_cast<const uint16_t*>(ql + 2 * t);
    hi = *reinterpret_cast<const uint16_t*>(ql + 32 + 2 * t);
    h = *reinterpret_cast<const uint16_t*>(qh + 2 * t);
#else
    std::memcpy(&lo, ql + 2 * t, 2);
    std::memcpy(&hi, ql + 32 + 2 * t, 2);
    std::memcpy(&h, qh + 2 * t, 2);
#endif
    STOKE_KQ_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int k = 2 * t + e;
      const uint32_t a = (lo >> (8 * e)) & 0xFFu, b = (hi >> (8 * e)) & 0xFFu, c = (h >> (8 * e)) & 0xFFu;
      // The 6-bit code q through CodeToFloat, the bias taking the 32 off: q − 32 exactly.
      constexpr float kBias = kMagic + 32.f;
      acc[0] += CodeToFloat((a & 0xF) | ((c & 3) << 4), kBias) * xg[0][k];
      acc[1] += CodeToFloat((b & 0xF) | (((c >> 2) & 3) << 4), kBias) * xg[1][k];
      acc[2] += CodeToFloat((a >> 4) | (((c >> 4) & 3) << 4), kBias) * xg[2][k];
      acc[3] += CodeToFloat((b >> 4) | (((c >> 6) & 3) << 4), kBias) * xg[3][k];
    }
  }
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + kQ6KScales + 8 * n + l0 / 16);
  float s = 0.f;
  STOKE_KQ_UNROLL
  for (int g = 0; g < 4; ++g) s += static_cast<float>(sc[2 * g]) * acc[g];
  return LoadHalfBits(blk + kQ6KD) * s;
}

// ---- int8 activations: the CPU engine's numerics (kernels/cpu/qdot.h) and llama.cpp's ----
// Each 32-value block of x is quantised as cpu::QuantizeActsRow does: d = amax / 127, q = rne(x · 127 / amax)
// (0 where amax is 0), and a weight block's dot with it is an exact integer sum, scaled once. A lane holds
// part of a 32-block (Q4_K 16 values, Q6_K 8), so the caller reduces amax over the lanes sharing the block
// first.

// Four signed bytes of a times four of b, plus c (the device's dp4a).
STOKE_KQ_FN int Dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int e = 0; e < 4; ++e) {
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * e))) *
         static_cast<int>(static_cast<int8_t>(b >> (8 * e)));
  }
  return c;
#endif
}

STOKE_KQ_FN float AbsMax(const float* x, int n) {
  float m = 0.f;
  for (int i = 0; i < n; ++i) m = fmaxf(m, fabsf(x[i]));
  return m;
}

STOKE_KQ_FN float ActScale(float amax) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(amax, 127.f);
#else
  return amax / 127.0f;
#endif
}

// x[0, kN) of a 32-block whose |max| is amax, quantised into kN / 4 words of int8 (little-endian); returns Σ
// q.
template <int kN>
STOKE_KQ_FN int QuantizeActs(const float* x, float amax, uint32_t (&q)[kN / 4]) {
#if defined(__CUDA_ARCH__)
  const float id = amax != 0.f ? __fdiv_rn(127.f, amax) : 0.f;
#else
  const float id = amax != 0.f ? 127.0f / amax : 0.f;
#endif
  int sum = 0;
  STOKE_KQ_UNROLL
  for (int w = 0; w < kN / 4; ++w) {
    uint32_t word = 0;
    STOKE_KQ_UNROLL
    for (int e = 0; e < 4; ++e) {
#if defined(__CUDA_ARCH__)
      const int v = __float2int_rn(__fmul_rn(x[4 * w + e], id));
#else
      const int v = static_cast<int>(std::nearbyint(x[4 * w + e] * id));
#endif
      sum += v;
      word |= (static_cast<uint32_t>(v) & 0xFFu) << (8 * e);
    }
    q[w] = word;
  }
  return sum;
}

// Q4_K part p against int8 activations: qa / qc the codes of xa / xb (Q4KPartA), da / dc their blocks'
// scales, sa / sc their codes' sums over this lane's 16 values. Σ over the part of d·sc·q·x − dmin·mn·x with
// x = d_x·q_x: d_x · (d·sc · Σ q·q_x − dmin·mn · Σ q_x) per sub-block, the integer sums exact.
STOKE_KQ_FN float Q4KPartDotQ8(const uint32_t (&head)[4], const uint32_t (&qs)[4], int p,
                               const uint32_t (&qa)[4], const uint32_t (&qc)[4], float da, float dc, int sa,
                               int sc) {
  int ia = 0, ic = 0;
  STOKE_KQ_UNROLL
  for (int w = 0; w < 4; ++w) {
    ia = Dp4a(qs[w] & 0x0F0F0F0Fu, qa[w], ia);
    ic = Dp4a((qs[w] >> 4) & 0x0F0F0F0Fu, qc[w], ic);
  }
  const Q4KPartScales h = Q4KHeadScales(head, p);
  // The weight blocks' scales and offsets exactly as the CPU forms them (11-bit x 6-bit products).
  const float wa = MulRn(h.d, static_cast<float>(h.sc_a)), wb = MulRn(h.d, static_cast<float>(h.sc_b));
  const float oa = MulRn(h.dmin, static_cast<float>(h.mn_a)), ob = MulRn(h.dmin, static_cast<float>(h.mn_b));
  return da * (wa * static_cast<float>(ia) - oa * static_cast<float>(sa)) +
         dc * (wb * static_cast<float>(ic) - ob * static_cast<float>(sc));
}

// Q6_K part p against int8 activations: qx[g] the codes of xg[g] (Q6KPartX), dx[g] their blocks' scales and
// sx[g] the codes' sums over this lane's 8 values. d · Σ_g d_x,g · sc_g · (Σ q·q_x − 32·Σ q_x), q the
// unsigned 6-bit code (so q − 32 needs no byte arithmetic).
STOKE_KQ_FN float Q6KPartDotQ8(const uint8_t* blk, int p, const uint32_t (&qx)[4][2], const float (&dx)[4],
                               const int (&sx)[4]) {
  const int n = p / 4, l0 = 8 * (p % 4);
  const uint8_t* ql = blk + 64 * n + l0;
  const uint8_t* qh = blk + kQ6KQh + 32 * n + l0;
  uint32_t lo[2], hi[2], h[2];  // bytes l0 .. l0 + 8 of ql, ql + 32 and qh (2-byte aligned: 16-bit loads)
  STOKE_KQ_UNROLL
  for (int w = 0; w < 2; ++w) {
    uint16_t u[6];
#if defined(__CUDA_ARCH__)
    u[0] = *reinterpret_cast<const uint16_t*>(ql + 4 * w);
    u[1] = *reinterpret_cast<const uint16_t*>(ql + 4 * w + 2);
    u[2] = *reinterpret_cast<const uint16_t*>(ql + 32 + 4 * w);
    u[3] = *reinterpret_cast<const uint16_t*>(ql + 32 + 4 * w + 2);
    u[4] = *reinterpret_cast<const uint16_t*>(qh + 4 * w);
    u[5] = *reinterpret_cast<const uint16_t*>(qh + 4 * w + 2);
#else
    std::memcpy(&u[0], ql + 4 * w, 4);
    std::memcpy(&u[2], ql + 32 + 4 * w, 4);
    std::memcpy(&u[4], qh + 4 * w, 4);
#endif
    lo[w] = u[0] | (static_cast<uint32_t>(u[1]) << 16);
    hi[w] = u[2] | (static_cast<uint32_t>(u[3]) << 16);
    h[w] = u[4] | (static_cast<uint32_t>(u[5]) << 16);
  }
  const int8_t* scales = reinterpret_cast<const int8_t*>(blk + kQ6KScales + 8 * n + l0 / 16);
  float s = 0.f;
  STOKE_KQ_UNROLL
  for (int g = 0; g < 4; ++g) {
    int acc = 0;
    STOKE_KQ_UNROLL
    for (int w = 0; w < 2; ++w) {
      const uint32_t low = ((g & 1) ? hi[w] : lo[w]) >> ((g & 2) ? 4 : 0);
      const uint32_t q = (low & 0x0F0F0F0Fu) | (((h[w] >> (2 * g)) & 0x03030303u) << 4);
      acc = Dp4a(q, qx[g][w], acc);
    }
    s += dx[g] * static_cast<float>(static_cast<int>(scales[2 * g]) * (acc - 32 * sx[g]));
  }
  return LoadHalfBits(blk + kQ6KD) * s;
}

}  // namespace stoke::kquant
