#include "kernels/cpu/int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace stoke::cpu {
namespace {

// 127 · 127 · k must stay below 2³¹.
constexpr int64_t kMaxK = (int64_t{1} << 31) / (127 * 127) - 1;

// The compiler vectorises this (x86-64-v3: vpmovsxbw + vpmaddwd).
int32_t DotInt8(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t s = 0;
  for (int64_t i = 0; i < k; ++i) s += static_cast<int16_t>(a[i]) * static_cast<int16_t>(b[i]);
  return s;
}

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

Status MatMulInt8(const int8_t* x, int64_t m, int64_t k, const int8_t* w, int64_t n, int32_t* acc,
                  ThreadPool& pool) {
  if (m < 0 || n < 0 || k < 0)
    return InvalidArgumentError("MatMulInt8: negative shape [{}, {}] x [{}, {}]", m, k, n, k);
  if (k > kMaxK)
    return InvalidArgumentError("MatMulInt8: k = {} could overflow the int32 sum (at most {})", k, kMaxK);
  // Tiles of 4 rows x 64 columns: the 64 weight rows (64 k bytes) stay in L2 while 4 activation rows use
  // them.
  constexpr int64_t kRows = 4, kCols = 64;
  const int64_t row_tiles = (m + kRows - 1) / kRows, col_tiles = (n + kCols - 1) / kCols;
  pool.ParallelFor(row_tiles * col_tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = (t / col_tiles) * kRows, j0 = (t % col_tiles) * kCols;
      const int64_t i1 = std::min(m, i0 + kRows), j1 = std::min(n, j0 + kCols);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) acc[i * n + j] = DotInt8(x + i * k, w + j * k, k);
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
