#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
  __m256 vm = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float m = _mm_cvtss_f32(m4);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// e^x for 8 lanes: 2^k · e^r with k = round(x / ln 2), r = x - k ln 2 (two-part ln 2), and Cephes' expf
// polynomial for e^r (~1 ulp). x > 88 gives +inf, x < -87.33 gives 0 (fp32 denormal range flushed), NaN
// stays.
inline __m256 Exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.33654f);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));  // k in [-126, 127]: a normal power of two
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
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
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 neg = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp(_mm256_xor_ps(g, neg));  // exp(-g); inf for g < -88: g / inf = -0
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void GeluErf(float* x, int64_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
  const __m256 inv_sqrt2 = _mm256_set1_ps(0.70710678118654752440f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // Numerical Recipes' erfc (Chebyshev fit, relative error < 1.2e-7 for every z >= 0):
  //   erfc(z) = t · exp(-z² + P(t)), t = 1 / (1 + z/2).
  static constexpr float kP[10] = {0.17087277f,  -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                   -0.18628806f, 0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 z = _mm256_and_ps(_mm256_mul_ps(v, inv_sqrt2), abs_mask);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(z, half, one));
    __m256 p = _mm256_set1_ps(kP[0]);
    for (int j = 1; j < 10; ++j) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kP[j]));
    const __m256 erfc = _mm256_mul_ps(t, Exp(_mm256_fnmadd_ps(z, z, p)));
    // 1 + erf(v/√2) = 2 - erfc(z) for v >= 0, erfc(z) for v < 0 (no cancellation in the negative tail).
    const __m256 onep = _mm256_blendv_ps(_mm256_sub_ps(two, erfc), erfc, v);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), onep));
  }
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
  for (; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void SoftmaxInPlace(float* x, int64_t n) {
  const float m = Max(x, n);
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = Hsum(acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / sum;
}

void LogSoftmax(const float* x, int64_t n, float* out) {
  const float m = Max(x, n);
  // Accumulate in double: over a 50k-150k vocabulary an fp32 sum would lose ~1e-5 relative.
  const __m256 vm = _mm256_set1_ps(m);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(acc0, acc1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - m));
  const float lse = m + static_cast<float>(std::log(sum));
  for (i = 0; i < n; ++i) out[i] = x[i] - lse;
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
