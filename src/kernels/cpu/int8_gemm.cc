#include "kernels/cpu/int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>  // AVX2, as every CPU kernel here (the build targets x86-64-v3 or the host)

namespace stoke::cpu {
namespace {

// 127 · 127 · k must stay below 2³¹.
constexpr int64_t kMaxK = (int64_t{1} << 31) / (127 * 127) - 1;

}  // namespace

void QuantizeInt8Static(const float* x, int64_t n, float inv_scale, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    float r = std::nearbyint(x[i] * inv_scale);
    if (std::isnan(r)) r = 0.0f;
    q[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
}

void QuantizeInt8Columns(const float* x, int64_t rows, int64_t cols, const float* inv_scale, int8_t* q) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      float v = std::nearbyint(x[r * cols + j] * inv_scale[j]);
      if (std::isnan(v)) v = 0.0f;
      q[r * cols + j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

void QuantizeInt8PerToken(const float* x, int64_t rows, int64_t cols, const float* col_inv, float multiplier,
                          bool centred, int8_t* q, float* scale, float* mid) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    int8_t* qr = q + r * cols;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      const float y = col_inv != nullptr ? xr[j] * col_inv[j] : xr[j];
      lo = j == 0 ? y : std::min(lo, y);
      hi = j == 0 ? y : std::max(hi, y);
    }
    const float m = centred ? 0.5f * (lo + hi) : 0.0f;
    const float s = centred ? (hi - lo) / 254.0f * multiplier : std::max(-lo, hi) / 127.0f * multiplier;
    if (!std::isfinite(m) || !std::isfinite(s)) {
      std::memset(qr, 0, static_cast<size_t>(cols));
      scale[r] = 0.0f;
      mid[r] = 0.0f;
      continue;
    }
    scale[r] = s;
    mid[r] = m;
    if (!(s > 0.0f)) {  // a constant row: every value is m
      std::memset(qr, 0, static_cast<size_t>(cols));
      continue;
    }
    const float inv = 1.0f / s;
    for (int64_t j = 0; j < cols; ++j) {
      const float y = col_inv != nullptr ? xr[j] * col_inv[j] : xr[j];
      const float v = std::nearbyint((y - m) * inv);
      qr[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

float QuantizeInt8Row(const float* w, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    std::memset(q, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  QuantizeInt8Static(w, n, 127.0f / amax, q);
  return amax / 127.0f;
}

namespace {

int32_t HorizontalSum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 16 int8 weights sign-extended to int16 (vpmovsxbw): the weights stay int8 in memory, so a small batch does
// not pay for widening whole matrices.
inline __m256i LoadWidened(const int8_t* w) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}

// acc[r][c] = x16[r] · w[c] over kv values (a multiple of 16), int16 activation rows and int8 weight rows, 4
// rows x 2 columns at once: each 16-value chunk is loaded once and multiplied into its accumulators (vpmaddwd:
// pairs of int16 products summed into int32, exact for int8 inputs). Written out, not as loops over arrays:
// the accumulators must stay in registers (GCC at -O2 kept an array of them on the stack: 6x slower).
void Kernel4x2(const int16_t* x0, const int16_t* x1, const int16_t* x2, const int16_t* x3, const int8_t* w0,
               const int8_t* w1, int64_t kv, int32_t acc[4][2]) {
  __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
          a31 = a00;
  for (int64_t p = 0; p < kv; p += 16) {
    const __m256i b0 = LoadWidened(w0 + p);
    const __m256i b1 = LoadWidened(w1 + p);
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + p));
    a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(x, b0));
    a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(x, b1));
    x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1 + p));
    a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(x, b0));
    a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(x, b1));
    x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x2 + p));
    a20 = _mm256_add_epi32(a20, _mm256_madd_epi16(x, b0));
    a21 = _mm256_add_epi32(a21, _mm256_madd_epi16(x, b1));
    x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x3 + p));
    a30 = _mm256_add_epi32(a30, _mm256_madd_epi16(x, b0));
    a31 = _mm256_add_epi32(a31, _mm256_madd_epi16(x, b1));
  }
  acc[0][0] = HorizontalSum(a00), acc[0][1] = HorizontalSum(a01);
  acc[1][0] = HorizontalSum(a10), acc[1][1] = HorizontalSum(a11);
  acc[2][0] = HorizontalSum(a20), acc[2][1] = HorizontalSum(a21);
  acc[3][0] = HorizontalSum(a30), acc[3][1] = HorizontalSum(a31);
}

// The same for one row.
void Kernel1x2(const int16_t* x0, const int8_t* w0, const int8_t* w1, int64_t kv, int32_t acc[2]) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  for (int64_t p = 0; p < kv; p += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + p));
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(x, LoadWidened(w0 + p)));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(x, LoadWidened(w1 + p)));
  }
  acc[0] = HorizontalSum(a0), acc[1] = HorizontalSum(a1);
}

void Widen(const int8_t* src, int64_t n, int16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace

Status MatMulInt8(const int8_t* x, int64_t m, int64_t k, const int8_t* w, int64_t n, int32_t* acc,
                  ThreadPool& pool) {
  if (m < 0 || n < 0 || k < 0)
    return InvalidArgumentError("MatMulInt8: negative shape [{}, {}] x [{}, {}]", m, k, n, k);
  if (k > kMaxK)
    return InvalidArgumentError("MatMulInt8: k = {} could overflow the int32 sum (at most {})", k, kMaxK);
  // The activations widened to int16 once (O(m k), against the product's O(m n k)), the weights as they are
  // loaded; then tiles of 4 rows x 2 columns (8 accumulators, 4 + 2 operand registers: 14 of AVX2's 16) over
  // the first kv values (a multiple of 16), the rest of k added in scalar. Tasks are blocks of 32 rows x 64
  // columns: 32 int16 activation rows of MiniLM's FFN width (96 KiB) stay in L2 while the block's weight rows
  // stream past. Every sum is an exact integer, so the result is the scalar loop's bit for bit.
  const int64_t kv = k / 16 * 16;
  std::vector<int16_t> x16(static_cast<size_t>(m * k));
  pool.ParallelFor(m, 64, [&](int64_t r0, int64_t r1) { Widen(x + r0 * k, (r1 - r0) * k, x16.data() + r0 * k); });
  constexpr int64_t kRowBlock = 32, kColBlock = 64;
  const int64_t row_blocks = (m + kRowBlock - 1) / kRowBlock, col_blocks = (n + kColBlock - 1) / kColBlock;
  pool.ParallelFor(row_blocks * col_blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / col_blocks) * kRowBlock, j0 = (t % col_blocks) * kColBlock;
      const int64_t i1 = std::min(m, i0 + kRowBlock), j1 = std::min(n, j0 + kColBlock);
      auto tail = [&](int64_t i, int64_t j, int32_t v) {  // the last k % 16 values
        for (int64_t p = kv; p < k; ++p) v += int32_t{x16[i * k + p]} * w[j * k + p];
        acc[i * n + j] = v;
      };
      for (int64_t j = j0; j < j1; j += 2) {
        const int cols = j + 1 < j1 ? 2 : 1;
        const int8_t* w0 = w + j * k;
        const int8_t* w1 = w + (j + cols - 1) * k;
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4) {
          const int16_t* xr = x16.data() + i * k;
          int32_t s[4][2];
          Kernel4x2(xr, xr + k, xr + 2 * k, xr + 3 * k, w0, w1, kv, s);
          for (int r = 0; r < 4; ++r)
            for (int c = 0; c < cols; ++c) tail(i + r, j + c, s[r][c]);
        }
        for (; i < i1; ++i) {
          int32_t s[2];
          Kernel1x2(x16.data() + i * k, w0, w1, kv, s);
          for (int c = 0; c < cols; ++c) tail(i, j + c, s[c]);
        }
      }
    }
  });
  return OkStatus();
}

void DequantizeInt8Gemm(const int32_t* acc, int64_t m, int64_t n, float x_scale, const float* w_scale,
                        const float* bias, float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = static_cast<float>(acc[i * n + j]) * (x_scale * w_scale[j]);
      y[i * n + j] = bias != nullptr ? v + bias[j] : v;
    }
  }
}

void DequantizeInt8GemmPerToken(const int32_t* acc, int64_t m, int64_t n, const float* x_scale,
                                const float* x_mid, const float* w_scale, const float* w_sum,
                                const float* bias, float* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = static_cast<float>(acc[i * n + j]) * (x_scale[i] * w_scale[j]) + x_mid[i] * w_sum[j];
      y[i * n + j] = bias != nullptr ? v + bias[j] : v;
    }
  }
}

}  // namespace stoke::cpu
