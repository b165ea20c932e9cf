// Dequantisation follows ggml-quants.c (dequantize_row_*) operation for operation so results are bit-exact:
// this file is compiled with -ffp-contract=off (see CMakeLists.txt) so `d * q + m` is never fused into an
// FMA. Blocks are read through byte pointers and memcpy because tensors in a file with a small
// general.alignment may start at any address.
#include "kernels/cpu/quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "base/half.h"
#include "kernels/cpu/kv_quant.h"

namespace stoke::cpu {
namespace {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float LoadHalf(const uint8_t* p) {
  return Fp16ToFp32(LoadU16(p));
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes (ggml's get_scale_min_k4).
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

void DequantQ4_0(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ4_0), y += kQK) {
    const float d = LoadHalf(x);
    const uint8_t* qs = x + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

void DequantQ4_1(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ4_1), y += kQK) {
    const float d = LoadHalf(x);
    const float m = LoadHalf(x + 2);
    const uint8_t* qs = x + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      const int x0 = qs[j] & 0x0F;
      const int x1 = qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

void DequantQ5_0(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ5_0), y += kQK) {
    const float d = LoadHalf(x);
    uint32_t qh;
    std::memcpy(&qh, x + 2, 4);
    const uint8_t* qs = x + 6;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      const int32_t x0 = ((qs[j] & 0x0F) | xh0) - 16;
      const int32_t x1 = ((qs[j] >> 4) | xh1) - 16;
      y[j] = x0 * d;
      y[j + kQK / 2] = x1 * d;
    }
  }
}

void DequantQ5_1(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ5_1), y += kQK) {
    const float d = LoadHalf(x);
    const float m = LoadHalf(x + 2);
    uint32_t qh;
    std::memcpy(&qh, x + 4, 4);
    const uint8_t* qs = x + 8;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint8_t xh0 = ((qh >> (j + 0)) << 4) & 0x10;
      const uint8_t xh1 = ((qh >> (j + 12))) & 0x10;
      const int x0 = (qs[j] & 0x0F) | xh0;
      const int x1 = (qs[j] >> 4) | xh1;
      y[j] = x0 * d + m;
      y[j + kQK / 2] = x1 * d + m;
    }
  }
}

void DequantQ8_0(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ8_0), y += kQK) {
    const float d = LoadHalf(x);
    const int8_t* qs = reinterpret_cast<const int8_t*>(x + 2);
    for (int j = 0; j < kQK; ++j) y[j] = qs[j] * d;
  }
}

void DequantQ4_K(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ4_K)) {
    const float d = LoadHalf(x);
    const float min = LoadHalf(x + 2);
    const uint8_t* scales = x + 4;
    const uint8_t* q = x + 4 + kKScaleBytes;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      ScaleMinK4(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      ScaleMinK4(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void DequantQ6_K(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += sizeof(BlockQ6_K)) {
    const uint8_t* ql = x;
    const uint8_t* qh = x + kQK_K / 2;
    const int8_t* sc = reinterpret_cast<const int8_t*>(x + kQK_K / 2 + kQK_K / 4);
    const float d = LoadHalf(x + kQK_K / 2 + kQK_K / 4 + kQK_K / 16);
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

inline const uint8_t* Bytes(const void* p) {
  return static_cast<const uint8_t*>(p);
}

}  // namespace

void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t n) {
  DequantQ4_0(Bytes(x), y, n / kQK);
}
void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t n) {
  DequantQ4_1(Bytes(x), y, n / kQK);
}
void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n) {
  DequantQ5_0(Bytes(x), y, n / kQK);
}
void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t n) {
  DequantQ5_1(Bytes(x), y, n / kQK);
}
void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  DequantQ8_0(Bytes(x), y, n / kQK);
}
void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t n) {
  DequantQ4_K(Bytes(x), y, n / kQK_K);
}
void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t n) {
  DequantQ6_K(Bytes(x), y, n / kQK_K);
}

Status DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  const DTypeInfo& info = GetDTypeInfo(t);
  if (n < 0 || n % info.block_elems != 0) {
    return InvalidArgumentError("DequantizeRow: {} values of {} is not a whole number of {}-value blocks", n,
                                info.name, info.block_elems);
  }
  const uint8_t* x = Bytes(src);
  const int64_t nb = n / info.block_elems;
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, x, static_cast<size_t>(n) * 4);
      return OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadHalf(x + 2 * i);
      return OkStatus();
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(LoadU16(x + 2 * i));
      return OkStatus();
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, x + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return OkStatus();
    case DType::kQ4_0:
      DequantQ4_0(x, dst, nb);
      return OkStatus();
    case DType::kQ4_1:
      DequantQ4_1(x, dst, nb);
      return OkStatus();
    case DType::kQ5_0:
      DequantQ5_0(x, dst, nb);
      return OkStatus();
    case DType::kQ5_1:
      DequantQ5_1(x, dst, nb);
      return OkStatus();
    case DType::kQ8_0:
      DequantQ8_0(x, dst, nb);
      return OkStatus();
    case DType::kQ4_K:
      DequantQ4_K(x, dst, nb);
      return OkStatus();
    case DType::kQ6_K:
      DequantQ6_K(x, dst, nb);
      return OkStatus();
    case DType::kF8E4M3:  // unscaled: the checkpoint's weight_scale is the loader's to apply
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(x[i]);
      return OkStatus();
    default:
      return InvalidArgumentError("DequantizeRow: {} is not a floating-point or quantised type", info.name);
  }
}

// ---- Reference quantisers (ggml's quantize_row_*_ref). Finite input expected.
// -------------------------------

namespace {

inline void StoreU16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

// ggml converts float -> int8_t with a C cast (truncation toward zero) and then applies MIN(15, .).
inline uint8_t TruncToNibble(float v, int max) {
  return static_cast<uint8_t>(std::min(max, static_cast<int>(static_cast<int8_t>(v))));
}

}  // namespace

void QuantizeRowQ8_0(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, y += sizeof(BlockQ8_0)) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(y, Fp32ToFp16(d));
    for (int j = 0; j < kQK; ++j) {
      const float x0 = x[j] * id;
      y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x0)));
    }
  }
}

void QuantizeRowQ4_0(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, y += sizeof(BlockQ4_0)) {
    float amax = 0.0f;  // largest magnitude, and the signed value that has it
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(y, Fp32ToFp16(d));
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[kQK / 2 + j] * id;
      y[2 + j] = TruncToNibble(x0 + 8.5f, 15) | (TruncToNibble(x1 + 8.5f, 15) << 4);
    }
  }
}

void QuantizeRowQ4_1(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, y += sizeof(BlockQ4_1)) {
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(y, Fp32ToFp16(d));
    StoreU16(y + 2, Fp32ToFp16(min));
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[kQK / 2 + j] - min) * id;
      y[4 + j] = TruncToNibble(x0 + 0.5f, 15) | (TruncToNibble(x1 + 0.5f, 15) << 4);
    }
  }
}

void QuantizeRowQ5_0(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, y += sizeof(BlockQ5_0)) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(y, Fp32ToFp16(d));
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[kQK / 2 + j] * id;
      const uint8_t xi0 = TruncToNibble(x0 + 16.5f, 31);
      const uint8_t xi1 = TruncToNibble(x1 + 16.5f, 31);
      y[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);  // 5th bit of value j at bit j, of value j+16 at bit j+16
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y + 2, &qh, 4);
  }
}

void QuantizeRowQ5_1(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, y += sizeof(BlockQ5_1)) {
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(y, Fp32ToFp16(d));
    StoreU16(y + 2, Fp32ToFp16(min));
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[kQK / 2 + j] - min) * id;
      // ggml casts straight to uint8_t here (no MIN): x0 + 0.5 <= 31.5 for finite input.
      const uint8_t xi0 = static_cast<uint8_t>(x0 + 0.5f);
      const uint8_t xi1 = static_cast<uint8_t>(x1 + 0.5f);
      y[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y + 4, &qh, 4);
  }
}

namespace {

int RoundClamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

}  // namespace

void QuantizeRowQ4_KSimple(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, y += sizeof(BlockQ4_K)) {
    float scale[8], mins[8], max_scale = 0.f, max_min = 0.f;
    for (int s = 0; s < 8; ++s) {
      float lo = 0.f, hi = 0.f;
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[32 * s + l]);
        hi = std::max(hi, x[32 * s + l]);
      }
      scale[s] = (hi - lo) / 15.f;
      mins[s] = -lo;
      max_scale = std::max(max_scale, scale[s]);
      max_min = std::max(max_min, mins[s]);
    }
    const uint16_t d_bits = Fp32ToFp16(max_scale / 63.f), dmin_bits = Fp32ToFp16(max_min / 63.f);
    const float d = Fp16ToFp32(d_bits), dmin = Fp16ToFp32(dmin_bits);
    StoreU16(y, d_bits);
    StoreU16(y + 2, dmin_bits);
    uint8_t* sc = y + 4;
    std::memset(sc, 0, kKScaleBytes);
    uint8_t q[kQK_K];
    for (int s = 0; s < 8; ++s) {
      const int ls = d > 0.f ? RoundClamp(scale[s] / d, 0, 63) : 0;
      const int lm = dmin > 0.f ? RoundClamp(mins[s] / dmin, 0, 63) : 0;
      // The inverse of ScaleMinK4 (ggml's packing of 8 x (6-bit scale, 6-bit min) into 12 bytes).
      if (s < 4) {
        sc[s] = static_cast<uint8_t>(ls);
        sc[s + 4] = static_cast<uint8_t>(lm);
      } else {
        sc[s + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
        sc[s - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        sc[s] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
      const float step = d * ls, off = dmin * lm;
      for (int l = 0; l < 32; ++l) {
        q[32 * s + l] =
            static_cast<uint8_t>(step > 0.f ? RoundClamp((x[32 * s + l] + off) / step, 0, 15) : 0);
      }
    }
    uint8_t* qs = y + 4 + kKScaleBytes;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l)
        qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
  }
}

void QuantizeRowQ6_KSimple(const float* x, void* dst, int64_t n) {
  uint8_t* y = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, y += sizeof(BlockQ6_K)) {
    float scale[16], max_scale = 0.f;
    for (int s = 0; s < 16; ++s) {
      float amax = 0.f;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * s + l]));
      scale[s] = amax / 31.f;
      max_scale = std::max(max_scale, scale[s]);
    }
    const uint16_t d_bits = Fp32ToFp16(max_scale / 127.f);
    const float d = Fp16ToFp32(d_bits);
    uint8_t* ql = y;
    uint8_t* qh = y + kQK_K / 2;
    int8_t* sc = reinterpret_cast<int8_t*>(y + kQK_K / 2 + kQK_K / 4);
    StoreU16(y + kQK_K / 2 + kQK_K / 4 + kQK_K / 16, d_bits);
    std::memset(y, 0, kQK_K / 2 + kQK_K / 4);
    for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(d > 0.f ? RoundClamp(scale[s] / d, 0, 127) : 0);
    for (int v = 0; v < kQK_K; ++v) {
      const float step = d * sc[v / 16];
      const int q = (step > 0.f ? RoundClamp(x[v] / step, -32, 31) : 0) + 32;
      // Value v = 128 h + 32 g + l: low nibble in ql[64 h + l + 32 (g & 1)] (high half of the byte for g >=
      // 2), high two bits at bit 2 g of qh[32 h + l] (DequantQ6_K's layout).
      const int h = v / 128, g = (v % 128) / 32, l = v % 32;
      uint8_t& lo = ql[64 * h + l + 32 * (g & 1)];
      lo |= static_cast<uint8_t>((q & 0xF) << (g >= 2 ? 4 : 0));
      qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * g));
    }
  }
}

}  // namespace stoke::cpu
