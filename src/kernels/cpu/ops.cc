#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

// Sum of 8 lanes; a fixed order so results do not depend on the caller.
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float Sum(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  float s = Hsum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

float Max(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

}  // namespace

float Dot(const float* x, const float* y, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc0);
  float s = Hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float ms = Dot(xr, xr, dim) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(ms + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

void LayerNorm(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t dim, float eps,
               float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    const float mean = Sum(xr, dim) / static_cast<float>(dim);
    // Two passes (mean, then centred squares): no cancellation when |mean| >> stddev.
    __m256 acc = _mm256_setzero_ps();
    const __m256 vm = _mm256_set1_ps(mean);
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m256 c = _mm256_sub_ps(_mm256_loadu_ps(xr + i), vm);
      acc = _mm256_fmadd_ps(c, c, acc);
    }
    float var = Hsum(acc);
    for (; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < dim; ++j) o[j] = (xr[j] - mean) * inv * gamma[j] + beta[j];
  }
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void AddBias(float* x, const float* bias, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * dim;
    for (int64_t i = 0; i < dim; ++i) xr[i] += bias[i];
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void GeluErf(float* x, int64_t n) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void SoftmaxInPlace(float* x, int64_t n) {
  const float m = Max(x, n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void LogSoftmax(const float* x, int64_t n, float* out) {
  const float m = Max(x, n);
  // Accumulate in double: over a 50k-150k vocabulary the fp32 sum would lose ~1e-4 relative.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - m));
  const float lse = m + static_cast<float>(std::log(sum));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
}

void RopeNeox(float* x, const int32_t* positions, int64_t tokens, int heads, int head_dim,
              const float* inv_freq) {
  const int half = head_dim / 2;
  // cos/sin per (token, i) are shared by all heads; head_dim <= 512 in every model we serve.
  float cs[256], sn[256];
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int i0 = 0; i0 < half; i0 += 256) {
      const int len = std::min(256, half - i0);
      for (int i = 0; i < len; ++i) {
        const float angle = pos * inv_freq[i0 + i];
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      for (int h = 0; h < heads; ++h) {
        float* a = x + (t * heads + h) * head_dim + i0;
        float* b = a + half;
        for (int i = 0; i < len; ++i) {
          const float x0 = a[i], x1 = b[i];
          a[i] = x0 * cs[i] - x1 * sn[i];
          b[i] = x1 * cs[i] + x0 * sn[i];
        }
      }
    }
  }
}

Status EmbeddingLookup(const void* table, DType t, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out) {
  ASSIGN_OR_RETURN(const size_t row_bytes, RowBytes(t, dim));
  const auto* base = static_cast<const uint8_t*>(table);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab) {
      return InvalidArgumentError(
          "EmbeddingLookup: token id {} at position {} is outside the vocabulary [0, {})", id, i, vocab);
    }
    const uint8_t* row = base + static_cast<size_t>(id) * row_bytes;
    if (t == DType::kF32) {
      std::memcpy(out + i * dim, row, dim * sizeof(float));
    } else {
      RETURN_IF_ERROR(DequantizeRow(t, row, out + i * dim, dim).WithContext("EmbeddingLookup"));
    }
  }
  return OkStatus();
}

}  // namespace stoke::cpu
