// The launcher behind ResizeNormalizeNchw (resize_normalize.h), kept free of Status and JSON so nvcc
// compiles it; resize_normalize.cc fills the parameters from a PreprocessConfig and its ResizeGeometry.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace stoke::image::cuda {

struct ResizeKernelParams {
  int64_t src_w = 0, src_h = 0;
  int64_t out_h = 0, out_w = 0;                // the tensor [3, out_h, out_w]
  int64_t scaled_h = 0, scaled_w = 0;          // the virtual resized image
  int64_t y0 = 0, x0 = 0, rows = 0, cols = 0;  // its window written to the tensor's top-left
  float mul[3] = {1, 1, 1};                    // per output channel: value = v * mul + add
  float add[3] = {0, 0, 0};
  int bgr = 0;
};

cudaError_t LaunchResizeNormalize(const uint8_t* rgb, const ResizeKernelParams& p, float* out,
                                  cudaStream_t stream);

}  // namespace stoke::image::cuda
