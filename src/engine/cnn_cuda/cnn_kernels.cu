// Kernels of the CNN executor (cnn_kernels.h). Storage T is __half or __nv_bfloat16, arithmetic fp32. Each
// kernel is a grid-stride loop over its outputs with 64-bit indices; one output element per thread (the
// GEMMs, where the FLOPs are, are cuBLAS's).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "engine/cnn_cuda/cnn_kernels.h"

namespace stoke::cnn::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float Load(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
template <>
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <typename T>
__device__ __forceinline__ T Store(float v);
template <>
__device__ __forceinline__ __half Store(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float Act(const ActParams& a, float v) {
  switch (a.kind) {
    case 1:
      return fmaxf(v, 0.0f);
    case 2:
      return fminf(fmaxf(v, a.lo), a.hi);
    case 3:
      return fminf(fmaxf(a.alpha * v + a.beta, 0.0f), 1.0f);
    case 4:
      return v * fminf(fmaxf(v * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
    case 5:
      return 1.0f / (1.0f + __expf(-v));
    default:
      return v;
  }
}

unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// One warp per (output pixel, group, tap): the index arithmetic once per warp, the lanes copying the tap's
// channel run (contiguous in x and in cols), 8 channels (16 bytes) at a time when `vec` (runs and offsets
// multiples of 8).
template <typename T>
__global__ void Im2colKernel(const T* __restrict__ x, ConvGeom g, int64_t group_ld, int64_t ld, bool vec,
                             T* __restrict__ cols) {
  const int64_t cg = g.in_c / g.groups, taps = g.kernel_h * g.kernel_w;
  const int64_t items = g.batch * g.out_h * g.out_w * g.groups * taps;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t it = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; it < items; it += warps) {
    const int64_t tap = it % taps;
    int64_t t = it / taps;
    const int64_t grp = t % g.groups;
    const int64_t m = t / g.groups;
    const int64_t ow = m % g.out_w, oh = (m / g.out_w) % g.out_h, b = m / (g.out_w * g.out_h);
    const int64_t iy = oh * g.stride_h - g.pad_top + (tap / g.kernel_w) * g.dilation_h;
    const int64_t ix = ow * g.stride_w - g.pad_left + (tap % g.kernel_w) * g.dilation_w;
    const bool inside = iy >= 0 && iy < g.in_h && ix >= 0 && ix < g.in_w;
    const T* src = x + ((b * g.in_h + iy) * g.in_w + ix) * g.in_c + grp * cg;
    T* dst = cols + m * ld + grp * group_ld + tap * cg;
    if (vec) {
      for (int64_t c = lane * 8; c < cg; c += 32 * 8) {
        const uint4 v = inside ? *reinterpret_cast<const uint4*>(src + c) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(dst + c) = v;
      }
    } else {
      for (int64_t c = lane; c < cg; c += 32) dst[c] = inside ? src[c] : Store<T>(0.0f);
    }
  }
}

// I: uint32_t when rows * cols < 2^31 (the common case: 32-bit index arithmetic is several times cheaper
// than 64-bit on the GPU, and this runs after every convolution), else int64_t.
template <typename T, typename I>
__global__ void BiasActKernel(T* __restrict__ y, const float* __restrict__ bias, ActParams act, I rows,
                              I cols) {
  const I n = rows * cols;
  for (I i = blockIdx.x * I{blockDim.x} + threadIdx.x; i < n; i += I{gridDim.x} * blockDim.x) {
    float v = Load(y, i);
    if (bias != nullptr) v += bias[i % cols];
    y[i] = Store<T>(Act(act, v));
  }
}

// I as in BiasActKernel: the flat index's divisions in 32 bits when the output fits; coordinates signed.
template <typename T, typename I>
__global__ void DepthwiseKernel(const T* __restrict__ x, ConvGeom g, const T* __restrict__ w,
                                const float* __restrict__ bias, ActParams act, T* __restrict__ y) {
  const I out_c = static_cast<I>(g.out_c), out_w = static_cast<I>(g.out_w), out_h = static_cast<I>(g.out_h);
  const I mult = static_cast<I>(g.out_c / g.in_c);
  const I n = static_cast<I>(g.batch) * out_h * out_w * out_c;
  for (I i = blockIdx.x * I{blockDim.x} + threadIdx.x; i < n; i += I{gridDim.x} * blockDim.x) {
    const I oc = i % out_c;
    I t = i / out_c;
    const I ow = t % out_w;
    t /= out_w;
    const I oh = t % out_h, b = t / out_h;
    const int64_t ic = oc / mult;
    float acc = bias != nullptr ? bias[oc] : 0.0f;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t iy = int64_t{oh} * g.stride_h - g.pad_top + ky * g.dilation_h;
      if (iy < 0 || iy >= g.in_h) continue;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t ix = int64_t{ow} * g.stride_w - g.pad_left + kx * g.dilation_w;
        if (ix < 0 || ix >= g.in_w) continue;
        acc += Load(x, ((int64_t{b} * g.in_h + iy) * g.in_w + ix) * g.in_c + ic) *
               Load(w, (ky * g.kernel_w + kx) * g.out_c + oc);
      }
    }
    y[i] = Store<T>(Act(act, acc));
  }
}

template <typename T>
__global__ void PoolKernel(const T* __restrict__ x, PoolGeom g, T* __restrict__ y) {
  const int64_t c = g.channels;
  GRID_STRIDE(i, g.batch * g.out_h * g.out_w * c) {
    const int64_t ch = i % c;
    int64_t t = i / c;
    const int64_t ow = t % g.out_w;
    t /= g.out_w;
    const int64_t oh = t % g.out_h, b = t / g.out_h;
    float acc = g.max ? -INFINITY : 0.0f;
    int64_t valid = 0, padded = 0;
    for (int64_t ky = 0; ky < g.kernel_h; ++ky) {
      const int64_t iy = oh * g.stride_h - g.pad_top + ky * g.dilation_h;
      for (int64_t kx = 0; kx < g.kernel_w; ++kx) {
        const int64_t ix = ow * g.stride_w - g.pad_left + kx * g.dilation_w;
        if (iy >= -g.pad_top && iy < g.in_h + g.pad_bottom && ix >= -g.pad_left && ix < g.in_w + g.pad_right)
          ++padded;
        if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) continue;
        ++valid;
        const float v = Load(x, ((b * g.in_h + iy) * g.in_w + ix) * c + ch);
        acc = g.max ? fmaxf(acc, v) : acc + v;
      }
    }
    if (!g.max) {
      const int64_t div = g.count_include_pad ? padded : valid;
      acc = div > 0 ? acc / static_cast<float>(div) : 0.0f;
    }
    y[i] = Store<T>(acc);
  }
}

template <typename T>
__global__ void GlobalAvgPoolKernel(const T* __restrict__ x, int64_t batch, int64_t pixels, int64_t channels,
                                    T* __restrict__ y) {
  GRID_STRIDE(i, batch * channels) {
    const int64_t ch = i % channels, b = i / channels;
    const T* p = x + b * pixels * channels + ch;
    float acc = 0.0f;
    for (int64_t k = 0; k < pixels; ++k) acc += Load(p, k * channels);
    y[i] = Store<T>(acc / static_cast<float>(pixels));
  }
}

__device__ __forceinline__ float ApplyOp(char op, float a, float b) {
  return op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
}

template <typename T>
__global__ void BinaryKernel(BinaryGeom g, const T* __restrict__ a, const T* __restrict__ b, ActParams act,
                             T* y) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.dims[d];
  GRID_STRIDE(i, n) {
    int64_t oa = i, ob = i;
    if (!g.contiguous) {
      oa = 0, ob = 0;
      int64_t rem = i;
      for (int d = g.rank - 1; d >= 0; --d) {
        const int64_t c = rem % g.dims[d];
        rem /= g.dims[d];
        oa += c * g.sa[d];
        ob += c * g.sb[d];
      }
    }
    y[i] = Store<T>(Act(act, ApplyOp(g.op, Load(a, oa), Load(b, ob))));
  }
}

template <typename T>
__global__ void ChannelAffineKernel(const T* __restrict__ x, const float* __restrict__ scale,
                                    const float* __restrict__ shift, int64_t outer, int64_t len,
                                    int64_t inner, T* __restrict__ y) {
  GRID_STRIDE(i, outer * len * inner) {
    const int64_t c = (i / inner) % len;
    y[i] = Store<T>(Load(x, i) * scale[c] + shift[c]);
  }
}

// One thread per (outer, inner) row: the heads softmax here are a few thousand values at most.
template <typename T>
__global__ void SoftmaxKernel(const T* __restrict__ x, int64_t outer, int64_t len, int64_t inner,
                              T* __restrict__ y) {
  GRID_STRIDE(r, outer * inner) {
    const int64_t o = r / inner, in = r % inner;
    const T* xr = x + o * len * inner + in;
    T* yr = y + o * len * inner + in;
    float m = -INFINITY;
    for (int64_t k = 0; k < len; ++k) m = fmaxf(m, Load(xr, k * inner));
    float sum = 0.0f;
    for (int64_t k = 0; k < len; ++k) sum += __expf(Load(xr, k * inner) - m);
    const float inv = 1.0f / sum;
    for (int64_t k = 0; k < len; ++k) yr[k * inner] = Store<T>(__expf(Load(xr, k * inner) - m) * inv);
  }
}

// 32x32 tiles through shared memory: reads and writes both coalesced.
template <typename T>
__global__ void TransposeKernel(const T* __restrict__ x, int64_t a, int64_t b, T* __restrict__ y) {
  __shared__ T tile[32][33];
  const int64_t o = blockIdx.z;
  const T* xo = x + o * a * b;
  T* yo = y + o * a * b;
  const int64_t i0 = int64_t{blockIdx.y} * 32, j0 = int64_t{blockIdx.x} * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int64_t i = i0 + r, j = j0 + threadIdx.x;
    if (i < a && j < b) tile[r][threadIdx.x] = xo[i * b + j];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int64_t j = j0 + r, i = i0 + threadIdx.x;
    if (i < a && j < b) yo[j * a + i] = tile[threadIdx.x][r];
  }
}

template <typename T>
__global__ void ToElemKernel(const float* __restrict__ x, int64_t n, T* __restrict__ y) {
  GRID_STRIDE(i, n) {
    y[i] = Store<T>(x[i]);
  }
}

template <typename T>
__global__ void ToFloatKernel(const T* __restrict__ x, int64_t n, float* __restrict__ y) {
  GRID_STRIDE(i, n) {
    y[i] = Load(x, i);
  }
}

// Calls f with a typed null pointer of the storage type: f(static_cast<__half*>(nullptr)) etc.
template <typename F>
cudaError_t Dispatch(ElemType t, F&& f) {
  if (t == ElemType::kF16)
    f(static_cast<__half*>(nullptr));
  else
    f(static_cast<__nv_bfloat16*>(nullptr));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchIm2col(ElemType t, const void* x, const ConvGeom& g, int64_t group_ld, int64_t ld,
                         void* cols, cudaStream_t stream) {
  const int64_t cg = g.in_c / g.groups;
  const int64_t items = g.batch * g.out_h * g.out_w * g.groups * g.kernel_h * g.kernel_w;
  // 16-byte copies need 8-element runs and offsets, and 16-byte aligned buffers (cudaMalloc's are).
  const bool vec = cg % 8 == 0 && g.in_c % 8 == 0 && group_ld % 8 == 0 && ld % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(cols) % 16 == 0;
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    Im2colKernel<T><<<Blocks(items * 32), kThreads, 0, stream>>>(static_cast<const T*>(x), g, group_ld, ld,
                                                                 vec, static_cast<T*>(cols));
  });
}

cudaError_t LaunchBiasActivation(ElemType t, void* y, const float* bias, const ActParams& act, int64_t rows,
                                 int64_t cols, cudaStream_t stream) {
  if (bias == nullptr && act.kind == 0) return cudaSuccess;
  const bool narrow = rows * cols < (int64_t{1} << 31);
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (narrow) {
      BiasActKernel<T, uint32_t><<<Blocks(rows * cols), kThreads, 0, stream>>>(
          static_cast<T*>(y), bias, act, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols));
    } else {
      BiasActKernel<T, int64_t>
          <<<Blocks(rows * cols), kThreads, 0, stream>>>(static_cast<T*>(y), bias, act, rows, cols);
    }
  });
}

cudaError_t LaunchDepthwise(ElemType t, const void* x, const ConvGeom& g, const void* w, const float* bias,
                            const ActParams& act, void* y, cudaStream_t stream) {
  const int64_t n = g.batch * g.out_h * g.out_w * g.out_c;
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* xt = static_cast<const T*>(x);
    const auto* wt = static_cast<const T*>(w);
    if (n < (int64_t{1} << 31)) {
      DepthwiseKernel<T, uint32_t>
          <<<Blocks(n), kThreads, 0, stream>>>(xt, g, wt, bias, act, static_cast<T*>(y));
    } else {
      DepthwiseKernel<T, int64_t>
          <<<Blocks(n), kThreads, 0, stream>>>(xt, g, wt, bias, act, static_cast<T*>(y));
    }
  });
}

cudaError_t LaunchPool(ElemType t, const void* x, const PoolGeom& g, void* y, cudaStream_t stream) {
  const int64_t n = g.batch * g.out_h * g.out_w * g.channels;
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    PoolKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(x), g, static_cast<T*>(y));
  });
}

cudaError_t LaunchGlobalAvgPool(ElemType t, const void* x, int64_t batch, int64_t pixels, int64_t channels,
                                void* y, cudaStream_t stream) {
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    GlobalAvgPoolKernel<T><<<Blocks(batch * channels), kThreads, 0, stream>>>(
        static_cast<const T*>(x), batch, pixels, channels, static_cast<T*>(y));
  });
}

cudaError_t LaunchBinary(ElemType t, const BinaryGeom& g, const void* a, const void* b, const ActParams& act,
                         void* y, cudaStream_t stream) {
  int64_t n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.dims[d];
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    BinaryKernel<T><<<Blocks(n), kThreads, 0, stream>>>(g, static_cast<const T*>(a), static_cast<const T*>(b),
                                                        act, static_cast<T*>(y));
  });
}

cudaError_t LaunchChannelAffine(ElemType t, const void* x, const float* scale, const float* shift,
                                int64_t outer, int64_t len, int64_t inner, void* y, cudaStream_t stream) {
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ChannelAffineKernel<T><<<Blocks(outer * len * inner), kThreads, 0, stream>>>(
        static_cast<const T*>(x), scale, shift, outer, len, inner, static_cast<T*>(y));
  });
}

cudaError_t LaunchSoftmax(ElemType t, const void* x, int64_t outer, int64_t len, int64_t inner, void* y,
                          cudaStream_t stream) {
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    SoftmaxKernel<T><<<Blocks(outer * inner), kThreads, 0, stream>>>(static_cast<const T*>(x), outer, len,
                                                                     inner, static_cast<T*>(y));
  });
}

cudaError_t LaunchTranspose(ElemType t, const void* x, int64_t outer, int64_t a, int64_t b, void* y,
                            cudaStream_t stream) {
  if (outer > 65535) return cudaErrorInvalidValue;  // gridDim.z; a batch of that many images is refused
  const dim3 grid(static_cast<unsigned>((b + 31) / 32), static_cast<unsigned>((a + 31) / 32),
                  static_cast<unsigned>(outer));
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    TransposeKernel<T><<<grid, dim3(32, 8), 0, stream>>>(static_cast<const T*>(x), a, b, static_cast<T*>(y));
  });
}

cudaError_t LaunchToElem(ElemType t, const float* x, int64_t n, void* y, cudaStream_t stream) {
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ToElemKernel<T><<<Blocks(n), kThreads, 0, stream>>>(x, n, static_cast<T*>(y));
  });
}

cudaError_t LaunchToFloat(ElemType t, const void* x, int64_t n, float* y, cudaStream_t stream) {
  return Dispatch(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ToFloatKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, y);
  });
}

}  // namespace stoke::cnn::cuda
