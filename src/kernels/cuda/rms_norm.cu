#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rms_norm.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; a block-wide sum of squares through warp shuffles, then scale.
__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ w, int64_t dim,
                              float eps, float* __restrict__ out) {
  const float* row = x + blockIdx.x * dim;
  float* orow = out + blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += row[i] * row[i];
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  __shared__ float warp_sums[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.f;
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (threadIdx.x == 0) warp_sums[0] = s;
  }
  __syncthreads();
  const float scale = rsqrtf(warp_sums[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = row[i] * scale * w[i];
}

}  // namespace

Status RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out,
               cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, weight, dim, eps, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
