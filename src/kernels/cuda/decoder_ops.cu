#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_ops.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// One block per output row. src_rows (nullable) maps output row -> residual/delta row; write_back stores the
// sum into the residual (only without src_rows). Each thread re-reads only the elements it wrote itself.
__global__ void AddRmsNormKernel(const __nv_bfloat16* delta, float* residual, const int32_t* src_rows,
                                 bool write_back, const float* __restrict__ w, int64_t dim, float eps,
                                 __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();  // the projection after a norm may start streaming its weights (gemv.h)
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  __shared__ float scratch[32];
  const int64_t src = src_rows != nullptr ? src_rows[blockIdx.x] : blockIdx.x;
  const int64_t base = src * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = residual[base + i];
    if (delta != nullptr) v += __bfloat162float(delta[base + i]);
    if (write_back) residual[base + i] = v;
    sum += v * v;
  }
  const float scale = rsqrtf(BlockSum(sum, scratch) / static_cast<float>(dim) + eps);
  __nv_bfloat16* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = residual[base + i];
    if (delta != nullptr && !write_back) v += __bfloat162float(delta[base + i]);
    o[i] = __float2bfloat16_rn(v * scale * w[i]);
  }
}

// The same for rows of at most kPer x blockDim.x values (decode at small batch: one 1024-thread block per row),
// with each thread's values kept in registers between the two passes instead of re-read, and the norm weights
// loaded before PdlWait (they are never written by the kernels before it, so under PDL their load overlaps the
// previous kernel's tail). Element i = threadIdx.x + k blockDim.x: the same per-thread sums in the same order as
// AddRmsNormKernel, so the same bits.
template <int kPer>
__global__ void AddRmsNormRegKernel(const __nv_bfloat16* delta, float* residual, const int32_t* src_rows,
                                    bool write_back, const float* __restrict__ w, int64_t dim, float eps,
                                    __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  float wv[kPer], v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    wv[k] = i < dim ? w[i] : 0.f;
  }
  PdlWait();
  __shared__ float scratch[32];
  const int64_t src = src_rows != nullptr ? src_rows[blockIdx.x] : blockIdx.x;
  const int64_t base = src * dim;
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    v[k] = 0.f;
    if (i < dim) {
      float x = residual[base + i];
      if (delta != nullptr) x += __bfloat162float(delta[base + i]);
      if (write_back) residual[base + i] = x;
      v[k] = x;
      sum += x * x;
    }
  }
  const float scale = rsqrtf(BlockSum(sum, scratch) / static_cast<float>(dim) + eps);
  __nv_bfloat16* o = out + static_cast<int64_t>(blockIdx.x) * dim;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (i < dim) o[i] = __float2bfloat16_rn(v[k] * scale * wv[k]);
  }
}

__global__ void SplitQkvKernel(const __nv_bfloat16* __restrict__ qkv, const float* __restrict__ bias,
                               int64_t tokens, int64_t q_dim, int64_t kv_dim, __nv_bfloat16* __restrict__ q,
                               __nv_bfloat16* __restrict__ k, __nv_bfloat16* __restrict__ v) {
  const int64_t width = q_dim + 2 * kv_dim, total = tokens * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, c = i - t * width;
    __nv_bfloat16 x = qkv[i];
    if (bias != nullptr) x = __float2bfloat16_rn(__bfloat162float(x) + bias[c]);
    if (c < q_dim) {
      q[t * q_dim + c] = x;
    } else if (c < q_dim + kv_dim) {
      k[t * kv_dim + (c - q_dim)] = x;
    } else {
      v[t * kv_dim + (c - q_dim - kv_dim)] = x;
    }
  }
}

Status LaunchNorm(const __nv_bfloat16* delta, float* residual, const int32_t* rows, bool write_back,
                  const float* w, int64_t n, int64_t dim, float eps, __nv_bfloat16* out, cudaStream_t stream,
                  bool pdl) {
  if (n <= 0 || dim <= 0) return OkStatus();
  if (n > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "AddRmsNorm: too many rows");
  // Few rows (decode at small batch): one wide block per row, or the norm is a few latency-bound blocks.
  const int threads = n <= 32 ? 1024 : kThreads;
  const dim3 grid(static_cast<unsigned>(n)), block(threads);
  // Rows of at most 8 values a thread: the register form (AddRmsNormRegKernel); longer rows loop.
  const int64_t per = (dim + threads - 1) / threads;
  const auto kernel = per <= 1   ? AddRmsNormRegKernel<1>
                      : per <= 2 ? AddRmsNormRegKernel<2>
                      : per <= 4 ? AddRmsNormRegKernel<4>
                      : per <= 8 ? AddRmsNormRegKernel<8>
                                 : AddRmsNormKernel;
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, kernel, dim3(static_cast<unsigned>(n)), dim3(threads), 0, stream, delta,
                                    residual, rows, write_back, w, dim, eps, out));
  return OkStatus();
}

}  // namespace

Status AddRmsNorm(const __nv_bfloat16* delta, float* residual, const float* weight, int64_t rows, int64_t dim,
                  float eps, __nv_bfloat16* out, cudaStream_t stream, bool pdl) {
  return LaunchNorm(delta, residual, nullptr, /*write_back=*/true, weight, rows, dim, eps, out, stream, pdl);
}

Status GatherAddRmsNorm(const float* residual, const __nv_bfloat16* delta, const int32_t* rows, int64_t n,
                        int64_t dim, const float* weight, float eps, __nv_bfloat16* out, cudaStream_t stream,
                        bool pdl) {
  // The kernel only reads the residual when write_back is false.
  return LaunchNorm(delta, const_cast<float*>(residual), rows, /*write_back=*/false, weight, n, dim, eps, out,
                    stream, pdl);
}

Status SplitQkv(const __nv_bfloat16* qkv, const float* bias, int64_t tokens, int64_t q_dim, int64_t kv_dim,
                __nv_bfloat16* q, __nv_bfloat16* k, __nv_bfloat16* v, cudaStream_t stream) {
  const int64_t total = tokens * (q_dim + 2 * kv_dim);
  if (total <= 0) return OkStatus();
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  SplitQkvKernel<<<grid, kThreads, 0, stream>>>(qkv, bias, tokens, q_dim, kv_dim, q, k, v);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
