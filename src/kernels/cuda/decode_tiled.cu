// Decode attention on tensor cores over the paged KV cache, bf16 or 8-bit (AttentionLaunchOptions::decode_tiled,
// the --decode-attention tiled flag): the query heads of one GQA group are the rows of an mma.sync tile, so each
// K/V row is read once per group, and the scores and the weighted sum of V run on tensor cores instead of a
// warp's shuffles per position (the warp kernels in attention.cu and attention_quant.cu). An 8-bit cache
// (int8 / fp8 E4M3 codes, one fp32 scale per (slot, kv head)) is widened to bf16 in shared memory (exactly);
// its K scales multiply the scores and its V scales the softmax weights before P·V.
//
// grid = (splits, kv heads, sequences), block = kTiledWarps warps. A block takes split x of sequence z for the
// group of kv head y: positions [x * partition, min(ctx, (x + 1) * partition)) in tiles of kDecodeTiledKeys
// (64) keys, gathered from their cache blocks with cp.async into double-buffered shared memory (tile j + 1 in
// flight while tile j is used). Warp w takes keys [16w, 16w + 16) of each tile:
//   S = Q·K^T   mma m16n8k16: A = the group's query rows (rows past the group are zeros), B = K by ldmatrix
//   online softmax in log2 units (exp2, the scale folded in) on the S accumulators, keys past the end masked
//   O += P·V    P repacked from the S accumulators, V by ldmatrix.trans
// The warps' states then merge through shared memory. One split: the block writes `out`; more: the normalised
// partial output and (max in natural-log units, denominator) to the workspace, merged by DecodeReduceKernel
// exactly as the warp kernel's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma.cuh"

namespace stoke::cuda {
namespace {

constexpr int kTiledWarps = 4;
constexpr int kKeys = kDecodeTiledKeys;
static_assert(kKeys == 16 * kTiledWarps, "a warp takes 16 keys of each tile");

// What the cache holds: bf16 values, or 8-bit codes (int8 / fp8 E4M3) with one fp32 scale per (slot, kv head).
enum CacheKind { kCacheBf16 = 0, kCacheInt8 = 1, kCacheFp8 = 2 };

// Shared memory. bf16: K and V tiles, two buffers each, filled by cp.async. 8-bit: the codes (two buffers each,
// by cp.async), their scales (two buffers of 64 per K and V), and one bf16 tile each for K and V that the codes
// are widened into (exactly: int8 and E4M3 values are bf16 values) before the mma reads them.
template <int HD, int kCache>
constexpr int DecodeTiledSmemBytes() {
  constexpr int tile = kKeys * (HD + kSmemRowPad) * 2;
  return kCache == kCacheBf16 ? 4 * tile : 2 * tile + 4 * kKeys * HD + 4 * kKeys * 4;
}

// 8-bit codes -> bf16, 16 at a time (exact).
template <int kCache>
__device__ __forceinline__ void WidenCodes(const uint4& in, __nv_bfloat16* out) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&in);
  alignas(16) __nv_bfloat162 r[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float lo, hi;
    if constexpr (kCache == kCacheFp8) {
      const __half2_raw h =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(b[2 * i] | (b[2 * i + 1] << 8)), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      lo = f.x;
      hi = f.y;
    } else {
      lo = static_cast<float>(static_cast<int8_t>(b[2 * i]));
      hi = static_cast<float>(static_cast<int8_t>(b[2 * i + 1]));
    }
    r[i] = __floats2bfloat162_rn(lo, hi);
  }
  reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(r)[0];
  reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(r)[1];
}

template <int HD, int kCache, typename Kv>
__global__ void __launch_bounds__(kTiledWarps * 32)
    DecodeTiledKernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ block_tables,
                      int max_blocks, const int32_t* __restrict__ context_lens, int heads, int group,
                      int partition, float scale_log2, Kv kv, float* __restrict__ part_out,
                      float* __restrict__ part_ml, __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  constexpr bool kQuant = kCache != kCacheBf16;
  constexpr int kThreads = kTiledWarps * 32;
  constexpr int kStride = HD + kSmemRowPad;  // shared row stride of the bf16 tiles, elements
  constexpr int kChunks = HD / 8;            // 16-byte chunks per bf16 row
  constexpr int kCodeChunks = HD / 16;       // 16-byte chunks per 8-bit row
  constexpr int kKSteps = HD / 16;           // k-steps of S = Q·K^T
  constexpr int kDTiles = HD / 8;            // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // bf16: [2][kKeys][kStride] K, then V. 8-bit: one [kKeys][kStride] K and V, then the codes and scales.
  __nv_bfloat16* sk = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sv = sk + (kQuant ? 1 : 2) * kKeys * kStride;
  uint8_t* ck8 = reinterpret_cast<uint8_t*>(sv + kKeys * kStride);  // [2][kKeys][HD]
  uint8_t* cv8 = ck8 + 2 * kKeys * HD;                              // [2][kKeys][HD]
  float* ksc = reinterpret_cast<float*>(cv8 + 2 * kKeys * HD);       // [2][kKeys]
  float* vsc = ksc + 2 * kKeys;                                       // [2][kKeys]

  const int split = blockIdx.x, kv_head = blockIdx.y, seq = blockIdx.z, num_splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ctx = context_lens[seq];
  const int begin = split * partition;
  const int end = min(ctx, begin + partition);
  const int num_tiles = end > begin ? (end - begin + kKeys - 1) / kKeys : 0;
  const int head0 = kv_head * group;
  const int kvh = kv.num_kv_heads, bs = kv.block_size;
  const int32_t* table = block_tables + static_cast<int64_t>(seq) * max_blocks;
  auto slot_of = [&](int p) { return static_cast<int64_t>(table[p / bs]) * bs + p % bs; };

  auto load_kv = [&](int kt, int buf) {
    if constexpr (!kQuant) {
      __nv_bfloat16* dk = sk + buf * kKeys * kStride;
      __nv_bfloat16* dv = sv + buf * kKeys * kStride;
      for (int c = tid; c < kKeys * kChunks; c += kThreads) {
        const int r = c / kChunks, ch = c - r * kChunks;
        const int p = begin + kt * kKeys + r;
        const bool ok = p < end;
        const int64_t off = ok ? (slot_of(p) * kvh + kv_head) * HD + ch * 8 : 0;
        CpAsync16(dk + r * kStride + ch * 8, kv.k + off, ok ? 16 : 0);
        CpAsync16(dv + r * kStride + ch * 8, kv.v + off, ok ? 16 : 0);
      }
    } else {
      uint8_t* dk = ck8 + buf * kKeys * HD;
      uint8_t* dv = cv8 + buf * kKeys * HD;
      for (int c = tid; c < kKeys * kCodeChunks; c += kThreads) {
        const int r = c / kCodeChunks, ch = c - r * kCodeChunks;
        const int p = begin + kt * kKeys + r;
        const bool ok = p < end;
        const int64_t off = ok ? (slot_of(p) * kvh + kv_head) * HD + ch * 16 : 0;
        CpAsync16(dk + r * HD + ch * 16, kv.k + off, ok ? 16 : 0);
        CpAsync16(dv + r * HD + ch * 16, kv.v + off, ok ? 16 : 0);
      }
      // Scales: threads 0..63 the keys' K scales, 64..127 their V scales (zeros past the end).
      const int r = tid & (kKeys - 1);
      const int p = begin + kt * kKeys + r;
      const bool ok = p < end;
      const int64_t si = ok ? slot_of(p) * kvh + kv_head : 0;
      const float* src = tid < kKeys ? kv.k_scale + si : kv.v_scale + si;
      float* dst = (tid < kKeys ? ksc : vsc) + buf * kKeys + r;
      CpAsync4(dst, src, ok ? 4 : 0);
    }
  };
  if (num_tiles > 0) load_kv(0, 0);
  CpAsyncCommit();

  // The group's query rows g and g + 8 as A fragments (zeros past the group), read once from global memory.
  uint32_t qa[kKSteps][4];
  {
    const bool has0 = g < group, has1 = g + 8 < group;
    const __nv_bfloat16* q0 = q + (static_cast<int64_t>(seq) * heads + head0 + g) * HD + 2 * t;
    const __nv_bfloat16* q1 = q0 + 8 * HD;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      qa[ks][0] = has0 ? Ld32(q0 + ks * 16) : 0u;
      qa[ks][1] = has1 ? Ld32(q1 + ks * 16) : 0u;
      qa[ks][2] = has0 ? Ld32(q0 + ks * 16 + 8) : 0u;
      qa[ks][3] = has1 ? Ld32(q1 + ks * 16 + 8) : 0u;
    }
  }

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g + 8; l: this thread's keys only
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int kt = 0; kt < num_tiles; ++kt) {
    CpAsyncWaitAll();
    __syncthreads();  // tile kt landed; every warp is done with the buffers tile kt - 1 used
    if (kt + 1 < num_tiles) load_kv(kt + 1, (kt + 1) & 1);
    CpAsyncCommit();
    const int buf = kQuant ? 0 : (kt & 1);
    if constexpr (kQuant) {
      // Widen the codes into the bf16 tiles; the scales are applied to S (K) and to P (V) below.
      const uint8_t* fk = ck8 + (kt & 1) * kKeys * HD;
      const uint8_t* fv = cv8 + (kt & 1) * kKeys * HD;
      for (int c = tid; c < kKeys * kCodeChunks; c += kThreads) {
        const int r = c / kCodeChunks, ch = c - r * kCodeChunks;
        WidenCodes<kCache>(*reinterpret_cast<const uint4*>(fk + r * HD + ch * 16), sk + r * kStride + ch * 16);
        WidenCodes<kCache>(*reinterpret_cast<const uint4*>(fv + r * HD + ch * 16), sv + r * kStride + ch * 16);
      }
      __syncthreads();
    }
    const __nv_bfloat16* ck = sk + (buf * kKeys + warp * 16) * kStride;  // this warp's 16 keys
    const __nv_bfloat16* cv = sv + (buf * kKeys + warp * 16) * kStride;

    // S = Q·K^T: ldmatrix.x4 matrices (keys n*8 + 0..7, d 32k + 8i .. 8i + 7), i = 0..3, are b0, b1 of
    // k-step 2k and b0, b1 of k-step 2k + 1.
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const __nv_bfloat16* krow = ck + (lane & 7) * kStride + (lane >> 3) * 8;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ks += 2) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4(b0, b1, b2, b3, krow + n * 8 * kStride + ks * 16);
        Mma(s[n], qa[ks], b0, b1);
        Mma(s[n], qa[ks + 1], b2, b3);
      }
    }

    // Scale to log2 units (8-bit: times the key's K scale); keys at or past the split's end are masked (only
    // in the tile that reaches it). Element (n, e) is key 16 warp + 8n + 2t + (e & 1) of the tile.
    const int key0 = begin + kt * kKeys + warp * 16;
    const bool need_mask = key0 + 16 > end;
    const float* kscale = ksc + (kt & 1) * kKeys + warp * 16;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = n * 8 + 2 * t + (e & 1);
        float x = s[n][e] * scale_log2;
        if constexpr (kQuant) x *= kscale[k];
        if (need_mask && key0 + k >= end) x = -INFINITY;
        s[n][e] = x;
      }
    }

    // Online softmax; row maxima over the 4 threads of a row group.
    float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with nothing unmasked yet keeps m = -inf: subtract 0 instead (exp2(-inf) = 0, no NaN).
    const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
    const float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      s[n][0] = exp2f(s[n][0] - base0);
      s[n][1] = exp2f(s[n][1] - base0);
      s[n][2] = exp2f(s[n][2] - base1);
      s[n][3] = exp2f(s[n][3] - base1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * corr0 + sum0;
    l1 = l1 * corr1 + sum1;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      o[d][0] *= corr0;
      o[d][1] *= corr0;
      o[d][2] *= corr1;
      o[d][3] *= corr1;
    }
    if constexpr (kQuant) {  // P·(codes · scale) = (P · scale)·codes: the V scale goes on P's columns
      const float* vscale = vsc + (kt & 1) * kKeys + warp * 16;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= vscale[n * 8 + 2 * t + (e & 1)];
      }
    }

    // O += P·V: P's A fragment (16 rows x the warp's 16 keys) is S n-tiles 0 and 1. ldmatrix.x4.trans
    // matrices (keys +0..7, d +0..7), (keys +8..15, d +0..7), (keys +0..7, d +8..15), (keys +8..15, d +8..15)
    // are b0, b1 of d-tile 2dp and b0, b1 of d-tile 2dp + 1.
    const uint32_t pa[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]), PackBf16(s[1][0], s[1][1]),
                            PackBf16(s[1][2], s[1][3])};
    const __nv_bfloat16* vrow = cv + ((lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b0, b1, b2, b3;
      LdMatrixX4Trans(b0, b1, b2, b3, vrow + dp * 16);
      Mma(o[2 * dp], pa, b0, b1);
      Mma(o[2 * dp + 1], pa, b2, b3);
    }
  }
  CpAsyncWaitAll();  // nothing is in flight, but leave no copy behind

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  // Merge the warps' states through shared memory (the K/V tiles are no longer read).
  __syncthreads();
  float* sm_o = reinterpret_cast<float*>(smem_raw);  // [kTiledWarps][16][HD]
  float* sm_m = sm_o + kTiledWarps * 16 * HD;          // [kTiledWarps][16]
  float* sm_l = sm_m + kTiledWarps * 16;               // [kTiledWarps][16]
  {
    float* r0 = sm_o + (warp * 16 + g) * HD + 2 * t;
    float* r1 = r0 + 8 * HD;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      r0[d * 8] = o[d][0];
      r0[d * 8 + 1] = o[d][1];
      r1[d * 8] = o[d][2];
      r1[d * 8 + 1] = o[d][3];
    }
    if (t == 0) {
      sm_m[warp * 16 + g] = m0;
      sm_l[warp * 16 + g] = l0;
      sm_m[warp * 16 + g + 8] = m1;
      sm_l[warp * 16 + g + 8] = l1;
    }
  }
  __syncthreads();
  constexpr float kLn2 = 0.6931471805599453f;  // the workspace's maxima are in natural-log units
  for (int i = tid; i < group * HD; i += kThreads) {
    const int r = i / HD, d = i - r * HD;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kTiledWarps; ++w) {
      if (sm_l[w * 16 + r] > 0.f) m = fmaxf(m, sm_m[w * 16 + r]);
    }
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kTiledWarps; ++w) {
      const float lw = sm_l[w * 16 + r];
      if (lw == 0.f) continue;  // a warp that saw no key
      const float f = exp2f(sm_m[w * 16 + r] - m);
      l += lw * f;
      acc += sm_o[(w * 16 + r) * HD + d] * f;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t hrow = static_cast<int64_t>(seq) * heads + head0 + r;
    if (num_splits == 1) {
      out[hrow * HD + d] = __float2bfloat16(acc * inv);
      continue;
    }
    const int64_t row = hrow * num_splits + split;
    part_out[row * HD + d] = acc * inv;
    if (d == 0) {
      part_ml[row * 2] = l > 0.f ? m * kLn2 : -INFINITY;
      part_ml[row * 2 + 1] = l;
    }
  }
}

template <int HD, int kCache, typename Kv>
Status Launch(const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs,
              int heads, int splits, int partition, float scale, const Kv& kv, float* part_out, float* part_ml,
              __nv_bfloat16* out, cudaStream_t stream) {
  constexpr int smem = DecodeTiledSmemBytes<HD, kCache>();
  static_assert((kTiledWarps * 16 * HD + 2 * kTiledWarps * 16) * 4 <= smem, "merge area of DecodeTiledKernel");
  // Opt in above the 48 KB default (per function and device; cheap, so on every launch).
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(DecodeTiledKernel<HD, kCache, Kv>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv.num_kv_heads),
                  static_cast<unsigned>(num_seqs));
  DecodeTiledKernel<HD, kCache, Kv><<<grid, kTiledWarps * 32, smem, stream>>>(
      q, bt, max_blocks, ctx, heads, heads / kv.num_kv_heads, partition, scale_log2, kv, part_out, part_ml,
      out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

// The checks both cache kinds share: the shape, and 16-byte aligned cache rows (cp.async).
template <typename Kv>
Status CheckTiled(const __nv_bfloat16* q, int num_seqs, int heads, const Kv& kv) {
  if (!PagedDecodeAttentionTiledSupports(heads, kv.num_kv_heads, kv.head_dim) || num_seqs > 65535) {
    return Status(StatusCode::kInvalidArgument,
                  "PagedDecodeAttention (tiled): head_dim " + std::to_string(kv.head_dim) + ", heads " +
                      std::to_string(heads) + " / kv heads " + std::to_string(kv.num_kv_heads) +
                      " not supported (head_dim 64 or 128, at most 16 query heads per kv head)");
  }
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(kv.k) || misaligned(kv.v) || (reinterpret_cast<uintptr_t>(q) & 3) != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "PagedDecodeAttention (tiled): the cache needs 16-byte alignment and q 4-byte");
  }
  return OkStatus();
}

}  // namespace

bool PagedDecodeAttentionTiledSupports(int heads, int num_kv_heads, int head_dim) {
  return (head_dim == 64 || head_dim == 128) && num_kv_heads > 0 && heads % num_kv_heads == 0 &&
         heads / num_kv_heads <= 16 && num_kv_heads <= 65535;
}

Status LaunchDecodeTiled(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                         const int32_t* context_lens, int num_seqs, int heads, int splits, int partition,
                         float scale, const DevicePagedKv<__nv_bfloat16>& kv, float* part_out, float* part_ml,
                         __nv_bfloat16* out, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTiled(q, num_seqs, heads, kv));
  return kv.head_dim == 64
             ? Launch<64, kCacheBf16>(q, block_tables, max_blocks, context_lens, num_seqs, heads, splits,
                                      partition, scale, kv, part_out, part_ml, out, stream)
             : Launch<128, kCacheBf16>(q, block_tables, max_blocks, context_lens, num_seqs, heads, splits,
                                       partition, scale, kv, part_out, part_ml, out, stream);
}

Status LaunchDecodeTiled(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                         const int32_t* context_lens, int num_seqs, int heads, int splits, int partition,
                         float scale, const DevicePagedKvQuant& kv, float* part_out, float* part_ml,
                         __nv_bfloat16* out, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckTiled(q, num_seqs, heads, kv));
  if ((reinterpret_cast<uintptr_t>(kv.k_scale) | reinterpret_cast<uintptr_t>(kv.v_scale)) & 3) {
    return Status(StatusCode::kInvalidArgument, "PagedDecodeAttention (tiled): scales need 4-byte alignment");
  }
  const bool fp8 = kv.dtype == KvCacheDtype::kFp8;
  const auto launch = kv.head_dim == 64 ? (fp8 ? Launch<64, kCacheFp8, DevicePagedKvQuant>
                                               : Launch<64, kCacheInt8, DevicePagedKvQuant>)
                                        : (fp8 ? Launch<128, kCacheFp8, DevicePagedKvQuant>
                                               : Launch<128, kCacheInt8, DevicePagedKvQuant>);
  return launch(q, block_tables, max_blocks, context_lens, num_seqs, heads, splits, partition, scale, kv,
                part_out, part_ml, out, stream);
}

}  // namespace stoke::cuda
