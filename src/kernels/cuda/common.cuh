// Device helpers shared by the kernels: fp32/bf16 loads and stores, warp and block reductions.
// Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace stoke::cuda {

__device__ __forceinline__ float ToFloat(float x) {
  return x;
}
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` is __shared__ float[32]. Contains __syncthreads: call from all threads.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float s = lane < warps ? scratch[lane] : 0.f;
  return WarpSum(s);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  v = WarpMax(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  float s = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(s);
}

// Programmatic dependent launch (sm_90+). A kernel launched with cudaLaunchAttributeProgrammaticStream-
// Serialization may start before the previous kernel on its stream has finished; it must call PdlWait() before
// reading anything that kernel (or one before it) writes, and before writing anything they read. A kernel
// calling PdlLaunchDependents() lets such a dependent start once all of its own blocks are running. Both are
// no-ops for kernels launched the ordinary way.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

inline unsigned CeilDiv(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

}  // namespace stoke::cuda
