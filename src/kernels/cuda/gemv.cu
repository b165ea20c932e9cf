#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"

namespace stoke::cuda {
namespace {

constexpr int kWarps = 8;     // output rows per block
constexpr int kInFlight = 8;  // 16-byte weight loads in flight per lane per row
constexpr int kChunk = 8;     // bf16 values per 16-byte load

// Weights are read once per step: stream them past L1 (x, re-read by every warp, stays there).
__device__ __forceinline__ uint4 LoadWeights(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float Dot8(const uint4& a, const uint4& b, float acc) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

__device__ __forceinline__ float Silu(float g) {
  return g / (1.f + expf(-g));
}

// Warp `w` of block b computes output row b * kWarps + w for every x row (and, with kSilu, the matching up
// row `inter` rows further, combined with SwiGLU). Every thread reaches PdlWait: a PDL kernel must not
// finish before the grid it depends on (the next kernel's wait relies on that chain).
template <int M, typename OutT, bool kSilu>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k, const __nv_bfloat16* __restrict__ x,
               OutT* __restrict__ y, int64_t ldy, int64_t up_rows) {
  PdlLaunchDependents();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const bool active = row < n;
  const int64_t chunks = k / kChunk;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (active ? row : 0) * k);
  const uint4* ur = reinterpret_cast<const uint4*>(w + (active ? row + up_rows : 0) * k);
  const uint4* xr = reinterpret_cast<const uint4*>(x);

  float acc[M], accu[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = accu[r] = 0.f;
  uint4 wv[kInFlight], uv[kInFlight];

  auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + u * 32;
      const bool ok = active && c < chunks;
      wv[u] = ok ? LoadWeights(wr + c) : make_uint4(0, 0, 0, 0);
      if constexpr (kSilu) uv[u] = ok ? LoadWeights(ur + c) : make_uint4(0, 0, 0, 0);
    }
  };
  auto consume = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + u * 32;
      if (c < chunks) {
#pragma unroll
        for (int r = 0; r < M; ++r) {
          const uint4 xv = __ldg(xr + r * chunks + c);
          acc[r] = Dot8(wv[u], xv, acc[r]);
          if constexpr (kSilu) accu[r] = Dot8(uv[u], xv, accu[r]);
        }
      }
    }
  };

  int64_t c0 = lane;
  load(c0);  // weights only: safe before the previous kernel has finished
  PdlWait();
  for (;;) {
    consume(c0);
    c0 += 32 * kInFlight;
    if (c0 - lane >= chunks) break;
    load(c0);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    acc[r] = WarpSum(acc[r]);
    if constexpr (kSilu) accu[r] = WarpSum(accu[r]);
  }
  if (lane == 0 && active) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if constexpr (kSilu) {
        const float g = __bfloat162float(__float2bfloat16_rn(acc[r]));
        const float u = __bfloat162float(__float2bfloat16_rn(accu[r]));
        y[r * ldy + row] = FromFloat<OutT>(Silu(g) * u);
      } else {
        y[r * ldy + row] = FromFloat<OutT>(acc[r]);
      }
    }
  }
}

template <int M, typename OutT, bool kSilu>
cudaError_t LaunchM(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, OutT* y,
                    int64_t ldy, int64_t up_rows, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(CeilDiv(n, kWarps));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, GemvKernel<M, OutT, kSilu>, w, n, k, x, y, ldy, up_rows);
}

template <typename OutT, bool kSilu>
Status Launch(const char* what, const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x,
              int64_t m, OutT* y, int64_t ldy, int64_t up_rows, bool pdl, cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": rows must be in [1, 8]");
  }
  if (k % kChunk != 0 || (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": k must be a multiple of 8 and w, x 16-byte aligned");
  }
  if (ldy < n) return Status(StatusCode::kInvalidArgument, std::string(what) + ": ldy < n");
  if (n <= 0 || k <= 0) return OkStatus();
  if (static_cast<int64_t>(CeilDiv(n, kWarps)) > 0x7fffffff) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": too many rows");
  }
  cudaError_t e = cudaSuccess;
  switch (m) {
    case 1:
      e = LaunchM<1, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 2:
      e = LaunchM<2, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 3:
      e = LaunchM<3, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 4:
      e = LaunchM<4, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 5:
      e = LaunchM<5, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 6:
      e = LaunchM<6, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    case 7:
      e = LaunchM<7, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
    default:
      e = LaunchM<8, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pdl, stream);
      break;
  }
  CUDA_RETURN_IF_ERROR(e);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
                __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream) {
  return Launch<__nv_bfloat16, false>("Bf16Gemv", w, n, k, x, m, y, ldy, 0, pdl, stream);
}
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m, float* y,
                int64_t ldy, bool pdl, cudaStream_t stream) {
  return Launch<float, false>("Bf16Gemv", w, n, k, x, m, y, ldy, 0, pdl, stream);
}
Status Bf16GemvSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const __nv_bfloat16* x, int64_t m,
                       __nv_bfloat16* y, bool pdl, cudaStream_t stream) {
  return Launch<__nv_bfloat16, true>("Bf16GemvSiluMul", w, inter, k, x, m, y, inter, inter, pdl, stream);
}

}  // namespace stoke::cuda
