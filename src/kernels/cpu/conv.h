// Convolution and pooling on the CPU for the CNN engine (engine/cnn/): the reference a GPU twin will be
// checked against. Images are NHWC fp32, dense:
//   x [batch, in_h, in_w, in_c]   y [batch, out_h, out_w, out_c]
// NHWC puts a pixel's channels side by side, so a 1x1 convolution is one GEMM over all pixels and im2col
// copies whole channel runs.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"

namespace stoke::cpu {

// An activation applied in place after a convolution or GEMM (the fused epilogue).
enum class Activation : uint8_t {
  kNone,
  kRelu,         // max(x, 0)
  kClip,         // min(max(x, lo), hi)       (ReLU6: lo 0, hi 6)
  kHardSigmoid,  // clip(alpha * x + beta, 0, 1)
  kHardSwish,    // x * clip(x / 6 + 1/2, 0, 1)
  kSigmoid,      // 1 / (1 + exp(-x))
};

struct ActivationParams {
  Activation kind = Activation::kNone;
  float lo = 0;     // kClip
  float hi = 0;     // kClip
  float alpha = 0;  // kHardSigmoid
  float beta = 0;   // kHardSigmoid
};

// x[i] = act(x[i]) for i in [0, n).
void ApplyActivation(const ActivationParams& act, float* x, int64_t n);
// x[r, c] = act(x[r, c] + bias[c]) for a [rows, cols] block; bias may be null.
void BiasActivation(const float* bias, const ActivationParams& act, float* x, int64_t rows, int64_t cols,
                    ThreadPool& pool);

struct Conv2dShape {
  int64_t batch = 1;
  int64_t in_h = 0, in_w = 0, in_c = 0;
  int64_t out_h = 0, out_w = 0, out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;  // bottom/right padding is implied by out_h/out_w
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;

  // groups == in_c and out_c a multiple of it: the depthwise kernel below.
  bool depthwise() const { return groups > 1 && groups == in_c && out_c % in_c == 0; }
  // Checks sizes and divisibility; InvalidArgument naming the field.
  Status Validate() const;
};

// Weights for Conv2dNhwc: [out_c, kernel_h, kernel_w, in_c / groups], one row per output channel (rows of a
// group are contiguous). For a depthwise shape: [kernel_h, kernel_w, out_c] (a tap's weights side by side).
// ONNX's [out_c, in_c / groups, kernel_h, kernel_w] converts with PackConvWeights.
std::vector<float> PackConvWeights(const float* onnx_w, const Conv2dShape& s);

// y = act(conv(x, w) + bias). bias may be null. General convolutions are im2col + single-threaded OpenBLAS
// sgemm per block of output pixels, the blocks spread over `pool` (each thread keeps its im2col rows, at
// most ~1 MiB, between calls); 1x1 stride-1 unpadded ones skip im2col; depthwise ones run a direct kernel
// (AVX2 over channels). Sets OpenBLAS to one thread (once per process), as MatMul does.
Status Conv2dNhwc(const float* x, const Conv2dShape& s, const float* packed_w, const float* bias,
                  const ActivationParams& act, float* y, ThreadPool& pool);

enum class PoolKind : uint8_t { kMax, kAverage };

struct Pool2dShape {
  int64_t batch = 1, channels = 0;
  int64_t in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool count_include_pad = false;  // average: divide by the window inside the padded image, else by the
                                   // taps inside the image
};

void Pool2dNhwc(PoolKind kind, const float* x, const Pool2dShape& s, float* y, ThreadPool& pool);
// y[n, c] = mean over h, w of x[n, h, w, c].
void GlobalAveragePoolNhwc(const float* x, int64_t batch, int64_t pixels, int64_t channels, float* y);

}  // namespace stoke::cpu
