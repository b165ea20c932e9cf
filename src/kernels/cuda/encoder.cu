#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/encoder.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 256;

// Normalises the row's values that this thread staged in x[base + i] (i = threadIdx.x, += blockDim.x): two
// passes (mean, then centred variance), each thread re-reading only its own elements.
__device__ __forceinline__ void NormaliseOwnRow(float* x, int64_t base, int64_t dim, float eps,
                                                const float* __restrict__ g, const float* __restrict__ b,
                                                __nv_bfloat16* x_bf16, float* scratch) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) s += x[base + i];
  const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float d = x[base + i] - mean;
    v += d * d;
  }
  const float rstd = rsqrtf(BlockSum(v, scratch) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float y = (x[base + i] - mean) * rstd * g[i] + b[i];
    x[base + i] = y;
    x_bf16[base + i] = __float2bfloat16_rn(y);
  }
}

__global__ void EmbeddingLayerNormKernel(const __nv_bfloat16* __restrict__ word, int64_t vocab,
                                         const __nv_bfloat16* __restrict__ pos, int64_t max_pos,
                                         const float* __restrict__ type0, const float* __restrict__ g,
                                         const float* __restrict__ b, const int32_t* __restrict__ ids,
                                         const int32_t* __restrict__ positions, int64_t dim, float eps,
                                         float* x, __nv_bfloat16* x_bf16) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * dim;
  const int32_t id = ids[row], p = positions[row];
  const bool ok = id >= 0 && id < vocab && p >= 0 && p < max_pos;
  const __nv_bfloat16* wr = word + static_cast<int64_t>(ok ? id : 0) * dim;
  const __nv_bfloat16* pr = pos + static_cast<int64_t>(ok ? p : 0) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    x[base + i] = ok ? __bfloat162float(wr[i]) + __bfloat162float(pr[i]) + type0[i] : 0.f;
  }
  NormaliseOwnRow(x, base, dim, eps, g, b, x_bf16, scratch);
}

__global__ void BiasResidualLayerNormKernel(const float* __restrict__ y, const float* __restrict__ bias,
                                            float* x, const float* __restrict__ g,
                                            const float* __restrict__ b, int64_t dim, float eps,
                                            __nv_bfloat16* x_bf16) {
  __shared__ float scratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) x[base + i] += y[base + i] + bias[i];
  NormaliseOwnRow(x, base, dim, eps, g, b, x_bf16, scratch);
}

// One warp per row (4 rows a block of 128), the row's dim / 8 vectors of 8 bf16 spread over the lanes, VPL
// vectors a lane at most, held in registers between the two statistics passes and the write.
template <int VPL>
__global__ void __launch_bounds__(128)
    ResidualLayerNormBf16Kernel(const __nv_bfloat16* __restrict__ y, __nv_bfloat16* x,
                                const float* __restrict__ g, const float* __restrict__ b, int64_t rows,
                                int dim, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int nvec = dim / 8;
  const uint4* yr = reinterpret_cast<const uint4*>(y + row * dim);
  uint4* xr = reinterpret_cast<uint4*>(x + row * dim);
  float v[VPL][8];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int c = lane + 32 * j;
    if (c < nvec) {
      const uint4 a = yr[c], r = xr[c];
      const __nv_bfloat162* ha = reinterpret_cast<const __nv_bfloat162*>(&a);
      const __nv_bfloat162* hr = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 fa = __bfloat1622float2(ha[i]), fr = __bfloat1622float2(hr[i]);
        v[j][2 * i] = fa.x + fr.x;
        v[j][2 * i + 1] = fa.y + fr.y;
        s += v[j][2 * i] + v[j][2 * i + 1];
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float mean = s / static_cast<float>(dim);
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    if (lane + 32 * j < nvec) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = v[j][i] - mean;
        var += d * d;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(0xffffffffu, var, o);
  const float rstd = rsqrtf(var / static_cast<float>(dim) + eps);
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int c = lane + 32 * j;
    if (c < nvec) {
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(g) + 2 * c);
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(g) + 2 * c + 1);
      const float4 b0 = __ldg(reinterpret_cast<const float4*>(b) + 2 * c);
      const float4 b1 = __ldg(reinterpret_cast<const float4*>(b) + 2 * c + 1);
      const float gg[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
      const float bb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      uint4 o;
      __nv_bfloat162* ho = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        ho[i] = __floats2bfloat162_rn((v[j][2 * i] - mean) * rstd * gg[2 * i] + bb[2 * i],
                                      (v[j][2 * i + 1] - mean) * rstd * gg[2 * i + 1] + bb[2 * i + 1]);
      }
      xr[c] = o;
    }
  }
}

__global__ void AddBiasKernel(__nv_bfloat16* x, const float* __restrict__ bias, int64_t rows, int64_t dim) {
  const int64_t total = rows * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) + bias[i % dim]);
  }
}

// Attention. Block = 4 warps; each warp owns kQueriesPerWarp consecutive queries of the block's 16. Keys and
// values come through shared memory in tiles of kKeyTile rows (padded so that lane j reading row j hits a
// distinct bank). Per query and tile: lane j scores keys j and j + 32 (full dot product from shared memory,
// the query broadcast from shared memory), the warp updates the running max / sum (online softmax), writes
// the tile's probabilities to shared memory, and each lane accumulates its head_dim / 32 output dims.
constexpr int kAttnWarps = 4;
constexpr int kQueriesPerWarp = 4;
constexpr int kQueriesPerBlock = kAttnWarps * kQueriesPerWarp;
constexpr int kKeyTile = 64;

template <int HD>
__global__ void __launch_bounds__(kAttnWarps * 32)
    EncoderAttentionKernel(const __nv_bfloat16* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens,
                           int heads, float scale, __nv_bfloat16* __restrict__ out) {
  constexpr int kDpl = HD / 32;    // output dims per lane
  constexpr int kStride = HD + 2;  // padded row (bf16 elements): (HD + 2) / 2 words is odd -> no conflicts
  constexpr int kWords = HD / 2;   // bf16 pairs per row
  __shared__ __align__(16) __nv_bfloat16 ks[kKeyTile * kStride];
  __shared__ __align__(16) __nv_bfloat16 vs[kKeyTile * kStride];
  __shared__ __align__(16) float qs[kQueriesPerBlock * HD];
  __shared__ float ps[kAttnWarps][kKeyTile];

  const int seq = blockIdx.z, head = blockIdx.y;
  const int begin = cu_seqlens[seq];
  const int len = cu_seqlens[seq + 1] - begin;
  const int q0 = blockIdx.x * kQueriesPerBlock;
  if (q0 >= len) return;  // the whole block: no __syncthreads reached
  const int64_t hidden = static_cast<int64_t>(heads) * HD;
  const int64_t row_stride = 3 * hidden;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  for (int i = threadIdx.x; i < kQueriesPerBlock * HD; i += blockDim.x) {
    const int qi = i / HD, d = i - qi * HD;
    const int t = q0 + qi;
    qs[i] = t < len ? __bfloat162float(qkv[(begin + t) * row_stride + head * HD + d]) * scale : 0.f;
  }

  float m[kQueriesPerWarp], l[kQueriesPerWarp], acc[kQueriesPerWarp][kDpl];
#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
    m[qq] = -INFINITY;
    l[qq] = 0.f;
#pragma unroll
    for (int d = 0; d < kDpl; ++d) acc[qq][d] = 0.f;
  }

  for (int k0 = 0; k0 < len; k0 += kKeyTile) {
    const int nk = min(kKeyTile, len - k0);
    __syncthreads();  // the previous tile is consumed (first pass: qs is written)
    for (int i = threadIdx.x; i < kKeyTile * kWords; i += blockDim.x) {
      const int j = i / kWords, w = i - j * kWords;
      __nv_bfloat162 kv = __float2bfloat162_rn(0.f), vv = __float2bfloat162_rn(0.f);
      if (j < nk) {
        const __nv_bfloat16* row = qkv + (begin + k0 + j) * row_stride + head * HD + 2 * w;
        kv = *reinterpret_cast<const __nv_bfloat162*>(row + hidden);
        vv = *reinterpret_cast<const __nv_bfloat162*>(row + 2 * hidden);
      }
      *reinterpret_cast<__nv_bfloat162*>(ks + j * kStride + 2 * w) = kv;
      *reinterpret_cast<__nv_bfloat162*>(vs + j * kStride + 2 * w) = vv;
    }
    __syncthreads();
#pragma unroll
    for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
      const int qi = warp * kQueriesPerWarp + qq;
      if (q0 + qi < len) {  // warp-uniform
        const float* q = qs + qi * HD;
        float s[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          const __nv_bfloat162* krow = reinterpret_cast<const __nv_bfloat162*>(ks + j * kStride);
          float dot = 0.f;
#pragma unroll 8
          for (int w = 0; w < kWords; ++w) {
            const float2 kf = __bfloat1622float2(krow[w]);
            dot = fmaf(q[2 * w], kf.x, dot);
            dot = fmaf(q[2 * w + 1], kf.y, dot);
          }
          s[r] = j < nk ? dot : -INFINITY;
        }
        const float mnew = fmaxf(m[qq], WarpMax(fmaxf(s[0], s[1])));  // finite: key 0 of the tile is real
        const float corr = __expf(m[qq] - mnew);                      // 0 on the first tile (m = -inf)
        const float p0 = __expf(s[0] - mnew), p1 = __expf(s[1] - mnew);
        l[qq] = l[qq] * corr + WarpSum(p0 + p1);
        m[qq] = mnew;
        ps[warp][lane] = p0;
        ps[warp][lane + 32] = p1;
        __syncwarp();
#pragma unroll
        for (int d = 0; d < kDpl; ++d) acc[qq][d] *= corr;
        for (int j = 0; j < nk; ++j) {
          const float p = ps[warp][j];
          const __nv_bfloat16* vrow = vs + j * kStride + lane * kDpl;
#pragma unroll
          for (int d = 0; d < kDpl; ++d) acc[qq][d] = fmaf(p, __bfloat162float(vrow[d]), acc[qq][d]);
        }
        __syncwarp();  // ps is rewritten by the next query
      }
    }
  }

#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
    const int t = q0 + warp * kQueriesPerWarp + qq;
    if (t < len) {
      const float inv = 1.f / l[qq];
      __nv_bfloat16* o = out + (begin + t) * hidden + head * HD + lane * kDpl;
#pragma unroll
      for (int d = 0; d < kDpl; ++d) o[d] = __float2bfloat16_rn(acc[qq][d] * inv);
    }
  }
}

// The same attention with 16-byte shared-memory traffic (head_dim 32, 64, 128). Rows padded by 8 bf16 so that
// the 8 lanes of a quarter-warp reading 16 bytes of 8 different rows hit distinct banks.
//   scores: lane j dots key j (and j + 32) with the query, 8 key elements per 16-byte load, the query as two
//           float4 broadcasts;
//   P . V:  the warp splits into 32 / (head_dim / 8) groups; group g takes keys g, g + groups, ...; each lane
//           owns 8 output dims (one 16-byte load of V per key), and the groups' partial sums are added with
//           shuffles at the end (same running max, so the online-softmax rescale applies to each part).
template <int HD>
__global__ void __launch_bounds__(kAttnWarps * 32)
    EncoderAttentionVecKernel(const __nv_bfloat16* __restrict__ qkv, const int32_t* __restrict__ cu_seqlens,
                              int heads, float scale, __nv_bfloat16* __restrict__ out) {
  static_assert(HD == 32 || HD == 64 || HD == 128, "head_dim");
  constexpr int kStride = HD + 8;         // bf16 elements per padded row (16-byte multiple)
  constexpr int kChunks = HD / 8;         // 16-byte chunks per row
  constexpr int kLanesPerGroup = HD / 8;  // P.V: lanes sharing one key, 8 dims each
  constexpr int kGroups = 32 / kLanesPerGroup;
  __shared__ __align__(16) __nv_bfloat16 ks[kKeyTile * kStride];
  __shared__ __align__(16) __nv_bfloat16 vs[kKeyTile * kStride];
  __shared__ __align__(16) float qs[kQueriesPerBlock * HD];
  __shared__ float ps[kAttnWarps][kKeyTile];

  const int seq = blockIdx.z, head = blockIdx.y;
  const int begin = cu_seqlens[seq];
  const int len = cu_seqlens[seq + 1] - begin;
  const int q0 = blockIdx.x * kQueriesPerBlock;
  if (q0 >= len) return;  // the whole block
  const int64_t hidden = static_cast<int64_t>(heads) * HD;
  const int64_t row_stride = 3 * hidden;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int grp = lane / kLanesPerGroup, lig = lane % kLanesPerGroup;

  for (int i = threadIdx.x; i < kQueriesPerBlock * HD; i += blockDim.x) {
    const int qi = i / HD, d = i - qi * HD;
    const int t = q0 + qi;
    qs[i] = t < len ? __bfloat162float(qkv[(begin + t) * row_stride + head * HD + d]) * scale : 0.f;
  }

  float m[kQueriesPerWarp], l[kQueriesPerWarp], acc[kQueriesPerWarp][8];
#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
    m[qq] = -INFINITY;
    l[qq] = 0.f;
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[qq][d] = 0.f;
  }

  for (int k0 = 0; k0 < len; k0 += kKeyTile) {
    const int nk = min(kKeyTile, len - k0);
    __syncthreads();  // the previous tile is consumed (first pass: qs is written)
    for (int i = threadIdx.x; i < kKeyTile * kChunks; i += blockDim.x) {
      const int j = i / kChunks, c = i - j * kChunks;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (j < nk) {
        const __nv_bfloat16* row = qkv + (begin + k0 + j) * row_stride + head * HD + 8 * c;
        kv = *reinterpret_cast<const uint4*>(row + hidden);
        vv = *reinterpret_cast<const uint4*>(row + 2 * hidden);
      }
      *reinterpret_cast<uint4*>(ks + j * kStride + 8 * c) = kv;
      *reinterpret_cast<uint4*>(vs + j * kStride + 8 * c) = vv;
    }
    __syncthreads();
#pragma unroll
    for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
      const int qi = warp * kQueriesPerWarp + qq;
      if (q0 + qi < len) {  // warp-uniform
        const float4* q4 = reinterpret_cast<const float4*>(qs + qi * HD);
        float s[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          const uint4* krow = reinterpret_cast<const uint4*>(ks + j * kStride);
          float dot = 0.f;
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const uint4 kv = krow[c];
            const float4 qa = q4[2 * c], qb = q4[2 * c + 1];
            const float2 k01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.x));
            const float2 k23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.y));
            const float2 k45 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.z));
            const float2 k67 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&kv.w));
            dot = fmaf(qa.x, k01.x, dot);
            dot = fmaf(qa.y, k01.y, dot);
            dot = fmaf(qa.z, k23.x, dot);
            dot = fmaf(qa.w, k23.y, dot);
            dot = fmaf(qb.x, k45.x, dot);
            dot = fmaf(qb.y, k45.y, dot);
            dot = fmaf(qb.z, k67.x, dot);
            dot = fmaf(qb.w, k67.y, dot);
          }
          s[r] = j < nk ? dot : -INFINITY;
        }
        const float mnew = fmaxf(m[qq], WarpMax(fmaxf(s[0], s[1])));  // finite: key 0 of the tile is real
        const float corr = __expf(m[qq] - mnew);                      // 0 on the first tile (m = -inf)
        const float p0 = __expf(s[0] - mnew), p1 = __expf(s[1] - mnew);
        l[qq] = l[qq] * corr + WarpSum(p0 + p1);
        m[qq] = mnew;
        ps[warp][lane] = p0;
        ps[warp][lane + 32] = p1;
        __syncwarp();
#pragma unroll
        for (int d = 0; d < 8; ++d) acc[qq][d] *= corr;
        for (int j = grp; j < nk; j += kGroups) {
          const float p = ps[warp][j];
          const uint4 vv = *reinterpret_cast<const uint4*>(vs + j * kStride + 8 * lig);
          const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv.x));
          const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv.y));
          const float2 v45 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv.z));
          const float2 v67 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vv.w));
          acc[qq][0] = fmaf(p, v01.x, acc[qq][0]);
          acc[qq][1] = fmaf(p, v01.y, acc[qq][1]);
          acc[qq][2] = fmaf(p, v23.x, acc[qq][2]);
          acc[qq][3] = fmaf(p, v23.y, acc[qq][3]);
          acc[qq][4] = fmaf(p, v45.x, acc[qq][4]);
          acc[qq][5] = fmaf(p, v45.y, acc[qq][5]);
          acc[qq][6] = fmaf(p, v67.x, acc[qq][6]);
          acc[qq][7] = fmaf(p, v67.y, acc[qq][7]);
        }
        __syncwarp();  // ps is rewritten by the next query
      }
    }
  }

#pragma unroll
  for (int qq = 0; qq < kQueriesPerWarp; ++qq) {
    // Sum the groups' partial outputs (all lanes take part; lanes of group 0 then hold the totals).
#pragma unroll
    for (int d = 0; d < 8; ++d) {
#pragma unroll
      for (int off = kLanesPerGroup; off < 32; off <<= 1)
        acc[qq][d] += __shfl_xor_sync(0xffffffffu, acc[qq][d], off);
    }
    const int t = q0 + warp * kQueriesPerWarp + qq;
    if (t < len && grp == 0) {
      const float inv = 1.f / l[qq];
      __align__(16) __nv_bfloat162 o[4];
#pragma unroll
      for (int d = 0; d < 4; ++d)
        o[d] = __floats2bfloat162_rn(acc[qq][2 * d] * inv, acc[qq][2 * d + 1] * inv);
      *reinterpret_cast<uint4*>(out + (begin + t) * hidden + head * HD + 8 * lig) =
          *reinterpret_cast<const uint4*>(o);
    }
  }
}

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__global__ void MeanPoolNormalizeKernel(const T* __restrict__ x, const int32_t* __restrict__ cu_seqlens,
                                        int64_t dim, float* out) {
  __shared__ float scratch[32];
  const int seq = blockIdx.x;
  const int begin = cu_seqlens[seq], end = cu_seqlens[seq + 1];
  const float inv_len = 1.f / static_cast<float>(max(end - begin, 1));
  float* o = out + static_cast<int64_t>(seq) * dim;
  float sq = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float s = 0.f;
    for (int r = begin; r < end; ++r) s += ToFloat(x[static_cast<int64_t>(r) * dim + i]);
    s *= inv_len;
    o[i] = s;
    sq += s * s;
  }
  const float inv_norm = 1.f / fmaxf(sqrtf(BlockSum(sq, scratch)), 1e-12f);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] *= inv_norm;
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

Status Invalid(const char* what) {
  return Status(StatusCode::kInvalidArgument, what);
}

}  // namespace

Status EmbeddingLayerNorm(const __nv_bfloat16* word, int64_t vocab, const __nv_bfloat16* pos, int64_t max_pos,
                          const float* type0, const float* gamma, const float* beta, const int32_t* ids,
                          const int32_t* positions, int64_t rows, int64_t dim, float eps, float* x_f32,
                          __nv_bfloat16* x_bf16, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if (rows > 0x7fffffff) return Invalid("EmbeddingLayerNorm: too many rows");
  EmbeddingLayerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      word, vocab, pos, max_pos, type0, gamma, beta, ids, positions, dim, eps, x_f32, x_bf16);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status BiasResidualLayerNorm(const float* y, const float* bias, float* x, const float* gamma,
                             const float* beta, int64_t rows, int64_t dim, float eps, __nv_bfloat16* x_bf16,
                             cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if (rows > 0x7fffffff) return Invalid("BiasResidualLayerNorm: too many rows");
  BiasResidualLayerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(y, bias, x, gamma, beta,
                                                                                    dim, eps, x_bf16);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

bool ResidualLayerNormBf16Supports(int64_t dim) { return dim > 0 && dim % 8 == 0 && dim <= 2048; }

Status ResidualLayerNormBf16(const __nv_bfloat16* y, __nv_bfloat16* x, const float* gamma, const float* beta,
                             int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return OkStatus();
  if (!ResidualLayerNormBf16Supports(dim)) return Invalid("ResidualLayerNormBf16: dim must be a multiple of 8, <= 2048");
  if (reinterpret_cast<uintptr_t>(y) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(gamma) % 16 != 0 || reinterpret_cast<uintptr_t>(beta) % 16 != 0) {
    return Invalid("ResidualLayerNormBf16: pointers must be 16-byte aligned");
  }
  const int64_t blocks = (rows + 3) / 4;
  if (blocks > 0x7fffffff) return Invalid("ResidualLayerNormBf16: too many rows");
  const int vpl = static_cast<int>((dim / 8 + 31) / 32);
  const int d = static_cast<int>(dim);
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (vpl) {
    case 1: ResidualLayerNormBf16Kernel<1><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
    case 2: ResidualLayerNormBf16Kernel<2><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
    case 3: ResidualLayerNormBf16Kernel<3><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
    case 4: ResidualLayerNormBf16Kernel<4><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
    case 5: case 6: ResidualLayerNormBf16Kernel<6><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
    default: ResidualLayerNormBf16Kernel<8><<<grid, 128, 0, stream>>>(y, x, gamma, beta, rows, d, eps); break;
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status AddBias(__nv_bfloat16* x, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return OkStatus();
  if (BiasAct8Applies(x, dim)) {
    BiasAct8Kernel<false><<<BiasAct8Grid(rows, dim, 128), 128, 0, stream>>>(x, bias, rows, dim);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return OkStatus();
  }
  AddBiasKernel<<<GridFor(rows * dim), kThreads, 0, stream>>>(x, bias, rows, dim);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

bool EncoderAttentionSupports(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

int EncoderAttentionWarpRows(EncoderAttentionImpl impl, int num_seqs, int max_len, int heads, int head_dim,
                             int sms) {
  if (head_dim > 64) return 16;
  if (impl == EncoderAttentionImpl::kTensorCoreWide) return 32;
  if (impl != EncoderAttentionImpl::kTensorCoreAuto) return 16;
  // Tiles of 128 queries over the longest sequence (an upper bound of the wide form's CTAs).
  const int64_t tiles = int64_t{CeilDiv(max_len, 128)} * heads * num_seqs;
  return tiles >= int64_t{kWideTilesPerSm} * sms ? 32 : 16;
}

Status EncoderAttention(const __nv_bfloat16* qkv, const int32_t* cu_seqlens, int num_seqs, int max_len,
                        int heads, int head_dim, float scale, __nv_bfloat16* out, cudaStream_t stream,
                        EncoderAttentionImpl impl) {
  if (num_seqs <= 0 || max_len <= 0) return OkStatus();
  if (num_seqs > 65535) return Invalid("EncoderAttention: more than 65535 sequences in one call");
  if (heads <= 0 || heads > 65535) return Invalid("EncoderAttention: heads outside [1, 65535]");
  if (!EncoderAttentionSupports(head_dim))
    return Invalid("EncoderAttention: head_dim must be 32, 64, 96 or 128");
  if ((impl == EncoderAttentionImpl::kTensorCore || impl == EncoderAttentionImpl::kTensorCoreWide ||
       impl == EncoderAttentionImpl::kTensorCoreAuto) &&
      EncoderAttentionTiledSupports(head_dim)) {
    int sms = 0;
    if (impl == EncoderAttentionImpl::kTensorCoreAuto) {
      int dev = 0;
      CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
      CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int warp_rows = EncoderAttentionWarpRows(impl, num_seqs, max_len, heads, head_dim, sms);
    return EncoderAttentionTiled(qkv, cu_seqlens, num_seqs, max_len, heads, head_dim, scale, out, stream,
                                 warp_rows);
  }
  const dim3 grid(CeilDiv(max_len, kQueriesPerBlock), static_cast<unsigned>(heads),
                  static_cast<unsigned>(num_seqs));
  const dim3 block(kAttnWarps * 32);
  if (impl != EncoderAttentionImpl::kSimple && head_dim != 96) {
    if (head_dim == 32) {
      EncoderAttentionVecKernel<32><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
    } else if (head_dim == 64) {
      EncoderAttentionVecKernel<64><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
    } else {
      EncoderAttentionVecKernel<128><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
    }
  } else {
    switch (head_dim) {
      case 32:
        EncoderAttentionKernel<32><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
        break;
      case 64:
        EncoderAttentionKernel<64><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
        break;
      case 96:
        EncoderAttentionKernel<96><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
        break;
      default:
        EncoderAttentionKernel<128><<<grid, block, 0, stream>>>(qkv, cu_seqlens, heads, scale, out);
        break;
    }
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status MeanPoolNormalize(const float* x, const int32_t* cu_seqlens, int num_seqs, int64_t dim, float* out,
                         cudaStream_t stream) {
  if (num_seqs <= 0 || dim <= 0) return OkStatus();
  MeanPoolNormalizeKernel<<<static_cast<unsigned>(num_seqs), kThreads, 0, stream>>>(x, cu_seqlens, dim, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status MeanPoolNormalize(const __nv_bfloat16* x, const int32_t* cu_seqlens, int num_seqs, int64_t dim,
                         float* out, cudaStream_t stream) {
  if (num_seqs <= 0 || dim <= 0) return OkStatus();
  MeanPoolNormalizeKernel<<<static_cast<unsigned>(num_seqs), kThreads, 0, stream>>>(x, cu_seqlens, dim, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
