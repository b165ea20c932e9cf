#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/mma.cuh"

namespace stoke::cuda {
namespace {

constexpr int kWarps = 8;               // warps per block
constexpr int kInFlight = 8;            // 16-byte weight loads in flight per lane per row
constexpr int kRound = 32 * kInFlight;  // chunks a warp reads per round
// The weight formats the kernel streams: bf16; fp8 E4M3 with one fp32 scale per row; GGUF Q8_0 repacked as
// int8 values [n, k] plus one fp16 scale per 32 values of a row ([n, k / 32], RepackQ8_0 in quant.h).
enum class WFmt { kBf16, kFp8, kQ8 };
// Weight values per 16-byte load (a "chunk"): 8 bf16, or 16 fp8 / int8.
template <WFmt F>
constexpr int kChunkValues = F == WFmt::kBf16 ? 8 : 16;

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

// Weights 2p and 2p + 1 of a 16-byte chunk of 1-byte values as fp32 (`word` = the chunk's 32-bit word p / 2).
// fp8 E4M3: the byte pair converted to half2 by one cvt (sm_89+), exact in half. int8 (Q8_0): each byte made
// an exact fp32 without I2F (a quarter-rate conversion): (q ^ 0x80) placed in the mantissa of 2^23 gives
// 2^23 + 128 + q, and one subtraction leaves q.
template <WFmt F>
__device__ __forceinline__ float2 BytePair(uint32_t word, int p) {
  if constexpr (F == WFmt::kFp8) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(p % 2 == 0 ? word & 0xffffu : word >> 16);
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2*>(&hr));
  } else {
    const uint32_t u = word ^ 0x80808080u;
    const uint32_t b = 2 * (p % 2);  // the pair's first byte in the word
    return make_float2(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | b)) - 8388736.f,
                       __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | (b + 1))) - 8388736.f);
  }
}

// Σ of 16 1-byte weights (one 16-byte chunk, unscaled) times 16 bf16 activations (two 16-byte loads of x),
// multiplied in fp32. Four independent partial sums: one chain of 16 dependent FMAs per chunk left the warp
// waiting on FMA latency (measured on the H200: the 8B fp8 batch-1 step at 2.37 TB/s with one chain vs 3.26
// for bf16).
template <WFmt F>
__device__ __forceinline__ float Dot16Bytes(const uint4& w, const uint4& xa, const uint4& xb) {
  const uint32_t* pw = reinterpret_cast<const uint32_t*>(&w);
  const __nv_bfloat162* px[2] = {reinterpret_cast<const __nv_bfloat162*>(&xa),
                                 reinterpret_cast<const __nv_bfloat162*>(&xb)};
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 fw = BytePair<F>(pw[i / 2], i);
    const float2 fx = __bfloat1622float2(px[i / 4][i % 4]);
    s[i % 4] = fmaf(fw.x, fx.x, s[i % 4]);
    s[i % 4] = fmaf(fw.y, fx.y, s[i % 4]);
  }
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// One chunk's contribution: the weights `wv` against the x values of chunk c of row r (xr in 16-byte units);
// `d` is the chunk's Q8_0 block scale (unused otherwise).
template <WFmt F>
__device__ __forceinline__ float DotChunk(const uint4& wv, const uint4* xr, int64_t c, float d, float acc) {
  if constexpr (F == WFmt::kFp8) {
    return acc + Dot16Bytes<F>(wv, __ldg(xr + 2 * c), __ldg(xr + 2 * c + 1));
  } else if constexpr (F == WFmt::kQ8) {
    return fmaf(d, Dot16Bytes<F>(wv, __ldg(xr + 2 * c), __ldg(xr + 2 * c + 1)), acc);
  } else {
    return Dot8(wv, __ldg(xr + c), acc);
  }
}

// kSplit warps share an output row, each taking a contiguous 1/kSplit of its k range; block b computes rows
// [b * kWarps / kSplit, (b + 1) * kWarps / kSplit) for every x row (and, with kSilu, the matching up rows
// `up_rows` further, combined with SwiGLU). The slices' sums meet in shared memory and are added in slice
// order (deterministic). Every thread reaches PdlWait: a PDL kernel must not finish before the grid it
// depends on (the next kernel's wait relies on that chain). Dependents may launch once the main loop is done:
// letting them launch at the kernel's start instead made the 8B batch-1 step slower (H100, 12-06: 5.82 vs
// 5.71 ms bf16, 3.79 vs 3.70 ms fp8 weights, 6.29 vs 6.19 ms at context 4096).
//
// F = kFp8: w holds fp8 E4M3 bytes and `scale` one fp32 per row of w; a row's sum is multiplied by its scale
// (gate and up rows by their own). F = kQ8: w holds int8 values and `scale` one fp16 per 32 values of a row
// (a chunk's sum is scaled by its block's). F = kBf16: w is bf16 and scale unused.
template <int M, typename OutT, bool kSilu, int kSplit, WFmt F>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const void* __restrict__ w, const void* __restrict__ scale, int64_t n, int64_t k,
               const __nv_bfloat16* __restrict__ x, OutT* __restrict__ y, int64_t ldy, int64_t up_rows) {
  constexpr int kRowsPerBlock = kWarps / kSplit;
  __shared__ float part[kSplit > 1 ? kWarps : 1][M][kSilu ? 2 : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slice = warp % kSplit;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / kSplit;
  const bool active = row < n;
  constexpr int kChunk = kChunkValues<F>;
  constexpr int kBytes = F == WFmt::kBf16 ? 2 : 1;  // per weight value
  constexpr bool kQ8 = F == WFmt::kQ8;
  const int64_t chunks = k / kChunk;
  const int64_t per = (chunks + kSplit - 1) / kSplit;
  const int64_t begin = slice * per;
  const int64_t end = begin + per < chunks ? begin + per : chunks;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint4* wr = reinterpret_cast<const uint4*>(wb + (active ? row : 0) * k * kBytes);
  const uint4* ur = reinterpret_cast<const uint4*>(wb + (active ? row + up_rows : 0) * k * kBytes);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  // Q8: the rows' block scales (one per two chunks).
  const __half* ws = static_cast<const __half*>(scale) + (active ? row : 0) * (k / 32);
  const __half* us = static_cast<const __half*>(scale) + (active ? row + up_rows : 0) * (k / 32);

  float acc[M], accu[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = accu[r] = 0.f;
  uint4 wv[kInFlight], uv[kInFlight];
  float wd[kQ8 ? kInFlight : 1], ud[kQ8 ? kInFlight : 1];

  auto load = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + u * 32;
      const bool ok = active && c < end;
      wv[u] = ok ? LoadWeights(wr + c) : make_uint4(0, 0, 0, 0);
      if constexpr (kSilu) uv[u] = ok ? LoadWeights(ur + c) : make_uint4(0, 0, 0, 0);
      if constexpr (kQ8) {
        wd[u] = ok ? __half2float(__ldg(ws + c / 2)) : 0.f;
        if constexpr (kSilu) ud[u] = ok ? __half2float(__ldg(us + c / 2)) : 0.f;
      }
    }
  };
  auto consume = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t c = c0 + u * 32;
      if (c < end) {
#pragma unroll
        for (int r = 0; r < M; ++r) {
          const uint4* xrow = xr + r * (k / 8);  // x rows in 16-byte units (8 bf16)
          acc[r] = DotChunk<F>(wv[u], xrow, c, wd[kQ8 ? u : 0], acc[r]);
          if constexpr (kSilu) accu[r] = DotChunk<F>(uv[u], xrow, c, ud[kQ8 ? u : 0], accu[r]);
        }
      }
    }
  };

  int64_t c0 = begin + lane;
  load(c0);  // weights only: safe before the previous kernel has finished
  PdlWait();
  if (begin < end) {
    for (;;) {
      consume(c0);
      c0 += kRound;
      if (c0 - lane >= end) break;
      load(c0);
    }
  }
  PdlLaunchDependents();
#pragma unroll
  for (int r = 0; r < M; ++r) {
    acc[r] = WarpSum(acc[r]);
    if constexpr (kSilu) accu[r] = WarpSum(accu[r]);
  }
  if constexpr (kSplit > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < M; ++r) {
        part[warp][r][0] = acc[r];
        if constexpr (kSilu) part[warp][r][1] = accu[r];
      }
    }
    __syncthreads();
    if (slice != 0) return;
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int s = 1; s < kSplit; ++s) {
          acc[r] += part[warp + s][r][0];
          if constexpr (kSilu) accu[r] += part[warp + s][r][1];
        }
      }
    }
  }
  if (lane == 0 && active) {
    if constexpr (F == WFmt::kFp8) {
      const float* fs = static_cast<const float*>(scale);
      const float sw = fs[row];
      const float su = kSilu ? fs[row + up_rows] : 0.f;
#pragma unroll
      for (int r = 0; r < M; ++r) {
        acc[r] *= sw;
        if constexpr (kSilu) accu[r] *= su;
      }
    }
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

__device__ __forceinline__ float ClampF16(float v) {
  return fminf(fmaxf(v, -65504.f), 65504.f);
}

// fp8 weights on tensor cores (split = 0, 2-8 rows of x): a warp computes 16 output rows (and, with kSilu,
// the matching 16 up rows) over a 1/kWarps slice of k with mma.sync m16n8k16 (fp16 in, fp32 accumulators),
// the block's 8 warps taking the slices of one 16-row group, their sums added in warp order through shared
// memory (deterministic). A byte pair is one cvt straight into an A fragment and 256 products one mma,
// whatever the rows of x (the CUDA-core kernel re-reads and multiplies every x row per weight chunk). At one
// row it lost to the CUDA-core kernel by 1.10-1.35x on the H100 (gemv.h), so one row does not come here.
//
// Layout: lane (g = lane / 4, c = lane % 4) loads 16 bytes of rows g and g + 8 at byte c * 16 of each
// 64-value k block; mma step j (0-3) takes bytes 4j..4j+3 of them: the A fragment's columns 2c, 2c+1 are
// bytes 4j, 4j+1 and columns 2c+8, 2c+9 bytes 4j+2, 4j+3. The B fragment (column g = x row g, for g < M)
// holds the same four k positions of x: a dot product may visit k in any order as long as both operands
// agree. x is converted from bf16 to fp16 (exact within fp16's range: |x| <= 65,504; larger values are
// clamped to +-65,504: a wrong but finite product, where an inf would put NaN into every later token through
// the KV cache), one 64-value block ahead of its use with the weights. kU blocks of loads stay in flight per
// lane: each slot is refilled as soon as it is consumed.
template <int M, typename OutT, bool kSilu>
__global__ void __launch_bounds__(kWarps * 32, 2)
    Fp8MmaGemvKernel(const uint8_t* __restrict__ w, const float* __restrict__ scale, int64_t n, int64_t k,
                     const __nv_bfloat16* __restrict__ x, OutT* __restrict__ y, int64_t ldy, int64_t up_rows) {
  constexpr int kSets = kSilu ? 2 : 1;  // gate rows (or the only rows), up rows
  constexpr int kU = kSilu ? 2 : 4;     // 64-value k blocks in flight per lane: 128 bytes either way
  __shared__ float part[kWarps][kSets][16][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t blocks = (k + 63) / 64;
  const int64_t per = (blocks + kWarps - 1) / kWarps;
  const int64_t begin = warp * per;
  const int64_t end = begin + per < blocks ? begin + per : blocks;

  const uint8_t* wr[kSets][2];
  bool rok[kSets][2];
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + g + 8 * h;
      rok[s][h] = r < n;
      wr[s][h] = w + (s * up_rows + (r < n ? r : 0)) * k + c * 16;
    }
  }
  const bool xok = g < M;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (xok ? g : 0) * k + c * 16);

  uint4 wv[kU][kSets][2];
  auto load = [&](int u, int64_t b) {
    const bool in = b < end && b * 64 + c * 16 < k;
#pragma unroll
    for (int s = 0; s < kSets; ++s) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wv[u][s][h] = in && rok[s][h] ? LoadWeights(reinterpret_cast<const uint4*>(wr[s][h] + b * 64))
                                      : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // x values b * 64 + c * 16 .. + 15 of row g as 8 fp16 pairs (zeros past k or for g >= M).
  auto load_x = [&](int64_t b, uint32_t (&xh)[8]) {
    const bool in = xok && b < end && b * 64 + c * 16 < k;
    const uint4 lo = in ? __ldg(xr + b * 8) : make_uint4(0, 0, 0, 0);
    const uint4 hi = in ? __ldg(xr + b * 8 + 1) : make_uint4(0, 0, 0, 0);
    const uint32_t v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
      xh[i] = PackF16(ClampF16(__uint_as_float(v[i] << 16)), ClampF16(__uint_as_float(v[i] & 0xffff0000u)));
  };

  float acc[kSets][4];
#pragma unroll
  for (int s = 0; s < kSets; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.f;
#pragma unroll
  for (int u = 0; u < kU; ++u) load(u, begin + u);  // weights only: safe before the previous kernel has finished
  PdlWait();
  uint32_t xh[8];
  load_x(begin, xh);
  for (int64_t b0 = begin; b0 < end; b0 += kU) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t b = b0 + u;
      if (b >= end) break;  // warp-uniform
      uint32_t xn[8];
      load_x(b + 1, xn);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int s = 0; s < kSets; ++s) {
          const uint32_t w0 = reinterpret_cast<const uint32_t*>(&wv[u][s][0])[j];
          const uint32_t w1 = reinterpret_cast<const uint32_t*>(&wv[u][s][1])[j];
          uint32_t a[4];
          const __nv_fp8x2_storage_t p[4] = {static_cast<__nv_fp8x2_storage_t>(w0 & 0xffffu),
                                             static_cast<__nv_fp8x2_storage_t>(w1 & 0xffffu),
                                             static_cast<__nv_fp8x2_storage_t>(w0 >> 16),
                                             static_cast<__nv_fp8x2_storage_t>(w1 >> 16)};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(p[i], __NV_E4M3);
            a[i] = static_cast<uint32_t>(hr.x) | static_cast<uint32_t>(hr.y) << 16;
          }
          MmaF16(acc[s], a, xh[2 * j], xh[2 * j + 1]);
        }
      }
      load(u, b + kU);
#pragma unroll
      for (int i = 0; i < 8; ++i) xh[i] = xn[i];
    }
  }
  PdlLaunchDependents();
  // Lane (g, c) holds rows g and g + 8, x rows 2c and 2c + 1.
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
    part[warp][s][g][2 * c] = acc[s][0];
    part[warp][s][g][2 * c + 1] = acc[s][1];
    part[warp][s][g + 8][2 * c] = acc[s][2];
    part[warp][s][g + 8][2 * c + 1] = acc[s][3];
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= 16 * M) return;
  const int rr = t % 16, col = t / 16;
  const int64_t row = row0 + rr;
  if (row >= n) return;
  float sum[kSets];
#pragma unroll
  for (int s = 0; s < kSets; ++s) {
    sum[s] = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum[s] += part[v][s][rr][col];
    sum[s] *= scale[s * up_rows + row];
  }
  if constexpr (kSilu) {
    const float gg = __bfloat162float(__float2bfloat16_rn(sum[0]));
    const float uu = __bfloat162float(__float2bfloat16_rn(sum[1]));
    y[col * ldy + row] = FromFloat<OutT>(Silu(gg) * uu);
  } else {
    y[col * ldy + row] = FromFloat<OutT>(sum[0]);
  }
}

}  // namespace

int GemvSplitFor(int64_t m, int64_t k, int split) {
  if (m != 1) return 1;
  if (split == 1 || split == 2 || split == 4 || split == 8) return split;
  // Auto: two warps per row when each half keeps at least a full round of loads (k >= 4096). Measured on the
  // H200 (8B shapes, batch-1 step, bench/results/gpu_llm_8b_decode_h200_2026-12-03.json): 2 warps everywhere
  // 4.65 ms, 1 everywhere 4.89 ms, 4 everywhere 4.81 ms.
  return k / kChunkValues<WFmt::kBf16> >= 2 * kRound ? 2 : 1;
}

int Fp8GemvSplitFor(int64_t m, int64_t k, int split) {
  if (m != 1) return 1;
  if (split == 1 || split == 2 || split == 4 || split == 8) return split;
  // Auto: the bf16 rule in chunks (a 16-byte load holds twice the values, so a row has half the chunks).
  return k / kChunkValues<WFmt::kFp8> >= 2 * kRound ? 2 : 1;
}

namespace {

template <int M, typename OutT, bool kSilu, int kSplit, WFmt F>
cudaError_t LaunchM(const void* w, const void* scale, int64_t n, int64_t k, const __nv_bfloat16* x, OutT* y,
                    int64_t ldy, int64_t up_rows, bool pdl, cudaStream_t stream) {
  return LaunchKernel(pdl, GemvKernel<M, OutT, kSilu, kSplit, F>, dim3(CeilDiv(n, kWarps / kSplit)),
                      dim3(kWarps * 32), 0, stream, w, scale, n, k, x, y, ldy, up_rows);
}

// Picks the instantiation for m rows (M counts up to m) and, at one row, `split` warps per row.
template <int M, typename OutT, bool kSilu, WFmt F>
cudaError_t LaunchRows(int m, int split, const void* w, const void* scale, int64_t n, int64_t k,
                       const __nv_bfloat16* x, OutT* y, int64_t ldy, int64_t up_rows, bool pdl,
                       cudaStream_t stream) {
  if constexpr (M < kGemvMaxRows) {
    if (m > M) {
      return LaunchRows<M + 1, OutT, kSilu, F>(m, split, w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
    }
  }
  if constexpr (M == 1) {
    if (split == 2) return LaunchM<1, OutT, kSilu, 2, F>(w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
    if (split == 4) return LaunchM<1, OutT, kSilu, 4, F>(w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
    if (split == 8) return LaunchM<1, OutT, kSilu, 8, F>(w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
  }
  return LaunchM<M, OutT, kSilu, 1, F>(w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
}

// The tensor-core fp8 kernel for m rows of x (M counts up to m).
template <int M, typename OutT, bool kSilu>
cudaError_t LaunchFp8Mma(int m, const void* w, const void* scale, int64_t n, int64_t k, const __nv_bfloat16* x,
                         OutT* y, int64_t ldy, int64_t up_rows, bool pdl, cudaStream_t stream) {
  if constexpr (M < kGemvMaxRows) {
    if (m > M) return LaunchFp8Mma<M + 1, OutT, kSilu>(m, w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
  }
  return LaunchKernel(pdl, Fp8MmaGemvKernel<M, OutT, kSilu>, dim3(CeilDiv(n, 16)), dim3(kWarps * 32), 0, stream,
                      static_cast<const uint8_t*>(w), static_cast<const float*>(scale), n, k, x, y, ldy, up_rows);
}

template <typename OutT, bool kSilu, WFmt F>
Status Launch(const char* what, const void* w, const void* scale, int64_t n, int64_t k, const __nv_bfloat16* x,
              int64_t m, OutT* y, int64_t ldy, int64_t up_rows, bool pdl, int split, cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": rows must be in [1, 8]");
  }
  // Q8: k a whole number of 32-value blocks.
  const int64_t k_unit = F == WFmt::kQ8 ? 32 : kChunkValues<F>;
  if (k % k_unit != 0 || (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": k must be a multiple of " +
                                                    std::to_string(k_unit) + " and w, x 16-byte aligned");
  }
  if (F != WFmt::kBf16 && scale == nullptr) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": quantised weights need their scales");
  }
  if (ldy < n) return Status(StatusCode::kInvalidArgument, std::string(what) + ": ldy < n");
  if (n <= 0 || k <= 0) return OkStatus();
  if (n > 0x7fffffff) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": too many rows");
  }
  cudaError_t e;
  if (F == WFmt::kFp8 && split == 0 && m > 1) {
    e = LaunchFp8Mma<1, OutT, kSilu>(static_cast<int>(m), w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
  } else {
    const int s = F == WFmt::kBf16 ? GemvSplitFor(m, k, split) : Fp8GemvSplitFor(m, k, split);
    e = LaunchRows<1, OutT, kSilu, F>(static_cast<int>(m), s, w, scale, n, k, x, y, ldy, up_rows, pdl, stream);
  }
  CUDA_RETURN_IF_ERROR(e);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
                __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, false, WFmt::kBf16>("Bf16Gemv", w, nullptr, n, k, x, m, y, ldy, 0, pdl, split,
                                                   stream);
}
Status Bf16Gemv(const __nv_bfloat16* w, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m, float* y,
                int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<float, false, WFmt::kBf16>("Bf16Gemv", w, nullptr, n, k, x, m, y, ldy, 0, pdl, split, stream);
}
Status Bf16GemvSiluMul(const __nv_bfloat16* w, int64_t inter, int64_t k, const __nv_bfloat16* x, int64_t m,
                       __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, true, WFmt::kBf16>("Bf16GemvSiluMul", w, nullptr, inter, k, x, m, y, inter, inter,
                                                  pdl, split, stream);
}

Status Fp8Gemv(const uint8_t* w, const float* w_scale, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
               __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, false, WFmt::kFp8>("Fp8Gemv", w, w_scale, n, k, x, m, y, ldy, 0, pdl, split,
                                                  stream);
}
Status Fp8Gemv(const uint8_t* w, const float* w_scale, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
               float* y, int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<float, false, WFmt::kFp8>("Fp8Gemv", w, w_scale, n, k, x, m, y, ldy, 0, pdl, split, stream);
}
Status Fp8GemvSiluMul(const uint8_t* w, const float* w_scale, int64_t inter, int64_t k, const __nv_bfloat16* x,
                      int64_t m, __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, true, WFmt::kFp8>("Fp8GemvSiluMul", w, w_scale, inter, k, x, m, y, inter, inter,
                                                 pdl, split, stream);
}

Status Q8Gemv(const int8_t* w, const __half* w_d, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
              __nv_bfloat16* y, int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, false, WFmt::kQ8>("Q8Gemv", w, w_d, n, k, x, m, y, ldy, 0, pdl, split, stream);
}
Status Q8Gemv(const int8_t* w, const __half* w_d, int64_t n, int64_t k, const __nv_bfloat16* x, int64_t m,
              float* y, int64_t ldy, bool pdl, cudaStream_t stream, int split) {
  return Launch<float, false, WFmt::kQ8>("Q8Gemv", w, w_d, n, k, x, m, y, ldy, 0, pdl, split, stream);
}
Status Q8GemvSiluMul(const int8_t* w, const __half* w_d, int64_t inter, int64_t k, const __nv_bfloat16* x,
                     int64_t m, __nv_bfloat16* y, bool pdl, cudaStream_t stream, int split) {
  return Launch<__nv_bfloat16, true, WFmt::kQ8>("Q8GemvSiluMul", w, w_d, inter, k, x, m, y, inter, inter, pdl,
                                                split, stream);
}

}  // namespace stoke::cuda
