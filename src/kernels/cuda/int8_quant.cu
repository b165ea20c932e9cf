// INT8 activation quantisers and the int32 -> fp dequantisation of the encoder's int8 GEMMs (int8.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/int8.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int8_t ClampRint(float v) {
  const float r = rintf(v);  // half to even, as std::nearbyint in the default rounding mode
  if (isnan(r)) return 0;
  return static_cast<int8_t>(fminf(fmaxf(r, -127.f), 127.f));
}

// One block per row. The scale, centre and inverse are computed exactly as the CPU reference computes them
// (the same fp32 operations in the same order), so equal inputs give equal bytes.
__global__ void __launch_bounds__(kThreads)
    PerTokenKernel(const __nv_bfloat16* __restrict__ x, int64_t cols, const float* __restrict__ col_inv,
                   float multiplier, bool centred, int8_t* __restrict__ q, float* __restrict__ scale,
                   float* __restrict__ mid) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* xr = x + r * cols;
  int8_t* qr = q + r * cols;
  float lo = INFINITY, hi = -INFINITY, bad = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = __bfloat162float(xr[j]);
    const float y = col_inv != nullptr ? v * col_inv[j] : v;
    if (!isfinite(y)) bad = 1.f;
    lo = fminf(lo, y);
    hi = fmaxf(hi, y);
  }
  hi = BlockMax(hi, red);
  lo = -BlockMax(-lo, red);
  bad = BlockMax(bad, red);
  const float m = centred ? 0.5f * (lo + hi) : 0.f;
  const float s = centred ? __fmul_rn(__fdiv_rn(hi - lo, 254.f), multiplier)
                          : __fmul_rn(__fdiv_rn(fmaxf(-lo, hi), 127.f), multiplier);
  const bool ok = bad == 0.f && isfinite(m) && isfinite(s);
  const bool zero = !ok || !(s > 0.f);
  const float inv = zero ? 0.f : __fdiv_rn(1.f, s);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    if (zero) {
      qr[j] = 0;
      continue;
    }
    const float v = __bfloat162float(xr[j]);
    const float y = col_inv != nullptr ? __fmul_rn(v, col_inv[j]) : v;
    qr[j] = ClampRint(__fmul_rn(__fsub_rn(y, m), inv));
  }
  if (threadIdx.x == 0) {
    scale[r] = ok ? s : 0.f;
    mid[r] = ok ? m : 0.f;
  }
}

__global__ void StaticKernel(const __nv_bfloat16* __restrict__ x, int64_t cols, int64_t n, float inv,
                             const float* __restrict__ col_inv, int8_t* __restrict__ q) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float f = col_inv != nullptr ? col_inv[i % cols] : inv;
  q[i] = ClampRint(__fmul_rn(__bfloat162float(x[i]), f));
}

template <typename T>
__global__ void DequantKernel(const int32_t* __restrict__ acc, int64_t n, int64_t total,
                              const float* __restrict__ x_scale, const float* __restrict__ x_mid,
                              float static_scale, const float* __restrict__ w_scale,
                              const float* __restrict__ w_sum, T* __restrict__ y) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t i = e / n, j = e % n;
  const float a = static_cast<float>(acc[e]);
  float v;
  if (x_scale != nullptr) {
    v = __fmul_rn(a, __fmul_rn(x_scale[i], w_scale[j]));
    if (x_mid != nullptr && w_sum != nullptr) v = __fadd_rn(v, __fmul_rn(x_mid[i], w_sum[j]));
  } else {
    v = __fmul_rn(a, __fmul_rn(static_scale, w_scale[j]));
  }
  y[e] = FromFloat<T>(v);
}

}  // namespace

Status QuantizeInt8PerToken(const __nv_bfloat16* x, int64_t rows, int64_t cols, const float* col_inv,
                            float multiplier, bool centred, int8_t* q, float* scale, float* mid,
                            cudaStream_t stream) {
  if (rows < 0 || cols < 0 || rows > 0x7fffffff) {
    return Status(StatusCode::kInvalidArgument, "QuantizeInt8PerToken: bad shape");
  }
  if (rows == 0 || cols == 0) return OkStatus();
  PerTokenKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, col_inv, multiplier, centred, q,
                                                                       scale, mid);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status QuantizeInt8Static(const __nv_bfloat16* x, int64_t rows, int64_t cols, float inv_scale,
                          const float* col_inv, int8_t* q, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return Status(StatusCode::kInvalidArgument, "QuantizeInt8Static: bad shape");
  const int64_t n = rows * cols;
  if (n == 0) return OkStatus();
  StaticKernel<<<CeilDiv(n, 256), 256, 0, stream>>>(x, cols, n, inv_scale, col_inv, q);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status DequantizeInt8Gemm(const int32_t* acc, int64_t m, int64_t n, const float* x_scale, const float* x_mid,
                          float static_scale, const float* w_scale, const float* w_sum, void* y, DType out,
                          cudaStream_t stream) {
  if (m < 0 || n < 0) return Status(StatusCode::kInvalidArgument, "DequantizeInt8Gemm: bad shape");
  const int64_t total = m * n;
  if (total == 0) return OkStatus();
  if (out == DType::kBF16) {
    DequantKernel<__nv_bfloat16><<<CeilDiv(total, 256), 256, 0, stream>>>(
        acc, n, total, x_scale, x_mid, static_scale, w_scale, w_sum, static_cast<__nv_bfloat16*>(y));
  } else if (out == DType::kF32) {
    DequantKernel<float><<<CeilDiv(total, 256), 256, 0, stream>>>(acc, n, total, x_scale, x_mid, static_scale,
                                                                  w_scale, w_sum, static_cast<float*>(y));
  } else {
    return Status(StatusCode::kInvalidArgument, "DequantizeInt8Gemm: output must be BF16 or F32");
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
