#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "base/half.h"

namespace stoke::cpu {

uint8_t Fp8E4M3FromFloat(float x) {
  if (std::isnan(x)) return 0x7f;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const float a = std::fabs(x);
  uint8_t code;
  if (a < 0.015625f) {  // below 2^-6, the smallest normal: subnormals m · 2^-9, m = 0..8 (8 = 2^-6 itself)
    code = static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  } else {
    uint32_t abits = bits & 0x7fffffffu;
    abits += 0x7ffffu + ((abits >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
    const int exp = static_cast<int>(abits >> 23) - 127 + 7;
    const int mant = static_cast<int>((abits >> 20) & 7u);
    code = (exp > 15 || (exp == 15 && mant == 7)) ? 0x7e : static_cast<uint8_t>(exp << 3 | mant);
  }
  return static_cast<uint8_t>(sign | code);
}

const std::array<float, 256>& Fp8E4M3Table() {
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  return kTable;
}

float Fp8E4M3ToFloat(uint8_t b) {
  const int exp = (b >> 3) & 15, mant = b & 7;
  float v;
  if (exp == 15 && mant == 7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  }
  return (b & 0x80) ? -v : v;
}

int KvElementBytes(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBf16:
      return 2;
    case KvCacheDtype::kInt8:
    case KvCacheDtype::kFp8:
      return 1;
    case KvCacheDtype::kAuto:
      break;
  }
  return 0;
}

float QuantizeKvRow(const float* x, int n, KvCacheDtype d, uint8_t* out) {
  if (d == KvCacheDtype::kBf16) {
    for (int i = 0; i < n; ++i) {
      const uint16_t b = Fp32ToBf16(x[i]);
      std::memcpy(out + 2 * i, &b, 2);
    }
    return 1.0f;
  }
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    std::memset(out, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  if (d == KvCacheDtype::kInt8) {
    const float inv = 127.0f / amax;
    for (int i = 0; i < n; ++i) {
      const float r = std::nearbyint(x[i] * inv);
      out[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f)));
    }
    return amax / 127.0f;
  }
  const float inv = 448.0f / amax;
  for (int i = 0; i < n; ++i) out[i] = Fp8E4M3FromFloat(x[i] * inv);
  return amax / 448.0f;
}

void DequantizeKvRow(const uint8_t* q, int n, float scale, KvCacheDtype d, float* out) {
  switch (d) {
    case KvCacheDtype::kBf16:
      for (int i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, q + 2 * i, 2);
        out[i] = Bf16ToFp32(b);
      }
      return;
    case KvCacheDtype::kInt8:
      for (int i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
      return;
    case KvCacheDtype::kFp8: {
      const std::array<float, 256>& table = Fp8E4M3Table();
      for (int i = 0; i < n; ++i) out[i] = table[q[i]] * scale;
      return;
    }
    case KvCacheDtype::kAuto:
      break;
  }
  std::fill(out, out + n, 0.0f);
}

void WriteKv(const QuantPagedKvLayer& kv, const float* k, const float* v, const int32_t* slots,
             int64_t tokens) {
  const int hd = kv.head_dim, nkv = kv.num_kv_heads;
  const int64_t eb = KvElementBytes(kv.dtype);
  const bool scaled = KvCacheDtypeIsQuantized(kv.dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int h = 0; h < nkv; ++h) {
      const int64_t row = static_cast<int64_t>(slots[t]) * nkv + h;  // (slot, kv head)
      const int64_t src = (t * nkv + h) * hd;
      const float ks = QuantizeKvRow(k + src, hd, kv.dtype, kv.k + row * hd * eb);
      const float vs = QuantizeKvRow(v + src, hd, kv.dtype, kv.v + row * hd * eb);
      if (scaled) {
        kv.k_scale[row] = ks;
        kv.v_scale[row] = vs;
      }
    }
  }
}

}  // namespace stoke::cpu
