#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/norm.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// residual may be nullptr (plain RMSNorm). Each thread re-reads its own elements in the second pass, so the
// residual it wrote is the value it normalises (no cross-thread dependency).
template <typename T>
__global__ void RmsNormResidualKernel(const T* __restrict__ x, T* residual, const float* __restrict__ w,
                                      int64_t dim, float eps, T* out) {
  __shared__ float scratch[32];
  const int64_t base = blockIdx.x * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = ToFloat(x[base + i]);
    if (residual != nullptr) {
      const T r = FromFloat<T>(v + ToFloat(residual[base + i]));
      residual[base + i] = r;
      v = ToFloat(r);
    }
    sum += v * v;
  }
  const float scale = rsqrtf(BlockSum(sum, scratch) / static_cast<float>(dim) + eps);
  const T* src = residual != nullptr ? residual : x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[base + i] = FromFloat<T>(ToFloat(src[base + i]) * scale * w[i]);
  }
}

// Two-pass (mean, then centred variance) for accuracy on rows with a large mean.
template <typename T>
__global__ void LayerNormKernel(const T* x, const float* __restrict__ g, const float* __restrict__ b,
                                int64_t dim, float eps, T* out) {
  __shared__ float scratch[32];
  const int64_t base = blockIdx.x * dim;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += ToFloat(x[base + i]);
  const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = ToFloat(x[base + i]) - mean;
    v += d * d;
  }
  const float rstd = rsqrtf(BlockSum(v, scratch) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    out[base + i] = FromFloat<T>((ToFloat(x[base + i]) - mean) * rstd * g[i] + b[i]);
  }
}

template <typename T>
Status LaunchRms(const T* x, T* residual, const float* w, int64_t rows, int64_t dim, float eps, T* out,
                 cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if (rows > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "RmsNorm: too many rows");
  RmsNormResidualKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, residual, w, dim, eps, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

template <typename T>
Status LaunchLayerNorm(const T* x, const float* g, const float* b, int64_t rows, int64_t dim, float eps,
                       T* out, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if (rows > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "LayerNorm: too many rows");
  LayerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, g, b, dim, eps, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status RmsNormResidual(const float* x, float* residual, const float* weight, int64_t rows, int64_t dim,
                       float eps, float* out, cudaStream_t stream) {
  return LaunchRms(x, residual, weight, rows, dim, eps, out, stream);
}
Status RmsNormResidual(const __nv_bfloat16* x, __nv_bfloat16* residual, const float* weight, int64_t rows,
                       int64_t dim, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  return LaunchRms(x, residual, weight, rows, dim, eps, out, stream);
}
Status RmsNorm(const __nv_bfloat16* x, const float* weight, int64_t rows, int64_t dim, float eps,
               __nv_bfloat16* out, cudaStream_t stream) {
  return LaunchRms<__nv_bfloat16>(x, nullptr, weight, rows, dim, eps, out, stream);
}
Status LayerNorm(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t dim, float eps,
                 float* out, cudaStream_t stream) {
  return LaunchLayerNorm(x, gamma, beta, rows, dim, eps, out, stream);
}
Status LayerNorm(const __nv_bfloat16* x, const float* gamma, const float* beta, int64_t rows, int64_t dim,
                 float eps, __nv_bfloat16* out, cudaStream_t stream) {
  return LaunchLayerNorm(x, gamma, beta, rows, dim, eps, out, stream);
}

}  // namespace stoke::cuda
