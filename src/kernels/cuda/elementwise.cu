#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// One block per output row; threads stride over dim.
template <typename TIn, typename TOut>
__global__ void EmbeddingKernel(const TIn* __restrict__ table, int64_t vocab, int64_t dim,
                                const int32_t* __restrict__ ids, TOut* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const int32_t id = ids[row];
  TOut* o = out + row * dim;
  if (id < 0 || id >= vocab) {
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = FromFloat<TOut>(0.f);
    return;
  }
  const TIn* t = table + static_cast<int64_t>(id) * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) o[c] = FromFloat<TOut>(ToFloat(t[c]));
}

template <typename T>
__global__ void SiluMulFusedKernel(const T* __restrict__ gu, int64_t rows, int64_t inter,
                                   T* __restrict__ out) {
  PdlLaunchDependents();  // the down projection may start streaming its weights (gemv.h)
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i - r * inter;
    const float g = ToFloat(gu[r * 2 * inter + c]);
    const float u = ToFloat(gu[r * 2 * inter + inter + c]);
    out[i] = FromFloat<T>(Silu(g) * u);
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* gate, const T* up, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(Silu(ToFloat(gate[i])) * ToFloat(up[i]));
  }
}

template <typename T>
__global__ void GeluBiasKernel(T* x, const float* __restrict__ bias, int64_t rows, int64_t dim) {
  const int64_t total = rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = ToFloat(x[i]);
    if (bias != nullptr) v += bias[i % dim];
    x[i] = FromFloat<T>(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
  }
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

template <typename TIn, typename TOut>
Status LaunchEmbedding(const TIn* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n, TOut* out,
                       cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return OkStatus();
  if (n > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "EmbeddingGather: too many ids");
  EmbeddingKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(table, vocab, dim, ids, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status EmbeddingGather(const float* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out, cudaStream_t stream) {
  return LaunchEmbedding(table, vocab, dim, ids, n, out, stream);
}
Status EmbeddingGather(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out, cudaStream_t stream) {
  return LaunchEmbedding(table, vocab, dim, ids, n, out, stream);
}
Status EmbeddingGather(const __nv_bfloat16* table, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       __nv_bfloat16* out, cudaStream_t stream) {
  return LaunchEmbedding(table, vocab, dim, ids, n, out, stream);
}

template <typename T>
static Status LaunchSiluMulFused(const T* gu, int64_t rows, int64_t inter, T* out, cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return OkStatus();
  SiluMulFusedKernel<<<GridFor(rows * inter), kThreads, 0, stream>>>(gu, rows, inter, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}
Status SiluMulFused(const float* gate_up, int64_t rows, int64_t inter, float* out, cudaStream_t stream) {
  return LaunchSiluMulFused(gate_up, rows, inter, out, stream);
}
Status SiluMulFused(const __nv_bfloat16* gate_up, int64_t rows, int64_t inter, __nv_bfloat16* out,
                    cudaStream_t stream) {
  return LaunchSiluMulFused(gate_up, rows, inter, out, stream);
}

template <typename T>
static Status LaunchSiluMul(const T* gate, const T* up, int64_t n, T* out, cudaStream_t stream) {
  if (n <= 0) return OkStatus();
  SiluMulKernel<<<GridFor(n), kThreads, 0, stream>>>(gate, up, n, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}
Status SiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  return LaunchSiluMul(gate, up, n, out, stream);
}
Status SiluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n, __nv_bfloat16* out,
               cudaStream_t stream) {
  return LaunchSiluMul(gate, up, n, out, stream);
}

template <typename T>
static Status LaunchGeluBias(T* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (BiasAct8Applies(x, dim)) {
      BiasAct8Kernel<true><<<BiasAct8Grid(rows, dim, 128), 128, 0, stream>>>(x, bias, rows, dim);
      CUDA_RETURN_IF_ERROR(cudaGetLastError());
      return OkStatus();
    }
  }
  GeluBiasKernel<<<GridFor(rows * dim), kThreads, 0, stream>>>(x, bias, rows, dim);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}
Status GeluBias(float* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  return LaunchGeluBias(x, bias, rows, dim, stream);
}
Status GeluBias(__nv_bfloat16* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  return LaunchGeluBias(x, bias, rows, dim, stream);
}

}  // namespace stoke::cuda
