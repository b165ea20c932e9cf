// fp8 E4M3 rows with a scale per row (quant.h): the quantiser of --quantization fp8's weights (at load) and
// of the FP8 GEMMs' activations (per token, every step).
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/quant.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: the row's amax, then the bytes. The scale and its inverse are computed as the CPU
// reference computes them (448 / amax and amax / 448 in fp32), and __nv_cvt_float_to_fp8 rounds to nearest
// even with saturation, as cpu::Fp8E4M3FromFloat.
__global__ void __launch_bounds__(kThreads)
    QuantizeRowsKernel(const __nv_bfloat16* __restrict__ x, int64_t cols, int64_t ldx, uint8_t* __restrict__ q,
                       float* __restrict__ scale, float multiplier) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* xr = x + r * ldx;
  uint8_t* qr = q + r * cols;
  float amax = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) amax = fmaxf(amax, fabsf(__bfloat162float(xr[j])));
  amax = BlockMax(amax, red);
  const bool ok = amax > 0.f && isfinite(amax);
  const float inv = ok ? 448.f / amax : 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    qr[j] = ok ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(__bfloat162float(xr[j]) * inv, __NV_SATFINITE,
                                                            __NV_E4M3))
               : uint8_t{0};
  }
  if (threadIdx.x == 0) scale[r] = ok ? amax / 448.f * multiplier : 0.f;
}

// The same 8 values per access: a 16-byte load of x, an 8-byte store of q (cols % 8 == 0, ldx % 8 == 0,
// aligned rows). amax is a max (order-free) and each byte is converted as above: the same output.
__global__ void __launch_bounds__(kThreads)
    QuantizeRowsVec8Kernel(const __nv_bfloat16* __restrict__ x, int64_t cols, int64_t ldx,
                           uint8_t* __restrict__ q, float* __restrict__ scale, float multiplier) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + r * ldx);
  uint2* qr = reinterpret_cast<uint2*>(q + r * cols);
  const int64_t n = cols / 8;
  float amax = 0.f;
  for (int64_t v = threadIdx.x; v < n; v += kThreads) {
    const uint4 p = xr[v];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&p);
#pragma unroll
    for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(__bfloat162float(e[k])));
  }
  amax = BlockMax(amax, red);
  const bool ok = amax > 0.f && isfinite(amax);
  const float inv = ok ? 448.f / amax : 0.f;
  for (int64_t v = threadIdx.x; v < n; v += kThreads) {
    const uint4 p = xr[v];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&p);
    uint2 o;
    uint8_t* b = reinterpret_cast<uint8_t*>(&o);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      b[k] = ok ? static_cast<uint8_t>(
                      __nv_cvt_float_to_fp8(__bfloat162float(e[k]) * inv, __NV_SATFINITE, __NV_E4M3))
                : uint8_t{0};
    }
    qr[v] = o;
  }
  if (threadIdx.x == 0) scale[r] = ok ? amax / 448.f * multiplier : 0.f;
}

__global__ void DequantizeRowsKernel(const uint8_t* __restrict__ q, const float* __restrict__ scale,
                                     int64_t cols, int64_t n, __nv_bfloat16* __restrict__ y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q[i]), __NV_E4M3);
  y[i] = __float2bfloat16_rn(__half2float(__half(h)) * scale[i / cols]);
}

}  // namespace

Status QuantizeRowsFp8(const __nv_bfloat16* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                       float* scale, float scale_multiplier, cudaStream_t stream, bool vec8) {
  if (rows < 0 || cols < 0 || ldx < cols || rows > 0x7fffffff) {
    return Status(StatusCode::kInvalidArgument, "QuantizeRowsFp8: bad shape (rows, cols, ldx)");
  }
  if (rows == 0 || cols == 0) return OkStatus();
  const bool aligned = cols % 8 == 0 && ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(q) % 8 == 0;
  if (vec8 && aligned) {
    QuantizeRowsVec8Kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, ldx, q, scale,
                                                                                 scale_multiplier);
  } else {
    QuantizeRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, ldx, q, scale,
                                                                             scale_multiplier);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status DequantizeRowsFp8(const uint8_t* q, const float* scale, int64_t rows, int64_t cols, __nv_bfloat16* y,
                         cudaStream_t stream) {
  if (rows < 0 || cols < 0) return Status(StatusCode::kInvalidArgument, "DequantizeRowsFp8: bad shape");
  const int64_t n = rows * cols;
  if (n == 0) return OkStatus();
  DequantizeRowsKernel<<<CeilDiv(n, 256), 256, 0, stream>>>(q, scale, cols, n, y);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
