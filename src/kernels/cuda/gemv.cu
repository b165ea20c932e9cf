#include <type_traits>

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

// Lookahead: block b asks L2 for its share of [pf, pf + pf_bytes) (the next projection's weights) once its
// own loads are done, so HBM keeps streaming through this kernel's tail and the latency-bound kernels that
// follow (RoPE, attention, norms), and the next projection starts from L2. Bulk prefetches are hints: they
// return at once and are never waited for. pf and pf_bytes are multiples of 16.
__device__ __forceinline__ void PrefetchShareL2(const char* pf, int64_t pf_bytes) {
  if (pf == nullptr || pf_bytes <= 0) return;
  constexpr int64_t kPiece = 4096;
  const int64_t blocks = gridDim.x;
  const int64_t share = ((pf_bytes + blocks - 1) / blocks + kPiece - 1) / kPiece * kPiece;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * share;
  const int64_t end = begin + share < pf_bytes ? begin + share : pf_bytes;
  for (int64_t off = begin + static_cast<int64_t>(threadIdx.x) * kPiece; off < end;
       off += static_cast<int64_t>(blockDim.x) * kPiece) {
    const uint32_t size = static_cast<uint32_t>(end - off < kPiece ? end - off : kPiece);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(pf + off), "r"(size) : "memory");
#endif
  }
}

__device__ __forceinline__ float Silu(float g) {
  return g / (1.f + expf(-g));
}

// Warp `w` of block b computes output row b * kWarps + w for every x row (and, with kSilu, the matching up
// row `inter` rows further, combined with SwiGLU). Every thread reaches PdlWait: a PDL kernel must not
// finish before the grid it depends on (the next kernel's wait relies on that chain). Dependents are let
// launch only after the main loop: earlier, their waiting blocks would take the SM slots of this kernel's
// later waves.
// The fused forms (one row only): kNorm computes x = bf16(rmsnorm(norm.residual) * norm.weight) in shared
// memory first (the residual fp32, as AddRmsNorm leaves it); kAdd adds bf16(y) into y = the fp32 residual
// instead of storing (AddRmsNorm's "residual += delta" with the delta rounded to bf16 as it is when stored).
struct NormIn {
  const float* residual = nullptr;
  const float* weight = nullptr;
  float eps = 0.f;
};

template <int M, typename OutT, bool kSilu, bool kNorm = false, bool kAdd = false>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const __nv_bfloat16* __restrict__ w, int64_t n, int64_t k, const __nv_bfloat16* __restrict__ x,
               OutT* __restrict__ y, int64_t ldy, int64_t up_rows, const char* pf, int64_t pf_bytes,
               NormIn norm) {
  static_assert(!(kNorm || kAdd) || M == 1, "fused norm / residual add: one row");
  static_assert(!kAdd || std::is_same_v<OutT, float>, "kAdd accumulates into the fp32 residual");
  extern __shared__ uint4 xs_shared[];  // kNorm: the normalised row, k bf16
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const bool active = row < n;
  const int64_t chunks = k / kChunk;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (active ? row : 0) * k);
  const uint4* ur = reinterpret_cast<const uint4*>(w + (active ? row + up_rows : 0) * k);
  const uint4* xr = kNorm ? xs_shared : reinterpret_cast<const uint4*>(x);

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
          const uint4 xv = kNorm ? xr[c] : __ldg(xr + r * chunks + c);
          acc[r] = Dot8(wv[u], xv, acc[r]);
          if constexpr (kSilu) accu[r] = Dot8(uv[u], xv, accu[r]);
        }
      }
    }
  };

  int64_t c0 = lane;
  load(c0);  // weights only: safe before the previous kernel has finished
  PdlWait();
  if constexpr (kNorm) {  // while the first weight loads are in flight
    __shared__ float scratch[32];
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      const float v = norm.residual[i];
      sum += v * v;
    }
    const float scale = rsqrtf(BlockSum(sum, scratch) / static_cast<float>(k) + norm.eps);
    __nv_bfloat16* xb = reinterpret_cast<__nv_bfloat16*>(xs_shared);
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      xb[i] = __float2bfloat16_rn(norm.residual[i] * scale * norm.weight[i]);
    }
    __syncthreads();
  }
  for (;;) {
    consume(c0);
    c0 += 32 * kInFlight;
    if (c0 - lane >= chunks) break;
    load(c0);
  }
  PdlLaunchDependents();
  PrefetchShareL2(pf, pf_bytes);
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
      } else if constexpr (kAdd) {
        y[r * ldy + row] += __bfloat162float(__float2bfloat16_rn(acc[r]));
      } else {
        y[r * ldy + row] = FromFloat<OutT>(acc[r]);
      }
    }
  }
}

template <int M, typename OutT, bool kSilu>
cudaError_t LaunchM(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, OutT* y,
                    int64_t ldy, int64_t up_rows, const GemvPrefetch& pf, bool pdl, cudaStream_t stream) {
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
  const char* pf_ptr = static_cast<const char*>(pf.ptr);
  const int64_t pf_bytes = pf_ptr == nullptr ? 0 : pf.bytes / 16 * 16;
  return cudaLaunchKernelEx(&cfg, GemvKernel<M, OutT, kSilu>, w, n, k, x, y, ldy, up_rows, pf_ptr, pf_bytes,
                            NormIn{});
}

template <typename OutT, bool kSilu>
Status Launch(const char* what, const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x,
              int64_t m, OutT* y, int64_t ldy, int64_t up_rows, const GemvPrefetch& pf, bool pdl,
              cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": rows must be in [1, 8]");
  }
  if (k % kChunk != 0 || (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": k must be a multiple of 8 and w, x 16-byte aligned");
  }
  if (ldy < n) return Status(StatusCode::kInvalidArgument, std::string(what) + ": ldy < n");
  if (pf.ptr != nullptr && (reinterpret_cast<uintptr_t>(pf.ptr) % 16 != 0 || pf.bytes < 0)) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": prefetch must be 16-byte aligned");
  }
  if (n <= 0 || k <= 0) return OkStatus();
  if (static_cast<int64_t>(CeilDiv(n, kWarps)) > 0x7fffffff) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": too many rows");
  }
  cudaError_t e = cudaSuccess;
  switch (m) {
    case 1:
      e = LaunchM<1, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 2:
      e = LaunchM<2, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 3:
      e = LaunchM<3, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 4:
      e = LaunchM<4, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 5:
      e = LaunchM<5, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 6:
      e = LaunchM<6, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    case 7:
      e = LaunchM<7, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
    default:
      e = LaunchM<8, OutT, kSilu>(w, n, k, x, y, ldy, up_rows, pf, pdl, stream);
      break;
  }
  CUDA_RETURN_IF_ERROR(e);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

// The one-row fused forms (see NormIn).
template <typename OutT, bool kSilu, bool kNorm, bool kAdd>
Status LaunchFused(const char* what, const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x,
                   OutT* y, int64_t up_rows, const NormIn& norm, const GemvPrefetch& pf, bool pdl,
                   cudaStream_t stream) {
  if (k % kChunk != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 ||
      (!kNorm && reinterpret_cast<uintptr_t>(x) % 16 != 0)) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": k must be a multiple of 8 and w, x 16-byte aligned");
  }
  if (kNorm && k * static_cast<int64_t>(sizeof(__nv_bfloat16)) > 48 * 1024) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": k over 24576");
  }
  if (pf.ptr != nullptr && (reinterpret_cast<uintptr_t>(pf.ptr) % 16 != 0 || pf.bytes < 0)) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": prefetch must be 16-byte aligned");
  }
  if (n <= 0 || k <= 0) return OkStatus();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(CeilDiv(n, kWarps));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = kNorm ? static_cast<size_t>(k) * sizeof(__nv_bfloat16) : 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const char* pf_ptr = static_cast<const char*>(pf.ptr);
  const int64_t pf_bytes = pf_ptr == nullptr ? 0 : pf.bytes / 16 * 16;
  CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&cfg, GemvKernel<1, OutT, kSilu, kNorm, kAdd>, w, n, k, x, y, n,
                                          up_rows, pf_ptr, pf_bytes, norm));
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
                __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, const GemvPrefetch& next) {
  return Launch<__nv_bfloat16, false>("Bf16Gemv", w, n, k, x, m, y, ldy, 0, next, pdl, stream);
}
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m, float* y,
                int64_t ldy, bool pdl, cudaStream_t stream, const GemvPrefetch& next) {
  return Launch<float, false>("Bf16Gemv", w, n, k, x, m, y, ldy, 0, next, pdl, stream);
}
Status Bf16GemvSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const __nv_bfloat16* x, int64_t m,
                       __nv_bfloat16* y, bool pdl, cudaStream_t stream, const GemvPrefetch& next) {
  return Launch<__nv_bfloat16, true>("Bf16GemvSiluMul", w, inter, k, x, m, y, inter, inter, next, pdl, stream);
}

Status Bf16GemvNorm(const __nv_bfloat16* w, int64_t n, int64_t k, const float* residual, const float* norm_weight,
                    float eps, __nv_bfloat16* y, bool pdl, cudaStream_t stream, const GemvPrefetch& next) {
  return LaunchFused<__nv_bfloat16, false, true, false>("Bf16GemvNorm", w, n, k, nullptr, y, 0,
                                                        NormIn{residual, norm_weight, eps}, next, pdl, stream);
}
Status Bf16GemvNormSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const float* residual,
                           const float* norm_weight, float eps, __nv_bfloat16* y, bool pdl, cudaStream_t stream,
                           const GemvPrefetch& next) {
  return LaunchFused<__nv_bfloat16, true, true, false>("Bf16GemvNormSiluMul", w, inter, k, nullptr, y, inter,
                                                       NormIn{residual, norm_weight, eps}, next, pdl, stream);
}
Status Bf16GemvAddResidual(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, float* residual,
                           bool pdl, cudaStream_t stream, const GemvPrefetch& next) {
  return LaunchFused<float, false, false, true>("Bf16GemvAddResidual", w, n, k, x, residual, 0, NormIn{}, next,
                                                pdl, stream);
}

}  // namespace stoke::cuda
