#include <cmath>

#include "engine/image_cuda/resize_kernel.h"

namespace stoke::image::cuda {
namespace {

// The CPU's Taps(): source index pair and weight for output index i of a resize from n_in to n_out.
__device__ void Tap(int64_t i, int64_t n_in, int64_t n_out, int64_t* i0, int64_t* i1, float* w1) {
  const double ratio = static_cast<double>(n_in) / static_cast<double>(n_out);
  double src = (static_cast<double>(i) + 0.5) * ratio - 0.5;
  if (src < 0) src = 0;
  int64_t a = static_cast<int64_t>(floor(src));
  if (a > n_in - 1) a = n_in - 1;
  *i0 = a;
  *i1 = a + 1 < n_in ? a + 1 : n_in - 1;
  *w1 = static_cast<float>(src - static_cast<double>(a));
}

// One thread per output pixel; grid-stride over [out_h, out_w].
__global__ void ResizeNormalizeKernel(const uint8_t* __restrict__ rgb, ResizeKernelParams p,
                                      float* __restrict__ out) {
  const int64_t plane = p.out_h * p.out_w;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < plane;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t y = idx / p.out_w, x = idx % p.out_w;
    if (y >= p.rows || x >= p.cols) {
      for (int c = 0; c < 3; ++c) out[c * plane + idx] = 0.0f;
      continue;
    }
    int64_t ya, yb, xa, xb;
    float wy, wx;
    Tap(p.y0 + y, p.src_h, p.scaled_h, &ya, &yb, &wy);
    Tap(p.x0 + x, p.src_w, p.scaled_w, &xa, &xb, &wx);
    const uint8_t* r0 = rgb + ya * p.src_w * 3;
    const uint8_t* r1 = rgb + yb * p.src_w * 3;
    for (int c = 0; c < 3; ++c) {
      const float top = r0[xa * 3 + c] * (1 - wx) + r0[xb * 3 + c] * wx;
      const float bot = r1[xa * 3 + c] * (1 - wx) + r1[xb * 3 + c] * wx;
      const float v = top * (1 - wy) + bot * wy;
      const int oc = p.bgr ? 2 - c : c;
      out[oc * plane + idx] = v * p.mul[oc] + p.add[oc];
    }
  }
}

}  // namespace

cudaError_t LaunchResizeNormalize(const uint8_t* rgb, const ResizeKernelParams& p, float* out,
                                  cudaStream_t stream) {
  const int64_t plane = p.out_h * p.out_w;
  const int threads = 256;
  const int64_t want = (plane + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 4096 ? (want > 0 ? want : 1) : 4096);
  ResizeNormalizeKernel<<<blocks, threads, 0, stream>>>(rgb, p, out);
  return cudaGetLastError();
}

}  // namespace stoke::image::cuda
