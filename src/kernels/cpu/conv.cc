#include "kernels/cpu/conv.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

namespace stoke::cpu {
namespace {

inline float Act(const ActivationParams& a, float v) {
  switch (a.kind) {
    case Activation::kNone:
      return v;
    case Activation::kRelu:
      return v > 0 ? v : 0;
    case Activation::kClip:
      return std::min(std::max(v, a.lo), a.hi);
    case Activation::kHardSigmoid:
      return std::min(std::max(a.alpha * v + a.beta, 0.0f), 1.0f);
    case Activation::kHardSwish:
      return v * std::min(std::max(v * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
    case Activation::kSigmoid:
      return 1.0f / (1.0f + std::exp(-v));
  }
  return v;
}

// One im2col row per output pixel: for each tap (kh, kw) the in_c/groups channels of group g, zeros where
// the tap falls in the padding. Pixels [p0, p1) of the flattened [batch, out_h, out_w].
void Im2Col(const float* x, const Conv2dShape& s, int64_t g, int64_t p0, int64_t p1, float* col) {
  const int64_t cpg = s.in_c / s.groups;
  const int64_t k = s.kernel_h * s.kernel_w * cpg;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n = p / (s.out_h * s.out_w);
    const int64_t oh = (p / s.out_w) % s.out_h;
    const int64_t ow = p % s.out_w;
    float* row = col + (p - p0) * k;
    for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
      const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
      for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
        const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
        float* dst = row + (kh * s.kernel_w + kw) * cpg;
        if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) {
          std::memset(dst, 0, static_cast<size_t>(cpg) * sizeof(float));
        } else {
          std::memcpy(dst, x + ((n * s.in_h + ih) * s.in_w + iw) * s.in_c + g * cpg,
                      static_cast<size_t>(cpg) * sizeof(float));
        }
      }
    }
  }
}

// Y[rows, ldy-strided] = X[rows, k] . W[n, k]^T, single-threaded sgemm (the pool splits the rows).
void Sgemm(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y,
              static_cast<int>(ldy));
}

// Blocks of output pixels, one pool task each: im2col into the thread's scratch (skipped for a 1x1 stride-1
// unpadded convolution, whose rows are the input's pixels), one sgemm per group writing straight into y's
// rows, then bias + activation while the rows are in cache. Splitting pixels rather than output channels
// keeps every thread busy when a layer has few channels (MobileNet's 16-channel layers).
Status DenseConv(const float* x, const Conv2dShape& s, const float* w, const float* bias,
                 const ActivationParams& act, float* y, ThreadPool& pool) {
  static std::once_flag once;  // our pool splits the work; OpenBLAS threads would compete for the cores
  std::call_once(once, [] { openblas_set_num_threads(1); });
  const int64_t pixels = s.batch * s.out_h * s.out_w;
  const int64_t cpg = s.in_c / s.groups;
  const int64_t opg = s.out_c / s.groups;
  const int64_t k = s.kernel_h * s.kernel_w * cpg;
  const bool direct = s.groups == 1 && s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 &&
                      s.stride_w == 1 && s.pad_top == 0 && s.pad_left == 0 && s.out_h == s.in_h &&
                      s.out_w == s.in_w;
  // One block per thread when the im2col rows fit in ~4 MiB, else as many rows as fit (sgemm wants tall
  // blocks: at 8 rows OpenBLAS ran ResNet-50 at a tenth of its speed); tiny layers stay on one thread.
  const int64_t threads = pixels * k * s.out_c < (int64_t{1} << 16) ? 1 : pool.num_threads();
  int64_t block = (pixels + threads - 1) / threads;
  if (!direct) block = std::min(block, std::max<int64_t>(32, (int64_t{1} << 20) / std::max<int64_t>(k, 1)));
  block = std::max<int64_t>(1, block);
  const int64_t blocks = (pixels + block - 1) / block;
  pool.ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> col;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t p0 = b * block, p1 = std::min(pixels, p0 + block);
      float* yb = y + p0 * s.out_c;
      if (direct) {
        Sgemm(x + p0 * k, p1 - p0, k, w, s.out_c, yb, s.out_c);
      } else {
        if (col.size() < static_cast<size_t>((p1 - p0) * k)) col.resize(static_cast<size_t>((p1 - p0) * k));
        for (int64_t g = 0; g < s.groups; ++g) {
          Im2Col(x, s, g, p0, p1, col.data());
          Sgemm(col.data(), p1 - p0, k, w + g * opg * k, opg, yb + g * opg, s.out_c);
        }
      }
      if (bias != nullptr || act.kind != Activation::kNone) {
        for (int64_t r = 0; r < p1 - p0; ++r) {
          float* row = yb + r * s.out_c;
          if (bias != nullptr) {
            for (int64_t c = 0; c < s.out_c; ++c) row[c] += bias[c];
          }
          ApplyActivation(act, row, s.out_c);
        }
      }
    }
  });
  return OkStatus();
}

// Depthwise: output channel c reads input channel c / mult. Weights [kernel_h, kernel_w, out_c].
void DepthwiseConv(const float* x, const Conv2dShape& s, const float* w, const float* bias,
                   const ActivationParams& act, float* y, ThreadPool& pool) {
  const int64_t mult = s.out_c / s.in_c;
  const int64_t oc = s.out_c;
  pool.ParallelFor(s.batch * s.out_h, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / s.out_h;
      const int64_t oh = r % s.out_h;
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        float* acc = y + ((n * s.out_h + oh) * s.out_w + ow) * oc;
        if (bias != nullptr)
          std::memcpy(acc, bias, static_cast<size_t>(oc) * sizeof(float));
        else
          std::fill(acc, acc + oc, 0.0f);
        for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
          const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
          if (ih < 0 || ih >= s.in_h) continue;
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
            if (iw < 0 || iw >= s.in_w) continue;
            const float* xi = x + ((n * s.in_h + ih) * s.in_w + iw) * s.in_c;
            const float* wt = w + (kh * s.kernel_w + kw) * oc;
            if (mult == 1) {
              int64_t c = 0;
              for (; c + 8 <= oc; c += 8) {
                _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(_mm256_loadu_ps(xi + c), _mm256_loadu_ps(wt + c),
                                                          _mm256_loadu_ps(acc + c)));
              }
              for (; c < oc; ++c) acc[c] += xi[c] * wt[c];
            } else {
              for (int64_t c = 0; c < oc; ++c) acc[c] += xi[c / mult] * wt[c];
            }
          }
        }
        ApplyActivation(act, acc, oc);
      }
    }
  });
}

}  // namespace

void ApplyActivation(const ActivationParams& act, float* x, int64_t n) {
  if (act.kind == Activation::kNone) return;
  if (act.kind == Activation::kSigmoid) {
    for (int64_t i = 0; i < n; ++i) x[i] = Act(act, x[i]);
    return;
  }
  // The piecewise-linear ones as clamp(a * x + b, lo, hi), times x for HardSwish; AVX2, 8 at a time.
  float a = 1, b = 0, lo = -INFINITY, hi = INFINITY;
  if (act.kind == Activation::kRelu) lo = 0;
  if (act.kind == Activation::kClip) lo = act.lo, hi = act.hi;
  if (act.kind == Activation::kHardSigmoid) a = act.alpha, b = act.beta, lo = 0, hi = 1;
  if (act.kind == Activation::kHardSwish) a = 1.0f / 6.0f, b = 0.5f, lo = 0, hi = 1;
  const bool times_x = act.kind == Activation::kHardSwish;
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vlo = _mm256_set1_ps(lo),
               vhi = _mm256_set1_ps(hi);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 t = _mm256_min_ps(_mm256_max_ps(_mm256_fmadd_ps(v, va, vb), vlo), vhi);
    if (times_x) t = _mm256_mul_ps(t, v);
    _mm256_storeu_ps(x + i, t);
  }
  for (; i < n; ++i) {
    const float t = std::min(std::max(x[i] * a + b, lo), hi);
    x[i] = times_x ? t * x[i] : t;
  }
}

void BiasActivation(const float* bias, const ActivationParams& act, float* x, int64_t rows, int64_t cols,
                    ThreadPool& pool) {
  if (bias == nullptr && act.kind == Activation::kNone) return;
  pool.ParallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)),
                   [&](int64_t r0, int64_t r1) {
                     for (int64_t r = r0; r < r1; ++r) {
                       float* row = x + r * cols;
                       if (bias != nullptr) {
                         for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
                       }
                       ApplyActivation(act, row, cols);
                     }
                   });
}

Status Conv2dShape::Validate() const {
  if (batch < 1 || in_h < 1 || in_w < 1 || in_c < 1 || out_c < 1) {
    return InvalidArgumentError(
        "conv: batch, in_h, in_w, in_c and out_c must be >= 1 (got {}, {}, {}, {}, {})", batch, in_h, in_w,
        in_c, out_c);
  }
  if (out_h < 1 || out_w < 1) {
    return InvalidArgumentError("conv: the output would be {}x{}: the kernel is larger than the padded input",
                                out_h, out_w);
  }
  if (kernel_h < 1 || kernel_w < 1 || stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1) {
    return InvalidArgumentError("conv: kernel, strides and dilations must be >= 1");
  }
  if (pad_top < 0 || pad_left < 0) return InvalidArgumentError("conv: negative padding");
  if (groups < 1 || in_c % groups != 0 || out_c % groups != 0) {
    return InvalidArgumentError("conv: group {} does not divide in_c {} and out_c {}", groups, in_c, out_c);
  }
  return OkStatus();
}

std::vector<float> PackConvWeights(const float* onnx_w, const Conv2dShape& s) {
  const int64_t cpg = s.in_c / s.groups;
  const int64_t taps = s.kernel_h * s.kernel_w;
  std::vector<float> out(static_cast<size_t>(s.out_c * cpg * taps));
  for (int64_t o = 0; o < s.out_c; ++o) {
    for (int64_t c = 0; c < cpg; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        const float v = onnx_w[(o * cpg + c) * taps + t];
        if (s.depthwise())
          out[t * s.out_c + o] = v;  // cpg == 1
        else
          out[(o * taps + t) * cpg + c] = v;
      }
    }
  }
  return out;
}

Status Conv2dNhwc(const float* x, const Conv2dShape& s, const float* packed_w, const float* bias,
                  const ActivationParams& act, float* y, ThreadPool& pool) {
  RETURN_IF_ERROR(s.Validate());
  if (s.depthwise()) {
    DepthwiseConv(x, s, packed_w, bias, act, y, pool);
    return OkStatus();
  }
  return DenseConv(x, s, packed_w, bias, act, y, pool);
}

void Pool2dNhwc(PoolKind kind, const float* x, const Pool2dShape& s, float* y, ThreadPool& pool) {
  const int64_t c = s.channels;
  pool.ParallelFor(s.batch * s.out_h, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(static_cast<size_t>(c));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / s.out_h;
      const int64_t oh = r % s.out_h;
      for (int64_t ow = 0; ow < s.out_w; ++ow) {
        std::fill(acc.begin(), acc.end(),
                  kind == PoolKind::kMax ? -std::numeric_limits<float>::infinity() : 0.0f);
        int64_t valid = 0, padded = 0;
        for (int64_t kh = 0; kh < s.kernel_h; ++kh) {
          const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
          for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
            const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
            if (ih >= -s.pad_top && ih < s.in_h + s.pad_bottom && iw >= -s.pad_left &&
                iw < s.in_w + s.pad_right) {
              ++padded;
            }
            if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
            ++valid;
            const float* xi = x + ((n * s.in_h + ih) * s.in_w + iw) * c;
            if (kind == PoolKind::kMax) {
              for (int64_t ch = 0; ch < c; ++ch) acc[ch] = std::max(acc[ch], xi[ch]);
            } else {
              for (int64_t ch = 0; ch < c; ++ch) acc[ch] += xi[ch];
            }
          }
        }
        float* out = y + ((n * s.out_h + oh) * s.out_w + ow) * c;
        if (kind == PoolKind::kMax) {
          std::copy(acc.begin(), acc.end(), out);
        } else {
          const int64_t div = s.count_include_pad ? padded : valid;
          const float inv = div > 0 ? 1.0f / static_cast<float>(div) : 0.0f;
          for (int64_t ch = 0; ch < c; ++ch) out[ch] = acc[ch] * inv;
        }
      }
    }
  });
}

void GlobalAveragePoolNhwc(const float* x, int64_t batch, int64_t pixels, int64_t channels, float* y) {
  const float inv = 1.0f / static_cast<float>(pixels);
  for (int64_t n = 0; n < batch; ++n) {
    float* out = y + n * channels;
    std::fill(out, out + channels, 0.0f);
    const float* xn = x + n * pixels * channels;
    for (int64_t p = 0; p < pixels; ++p) {
      for (int64_t c = 0; c < channels; ++c) out[c] += xn[p * channels + c];
    }
    for (int64_t c = 0; c < channels; ++c) out[c] *= inv;
  }
}

}  // namespace stoke::cpu
