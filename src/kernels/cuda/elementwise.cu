#include <cstdint>
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

// The bf16 form 8 columns at a time: one 16-byte load of gate and of up, one 16-byte store per thread
// (inter % 8 == 0, 16-byte aligned rows), the same arithmetic per value as SiluMulFusedKernel.
__global__ void SiluMulFusedVec8Kernel(const __nv_bfloat16* __restrict__ gu, int64_t rows, int64_t inter,
                                       __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  const int64_t per_row = inter / 8, total = rows * per_row;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / per_row, c = (v - r * per_row) * 8;
    const uint4 g4 = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + c);
    const uint4 u4 = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c);
    const __nv_bfloat16* g = reinterpret_cast<const __nv_bfloat16*>(&g4);
    const __nv_bfloat16* u = reinterpret_cast<const __nv_bfloat16*>(&u4);
    uint4 o4;
    __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&o4);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = FromFloat<__nv_bfloat16>(Silu(ToFloat(g[k])) * ToFloat(u[k]));
    *reinterpret_cast<uint4*>(out + r * inter + c) = o4;
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
                    cudaStream_t stream, bool vec8) {
  const bool aligned = inter % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (!vec8 || !aligned || rows <= 0 || inter <= 0)
    return LaunchSiluMulFused(gate_up, rows, inter, out, stream);
  SiluMulFusedVec8Kernel<<<GridFor(rows * (inter / 8)), kThreads, 0, stream>>>(gate_up, rows, inter, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
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
