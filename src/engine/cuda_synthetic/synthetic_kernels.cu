#include "engine/cuda_synthetic/synthetic_kernels.h"

#include <cuda_fp16.h>
#include <mma.h>

namespace stoke::cuda {
namespace {

// Tensor cores: 4 independent accumulators per warp, each c += a * b (16x16x16, fp16 in, fp32 out). With a
// and b at 2^-10 every step adds 2^-16 to each element: after 2^20 steps the sums are 16, far from overflow.
__device__ void TensorWork(int64_t iters, float* sink) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c0, c1, c2, c3;
  wmma::fill_fragment(a, __float2half(1.0f / 1024));
  wmma::fill_fragment(b, __float2half(1.0f / 1024));
  wmma::fill_fragment(c0, 0.0f);
  wmma::fill_fragment(c1, 0.0f);
  wmma::fill_fragment(c2, 0.0f);
  wmma::fill_fragment(c3, 0.0f);
  for (int64_t i = 0; i < iters; ++i) {
    wmma::mma_sync(c0, a, b, c0);
    wmma::mma_sync(c1, a, b, c1);
    wmma::mma_sync(c2, a, b, c2);
    wmma::mma_sync(c3, a, b, c3);
  }
  const float s = c0.x[0] + c1.x[0] + c2.x[0] + c3.x[0];
  if (s == -1.0f) *sink = s;  // never true
}

__global__ void SynthKernel(int64_t tensor_iters, int64_t fma_iters, float4* region, int64_t n4, const uint8_t* in, uint8_t* out,
                            int64_t rows, int64_t in_bytes, int64_t out_bytes, float* sink) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float m = 0.9999999f, c = 1e-7f;
  if (tensor_iters > 0) TensorWork(tensor_iters, sink);  // whole warps: blockDim is a multiple of 32
  // Compute: 8 independent chains so the FMA pipes stay busy (the values converge to 1, never overflow).
  float a0 = 1.0f + 1e-6f * (tid & 1023), a1 = a0 + 1e-3f, a2 = a0 + 2e-3f, a3 = a0 + 3e-3f;
  float a4 = a0 + 4e-3f, a5 = a0 + 5e-3f, a6 = a0 + 6e-3f, a7 = a0 + 7e-3f;
#pragma unroll 4
  for (int64_t i = 0; i < fma_iters; ++i) {
    a0 = fmaf(a0, m, c);
    a1 = fmaf(a1, m, c);
    a2 = fmaf(a2, m, c);
    a3 = fmaf(a3, m, c);
    a4 = fmaf(a4, m, c);
    a5 = fmaf(a5, m, c);
    a6 = fmaf(a6, m, c);
    a7 = fmaf(a7, m, c);
  }
  const float acc = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  if (acc == -1.0f) *sink = acc;  // never true; the compiler cannot know it
  // Memory: read and write every 16-byte element of the region once.
  for (int64_t i = tid; i < n4; i += stride) {
    float4 v = region[i];
    v.x = fmaf(v.x, m, c);
    v.y = fmaf(v.y, m, c);
    v.z = fmaf(v.z, m, c);
    v.w = fmaf(v.w, m, c);
    region[i] = v;
  }
  // Output: byte j of row r = input byte (j mod in_bytes) of row r, XOR 0x5A (as on the CPU).
  if (out != nullptr) {
    const int64_t total = rows * out_bytes;
    for (int64_t k = tid; k < total; k += stride) {
      const int64_t r = k / out_bytes, j = k - r * out_bytes;
      out[k] = in[r * in_bytes + j % in_bytes] ^ 0x5A;
    }
  }
}

}  // namespace

cudaError_t LaunchSynth(const SynthLaunch& l, cudaStream_t stream) {
  if (l.blocks < 1 || l.threads < 1 || l.threads > 1024 || l.in_bytes < 1 || l.out_bytes < 0) {
    return cudaErrorInvalidValue;
  }
  if (l.tensor_iters > 0 && l.threads % 32 != 0) return cudaErrorInvalidValue;
  SynthKernel<<<l.blocks, l.threads, 0, stream>>>(l.tensor_iters, l.fma_iters, reinterpret_cast<float4*>(l.region),
                                                  l.region_float4s, l.in, l.out, l.rows, l.in_bytes,
                                                  l.out_bytes, l.sink);
  return cudaGetLastError();
}

}  // namespace stoke::cuda
