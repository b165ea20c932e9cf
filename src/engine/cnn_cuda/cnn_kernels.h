// The CNN executor's CUDA kernels (cnn_kernels.cu), as launchers over raw device pointers and a stream.
// Activations are 16-bit (ElemType: fp16 or bf16) and NHWC for 4-D images, exactly as the CPU plan lays them
// out (cnn_plan.h): x [batch, in_h, in_w, in_c], y [batch, out_h, out_w, out_c]. Arithmetic is fp32 inside
// every kernel; only storage is 16-bit. Plain types only: this header is included by nvcc-compiled code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace stoke::cnn::cuda {

enum class ElemType : uint8_t { kF16, kBF16 };

// cpu::Activation's kinds by value (kNone 0, kRelu 1, kClip 2, kHardSigmoid 3, kHardSwish 4, kSigmoid 5).
struct ActParams {
  int kind = 0;
  float lo = 0, hi = 0, alpha = 0, beta = 0;
};

struct ConvGeom {
  int64_t batch = 1, in_h = 0, in_w = 0, in_c = 0, out_h = 0, out_w = 0, out_c = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0;
  int64_t dilation_h = 1, dilation_w = 1, groups = 1;
};

struct PoolGeom {
  int64_t batch = 1, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0, dilation_h = 1, dilation_w = 1;
  bool count_include_pad = false;
  bool max = true;
};

// out[i...] = act(a[i . sa] op b[i . sb]) over dims (rank <= kMaxRank; strides 0 broadcast).
struct BinaryGeom {
  static constexpr int kMaxRank = 6;
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t sa[kMaxRank] = {};
  int64_t sb[kMaxRank] = {};
  char op = '+';
  bool contiguous = false;  // both strides are dims' row-major strides: a plain elementwise loop
};

// cols [batch * out_h * out_w, ld]: row m holds, group after group (each starting at g * group_ld), the
// window's taps (kernel_h, kernel_w) each with the group's in_c / groups channels. Columns past a group's
// kernel_h * kernel_w * in_c / groups are not written (the GEMM's k stops before them).
// One warp per (pixel, group, tap) copying the tap's channels (16 bytes at a time when they come in 8s).
cudaError_t LaunchIm2col(ElemType t, const void* x, const ConvGeom& g, int64_t group_ld, int64_t ld,
                         void* cols, cudaStream_t stream);
// y[r, c] = act(y[r, c] + bias[c]) for a [rows, cols] block, in place; bias (fp32) may be null.
cudaError_t LaunchBiasActivation(ElemType t, void* y, const float* bias, const ActParams& act, int64_t rows,
                                 int64_t cols, cudaStream_t stream);
// Depthwise (groups == in_c, out_c = in_c * multiplier): w [kernel_h, kernel_w, out_c]; y = act(conv + bias).
cudaError_t LaunchDepthwise(ElemType t, const void* x, const ConvGeom& g, const void* w, const float* bias,
                            const ActParams& act, void* y, cudaStream_t stream);
cudaError_t LaunchPool(ElemType t, const void* x, const PoolGeom& g, void* y, cudaStream_t stream);
// y[n, c] = mean over pixels of x[n, p, c].
cudaError_t LaunchGlobalAvgPool(ElemType t, const void* x, int64_t batch, int64_t pixels, int64_t channels,
                                void* y, cudaStream_t stream);
cudaError_t LaunchBinary(ElemType t, const BinaryGeom& g, const void* a, const void* b, const ActParams& act,
                         void* y, cudaStream_t stream);
// y[k] = x[k] * scale[c] + shift[c], c = (k / inner) % len; scale, shift fp32.
cudaError_t LaunchChannelAffine(ElemType t, const void* x, const float* scale, const float* shift,
                                int64_t outer, int64_t len, int64_t inner, void* y, cudaStream_t stream);
// Softmax over `len` of x [outer, len, inner] (fp32 inside).
cudaError_t LaunchSoftmax(ElemType t, const void* x, int64_t outer, int64_t len, int64_t inner, void* y,
                          cudaStream_t stream);
// y [outer, b, a] = x [outer, a, b] transposed per outer index.
cudaError_t LaunchTranspose(ElemType t, const void* x, int64_t outer, int64_t a, int64_t b, void* y,
                            cudaStream_t stream);
cudaError_t LaunchToElem(ElemType t, const float* x, int64_t n, void* y, cudaStream_t stream);
cudaError_t LaunchToFloat(ElemType t, const void* x, int64_t n, float* y, cudaStream_t stream);

}  // namespace stoke::cnn::cuda
