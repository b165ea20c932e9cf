#include <cuda_fp16.h>

#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kquant_blocks.h"
#include "kernels/cuda/quant.h"

namespace stoke::cuda {
namespace {

constexpr int kQK = 32;
constexpr int kQ4_1Bytes = 20;  // d, m (fp16), 16 bytes of nibbles
constexpr int kQ8_0Bytes = 34;  // d (fp16), 32 int8
constexpr int kGemvWarps = 8;

// One warp per 32-value block: lane j produces value j.
template <bool kQ4>
__global__ void DequantKernel(const uint8_t* __restrict__ src, int64_t nb, __nv_bfloat16* __restrict__ dst) {
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int j = threadIdx.x & 31;
  if (b >= nb) return;
  float v;
  if constexpr (kQ4) {
    const uint8_t* x = src + b * kQ4_1Bytes;
    const float d = kquant::LoadHalfBits(x), m = kquant::LoadHalfBits(x + 2);
    const uint8_t q = x[4 + (j & 15)];
    const int qi = j < 16 ? (q & 0x0F) : (q >> 4);
    v = __fadd_rn(__fmul_rn(static_cast<float>(qi), d), m);
  } else {
    const uint8_t* x = src + b * kQ8_0Bytes;
    const float d = kquant::LoadHalfBits(x);
    v = __fmul_rn(static_cast<float>(static_cast<int8_t>(x[2 + j])), d);
  }
  dst[b * kQK + j] = __float2bfloat16_rn(v);
}

// One thread per value of K-quant super-blocks (Q4_K or Q6_K), through the host-tested block code.
template <bool kQ4K>
__global__ void DequantKKernel(const uint8_t* __restrict__ src, int64_t n, __nv_bfloat16* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t b = i / kquant::kValues;
  const int v = static_cast<int>(i % kquant::kValues);
  const float f = kQ4K ? kquant::Q4KValue(src + b * kquant::kQ4KBytes, v)
                       : kquant::Q6KValue(src + b * kquant::kQ6KBytes, v);
  dst[i] = __float2bfloat16_rn(f);
}

// Loads `kN` consecutive activations (kN % 8 == 0; 16-byte aligned) into registers.
template <int kN>
__device__ __forceinline__ void LoadXRun(const float* x, float* v) {
  const float4* p = reinterpret_cast<const float4*>(x);
#pragma unroll
  for (int i = 0; i < kN / 4; ++i) {
    const float4 f = p[i];
    v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
  }
}
template <int kN>
__device__ __forceinline__ void LoadXRun(const __nv_bfloat16* x, float* v) {
  const uint4* p = reinterpret_cast<const uint4*>(x);
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
    uint4 u = p[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      v[8 * i + 2 * j] = f.x, v[8 * i + 2 * j + 1] = f.y;
    }
  }
}

// The m = 1 GEMV over K-quant rows: kRows rows per warp, eight lanes per super-block (lane & 7 is the part of
// kquant_blocks.h), so a warp reads 4 consecutive super-blocks of each of its rows (576 / 840 bytes a row)
// per iteration. A lane's activations, converted (and summed or quantised) once, serve all kRows rows, whose
// loads are issued before any of their arithmetic. Rows past n repeat row n - 1 and are not stored; every lane
// runs every iteration (a lane past the last super-block re-reads it and adds nothing), so the shuffles of
// kInt8X see all 32 lanes. kInt8X: the activations quantised per 32-block as the CPU engine does (KGemvMath).
// kSilu (SwiGLU): each output row o reads row o of w (gate) and of w_up (up), y[o] = silu(bf16(g)) · bf16(u)
// as the unfused GEMV + SiluMulFused computes it; a warp then reads 2 kRows rows.
template <bool kQ4K, bool kInt8X, int kRows, bool kSilu, typename T, typename Ty>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvKKernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_up, int64_t n, int64_t nb,
                const T* __restrict__ x, Ty* __restrict__ y) {
  constexpr int kLoad = kSilu ? 2 * kRows : kRows;  // matrix rows a warp reads
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5)) * kRows;
  const int lane = threadIdx.x & 31, part = lane & 7;
  if (row0 >= n) return;
  constexpr int kBytes = kQ4K ? kquant::kQ4KBytes : kquant::kQ6KBytes;
  const uint8_t* wr[kLoad];
  float sum[kLoad];
#pragma unroll
  for (int r = 0; r < kLoad; ++r) {
    wr[r] = (r < kRows ? w : w_up) + min(row0 + r % kRows, n - 1) * nb * kBytes;
    sum[r] = 0.f;
  }
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {
    const int64_t b = min(b0 + (lane >> 3), nb - 1);
    const float live = b0 + (lane >> 3) < nb ? 1.f : 0.f;
    const T* xb = x + b * kquant::kValues;
    if constexpr (kQ4K) {
      uint32_t head[kLoad][4], qs[kLoad][4];
#pragma unroll
      for (int r = 0; r < kLoad; ++r) kquant::Q4KLoadPart(wr[r] + b * kBytes, part, head[r], qs[r]);
      float xa[16], xc[16];
      const int a = kquant::Q4KPartA(part);
      LoadXRun<16>(xb + a, xa);
      LoadXRun<16>(xb + a + 32, xc);
      if constexpr (kInt8X) {
        // Lanes part and part ^ 1 hold the two halves of both 32-blocks.
        float ma = kquant::AbsMax(xa, 16), mc = kquant::AbsMax(xc, 16);
        ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, 1));
        mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, 1));
        uint32_t qa[4], qc[4];
        const int sa = kquant::QuantizeActs<16>(xa, ma, qa), sc = kquant::QuantizeActs<16>(xc, mc, qc);
        const float da = kquant::ActScale(ma), dc = kquant::ActScale(mc);
#pragma unroll
        for (int r = 0; r < kLoad; ++r) {
          sum[r] += live * kquant::Q4KPartDotQ8(head[r], qs[r], part, qa, qc, da, dc, sa, sc);
        }
      } else {
        float sa, sc;
        kquant::Q4KPartXSums(xa, xc, &sa, &sc);
#pragma unroll
        for (int r = 0; r < kLoad; ++r) {
          sum[r] += live * kquant::Q4KPartDot(head[r], qs[r], part, xa, xc, sa, sc);
        }
      }
    } else {
      float xg[4][8];
#pragma unroll
      for (int g = 0; g < 4; ++g) LoadXRun<8>(xb + kquant::Q6KPartX(part, g), xg[g]);
      if constexpr (kInt8X) {
        // Lanes part ^ 1, ^ 2 and ^ 3 (the same half of the super-block) hold the rest of each 32-block.
        uint32_t qx[4][2];
        float dx[4];
        int sx[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          float m = kquant::AbsMax(xg[g], 8);
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          sx[g] = kquant::QuantizeActs<8>(xg[g], m, qx[g]);
          dx[g] = kquant::ActScale(m);
        }
#pragma unroll
        for (int r = 0; r < kLoad; ++r) {
          sum[r] += live * kquant::Q6KPartDotQ8(wr[r] + b * kBytes, part, qx, dx, sx);
        }
      } else {
#pragma unroll
        for (int r = 0; r < kLoad; ++r) sum[r] += live * kquant::Q6KPartDot(wr[r] + b * kBytes, part, xg);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float g = WarpSum(sum[r]);
    if constexpr (kSilu) {
      const float u = WarpSum(sum[kRows + r]);
      if (lane == 0 && row0 + r < n) {
        y[row0 + r] = FromFloat<Ty>(Silu(__bfloat162float(__float2bfloat16_rn(g))) *
                                    __bfloat162float(__float2bfloat16_rn(u)));
      }
    } else if (lane == 0 && row0 + r < n) {
      y[row0 + r] = FromFloat<Ty>(g);
    }
  }
}

// grid = ceil(n / kGemvWarps), block = kGemvWarps warps; warp w computes row blockIdx.x * kGemvWarps + w, its
// lanes taking blocks lane, lane + 32, ... of the row (a warp reads 32 consecutive blocks at a time).
template <bool kQ4, typename T, typename Ty>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvKernel(const uint8_t* __restrict__ w, int64_t n, int64_t nb, const T* __restrict__ x,
               Ty* __restrict__ y) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  constexpr int kBytes = kQ4 ? kQ4_1Bytes : kQ8_0Bytes;
  const uint8_t* wr = w + row * nb * kBytes;
  float sum = 0.f;
  for (int64_t b = lane; b < nb; b += 32) {
    float xv[kQK];
    LoadXRun<kQK>(x + b * kQK, xv);
    const uint8_t* blk = wr + b * kBytes;
    const float d = kquant::LoadHalfBits(blk);
    float dot = 0.f;
    if constexpr (kQ4) {
      const float m = kquant::LoadHalfBits(blk + 2);
      float xs = 0.f;
      const uint32_t* q4 = reinterpret_cast<const uint32_t*>(blk + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t q = q4[i];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t byte = (q >> (8 * j)) & 0xFFu;
          const int e = 4 * i + j;
          dot += static_cast<float>(byte & 0x0Fu) * xv[e] + static_cast<float>(byte >> 4) * xv[e + 16];
          xs += xv[e] + xv[e + 16];
        }
      }
      sum += d * dot + m * xs;
    } else {
      const unsigned short* q2 = reinterpret_cast<const unsigned short*>(blk + 2);
#pragma unroll
      for (int i = 0; i < kQK / 2; ++i) {
        const unsigned short q = q2[i];
        dot += static_cast<float>(static_cast<int8_t>(q & 0xFF)) * xv[2 * i] +
               static_cast<float>(static_cast<int8_t>(q >> 8)) * xv[2 * i + 1];
      }
      sum += d * dot;
    }
  }
  sum = WarpSum(sum);
  if (lane == 0) y[row] = FromFloat<Ty>(sum);
}

// One thread per value: block b's 32 int8 values to q[32 b ..], its fp16 d (bit copy) to d[b].
__global__ void RepackQ8Kernel(const uint8_t* __restrict__ src, int64_t nb, int8_t* __restrict__ q,
                               __half* __restrict__ d) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nb * kQK) return;
  const int64_t b = i / kQK;
  const int j = static_cast<int>(i % kQK);
  const uint8_t* blk = src + b * kQ8_0Bytes;
  q[i] = static_cast<int8_t>(blk[2 + j]);
  if (j == 0) {
    const unsigned short bits = static_cast<unsigned short>(blk[0] | (blk[1] << 8));
    d[b] = __ushort_as_half(bits);
  }
}

bool IsK(DType t) {
  return t == DType::kQ4_K || t == DType::kQ6_K;
}

Status CheckType(const char* what, DType t, int64_t k) {
  if (t != DType::kQ4_1 && t != DType::kQ8_0 && !IsK(t)) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": only Q4_1, Q8_0, Q4_K and Q6_K are supported");
  }
  if (k % (IsK(t) ? kquant::kValues : kQK) != 0) {
    return Status(
        StatusCode::kInvalidArgument,
        std::string(what) + (IsK(t) ? ": length not a multiple of 256" : ": length not a multiple of 32"));
  }
  return OkStatus();
}

template <bool kQ4K, bool kInt8X, int kRows, bool kSilu, typename T, typename Ty>
void LaunchGemvK(const uint8_t* w, const uint8_t* w_up, int64_t n, int64_t k, const T* x, Ty* y,
                 cudaStream_t stream) {
  GemvKKernel<kQ4K, kInt8X, kRows, kSilu, T, Ty>
      <<<CeilDiv(n, kGemvWarps * kRows), kGemvWarps * 32, 0, stream>>>(w, w_up, n, k / kquant::kValues, x, y);
}

template <bool kQ4K, bool kInt8X, bool kSilu, typename T, typename Ty>
void LaunchGemvK(int rows_per_warp, const uint8_t* w, const uint8_t* w_up, int64_t n, int64_t k, const T* x,
                 Ty* y, cudaStream_t stream) {
  switch (rows_per_warp) {
    case 1:
      return LaunchGemvK<kQ4K, kInt8X, 1, kSilu>(w, w_up, n, k, x, y, stream);
    case 4:
      return LaunchGemvK<kQ4K, kInt8X, 4, kSilu>(w, w_up, n, k, x, y, stream);
    default:
      return LaunchGemvK<kQ4K, kInt8X, 2, kSilu>(w, w_up, n, k, x, y, stream);
  }
}

template <bool kQ4K, bool kSilu = false, typename T, typename Ty>
void LaunchGemvK(KGemvMath math, int rows_per_warp, const uint8_t* w, const uint8_t* w_up, int64_t n,
                 int64_t k, const T* x, Ty* y, cudaStream_t stream) {
  const DType t = kQ4K ? DType::kQ4_K : DType::kQ6_K;
  const int64_t rows = kSilu ? 2 * n : n;  // a SwiGLU launch reads gate and up rows
  if (math == KGemvMath::kAuto) math = KGemvAuto(t, rows);
  if (rows_per_warp == 0) rows_per_warp = KGemvRowsPerWarp(t, rows, math);
  if (math == KGemvMath::kInt8Activations) {
    LaunchGemvK<kQ4K, true, kSilu>(rows_per_warp, w, w_up, n, k, x, y, stream);
  } else {
    LaunchGemvK<kQ4K, false, kSilu>(rows_per_warp, w, w_up, n, k, x, y, stream);
  }
}

Status CheckRowsPerWarp(const char* what, int rows_per_warp) {
  if (rows_per_warp == 0 || rows_per_warp == 1 || rows_per_warp == 2 || rows_per_warp == 4) return OkStatus();
  return Status(StatusCode::kInvalidArgument, std::string(what) + ": rows_per_warp " +
                                                  std::to_string(rows_per_warp) + ", expected 0 (auto), 1, 2 or 4");
}

}  // namespace

KGemvMath KGemvAuto(DType t, int64_t rows) {
  return t == DType::kQ4_K || rows >= 8192 ? KGemvMath::kInt8Activations : KGemvMath::kFp32;
}

int KGemvRowsPerWarp(DType t, int64_t rows, KGemvMath math) {
  // Four rows where int8 activations are both asked for and auto's choice.
  if (math == KGemvMath::kAuto) math = KGemvAuto(t, rows);
  return math == KGemvMath::kInt8Activations && KGemvAuto(t, rows) == math ? 4 : 2;
}

const char* KGemvMathName(KGemvMath math) {
  return math == KGemvMath::kAuto ? "auto" : math == KGemvMath::kFp32 ? "fp32" : "int8";
}

namespace {

template <typename T, typename Ty>
Status LaunchGemv(DType t, const void* w, int64_t n, int64_t k, const T* x, Ty* y, cudaStream_t stream,
                  int rows_per_warp, KGemvMath math) {
  RETURN_IF_ERROR(CheckType("QuantGemv", t, k));
  RETURN_IF_ERROR(CheckRowsPerWarp("QuantGemv", rows_per_warp));
  if (n <= 0 || k <= 0) return OkStatus();
  const unsigned grid = CeilDiv(n, kGemvWarps);
  const auto* wb = static_cast<const uint8_t*>(w);
  if (t == DType::kQ4_K) {
    LaunchGemvK<true>(math, rows_per_warp, wb, nullptr, n, k, x, y, stream);
  } else if (t == DType::kQ6_K) {
    LaunchGemvK<false>(math, rows_per_warp, wb, nullptr, n, k, x, y, stream);
  } else if (t == DType::kQ4_1) {
    GemvKernel<true, T, Ty><<<grid, kGemvWarps * 32, 0, stream>>>(wb, n, k / kQK, x, y);
  } else {
    GemvKernel<false, T, Ty><<<grid, kGemvWarps * 32, 0, stream>>>(wb, n, k / kQK, x, y);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status DequantizeToBf16(DType t, const void* src, int64_t n, __nv_bfloat16* dst, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckType("DequantizeToBf16", t, n));
  if (n <= 0) return OkStatus();
  const unsigned grid = CeilDiv(n, 256);
  const auto* s = static_cast<const uint8_t*>(src);
  if (IsK(t)) {
    if (t == DType::kQ4_K) {
      DequantKKernel<true><<<grid, 256, 0, stream>>>(s, n, dst);
    } else {
      DequantKKernel<false><<<grid, 256, 0, stream>>>(s, n, dst);
    }
  } else if (t == DType::kQ4_1) {
    DequantKernel<true><<<grid, 256, 0, stream>>>(s, n / kQK, dst);
  } else {
    DequantKernel<false><<<grid, 256, 0, stream>>>(s, n / kQK, dst);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status RepackQ8_0(const void* src, int64_t rows, int64_t cols, int64_t alloc_rows, int8_t* q, __half* d,
                  cudaStream_t stream) {
  if (cols % kQK != 0 || alloc_rows < rows) {
    return Status(StatusCode::kInvalidArgument,
                  "RepackQ8_0: cols not a multiple of 32, or alloc_rows < rows");
  }
  const int64_t nb = rows * (cols / kQK);
  if (alloc_rows > rows) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(q + rows * cols, 0, (alloc_rows - rows) * cols, stream));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(d + nb, 0, (alloc_rows - rows) * (cols / kQK) * sizeof(__half), stream));
  }
  if (nb <= 0) return OkStatus();
  RepackQ8Kernel<<<CeilDiv(nb * kQK, 256), 256, 0, stream>>>(static_cast<const uint8_t*>(src), nb, q, d);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const float* x, float* y, cudaStream_t stream,
                 int rows_per_warp, KGemvMath math) {
  return LaunchGemv(t, w, n, k, x, y, stream, rows_per_warp, math);
}
Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const __nv_bfloat16* x, __nv_bfloat16* y,
                 cudaStream_t stream, int rows_per_warp, KGemvMath math) {
  return LaunchGemv(t, w, n, k, x, y, stream, rows_per_warp, math);
}
Status QuantGemv(DType t, const void* w, int64_t n, int64_t k, const __nv_bfloat16* x, float* y,
                 cudaStream_t stream, int rows_per_warp, KGemvMath math) {
  return LaunchGemv(t, w, n, k, x, y, stream, rows_per_warp, math);
}

Status QuantGemvSiluMul(DType t, const void* w_gate, const void* w_up, int64_t inter, int64_t k,
                        const __nv_bfloat16* x, __nv_bfloat16* y, cudaStream_t stream, int rows_per_warp,
                        KGemvMath math) {
  RETURN_IF_ERROR(CheckType("QuantGemvSiluMul", t, k));
  if (t != DType::kQ4_K && t != DType::kQ6_K) {
    return Status(StatusCode::kInvalidArgument, "QuantGemvSiluMul: only Q4_K and Q6_K are supported");
  }
  RETURN_IF_ERROR(CheckRowsPerWarp("QuantGemvSiluMul", rows_per_warp));
  if (inter <= 0 || k <= 0) return OkStatus();
  const auto* g = static_cast<const uint8_t*>(w_gate);
  const auto* u = static_cast<const uint8_t*>(w_up);
  if (t == DType::kQ4_K) {
    LaunchGemvK<true, true>(math, rows_per_warp, g, u, inter, k, x, y, stream);
  } else {
    LaunchGemvK<false, true>(math, rows_per_warp, g, u, inter, k, x, y, stream);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
