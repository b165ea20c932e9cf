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
// flight while tile j is used; one buffer when no split has more than one tile, bf16 cache). Warp w takes keys
// [16w, 16w + 16) of each tile:
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
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/mma.cuh"

namespace stoke::cuda {
namespace {

constexpr int kTiledWarps = 4;
constexpr int kKeys = kDecodeTiledKeys;
static_assert(kKeys == 16 * kTiledWarps, "a warp takes 16 keys of each tile");

// Shared memory. bf16: K and V tiles, two buffers each, filled by cp.async. 8-bit: the codes (two buffers each,
// by cp.async), their scales (two buffers of 64 per K and V), and one bf16 tile each for K and V that the codes
// are widened into (exactly: int8 and E4M3 values are bf16 values) before the mma reads them.
template <int HD, int kCache>
constexpr int DecodeTiledSmemBytes() {
  constexpr int tile = kKeys * (HD + kSmemRowPad) * 2;
  return kCache == kCacheBf16 ? 4 * tile : 2 * tile + 4 * kKeys * HD + 4 * kKeys * 4;
}

__device__ __forceinline__ int Log2IfPow2(int x) {
#ifdef __CUDA_ARCH__
  return x > 0 && (x & (x - 1)) == 0 ? __ffs(x) - 1 : -1;
#else
  return -1;  // the host pass parses device code too
#endif
}

// What a block of either tiled kernel works on: grid = (splits, kv heads, sequences); split x of sequence z
// covers positions [begin, end) in num_tiles tiles of kKeys keys, for the query heads head0 .. head0 + group
// of kv head y; Slot(p) is position p's cache slot through the sequence's block table.
struct TiledBlock {
  int split, kv_head, seq, num_splits, begin, end, num_tiles, head0, bs;
  int bs_shift;  // log2(bs) when bs is a power of two (the usual 16), else -1: Slot divides
  const int32_t* table;
  __device__ __forceinline__ TiledBlock(const int32_t* block_tables, int max_blocks,
                                        const int32_t* context_lens, int group, int partition, int block_size)
      : split(blockIdx.x),
        kv_head(blockIdx.y),
        seq(blockIdx.z),
        num_splits(gridDim.x),
        begin(blockIdx.x * partition),
        end(min(context_lens[blockIdx.z], begin + partition)),
        num_tiles(end > begin ? (end - begin + kKeys - 1) / kKeys : 0),
        head0(blockIdx.y * group),
        bs(block_size),
        bs_shift(Log2IfPow2(block_size)),
        table(block_tables + static_cast<int64_t>(blockIdx.z) * max_blocks) {}
  __device__ __forceinline__ int64_t Slot(int p) const {
    if (bs_shift >= 0) return (static_cast<int64_t>(table[p >> bs_shift]) << bs_shift) + (p & (bs - 1));
    return PagedSlot(table, p, bs);
  }
};

// The scores of a warp's 16 keys (element (n, e) is key key0 + 8n + 2t + (e & 1)) through scale(x, key),
// then the keys at or past `end` masked to -inf (only in the tile that reaches it).
template <typename Scale>
__device__ __forceinline__ void ScaleAndMask(float (&s)[2][4], int t, int key0, int end, Scale scale) {
  const bool need_mask = key0 + 16 > end;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int k = n * 8 + 2 * t + (e & 1);
      float x = scale(s[n][e], k);
      if (need_mask && key0 + k >= end) x = -INFINITY;
      s[n][e] = x;
    }
  }
}

// s (rows g: elements 0, 1; g + 8: 2, 3) becomes exp2(s - base of its row); sum0 / sum1: this thread's row
// sums.
__device__ __forceinline__ void Exp2AndSum(float (&s)[2][4], float base0, float base1, float& sum0,
                                           float& sum1) {
  sum0 = sum1 = 0.f;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    s[n][0] = Exp2Ftz(s[n][0] - base0);
    s[n][1] = Exp2Ftz(s[n][1] - base0);
    s[n][2] = Exp2Ftz(s[n][2] - base1);
    s[n][3] = Exp2Ftz(s[n][3] - base1);
    sum0 += s[n][0] + s[n][1];
    sum1 += s[n][2] + s[n][3];
  }
}

// One 16-key step of the online softmax of a warp's rows g and g + 8: s holds the scores in log2 units
// (element (n, e) is key 8n + 2t + (e & 1); masked keys -inf) and becomes exp2(s - new max); the running max
// m, this thread's share of the denominator l and the output accumulators o are rescaled to the new max.
//
// kLazy (both kernels use it): the running max moves only when some row's tile max passes it by more than
// kLazyLog2 (or the row had none yet), decided for the whole warp; otherwise s is exponentiated against the
// old max (values up to 2^kLazyLog2, exact in fp32 and fp16) and the 4 x kDTiles accumulators are not
// rescaled. The result is the same softmax; after the first tiles the max rarely moves that far.
constexpr float kLazyLog2 = 3.f;
template <int kDTiles, bool kLazy = false>
__device__ __forceinline__ void OnlineSoftmax(float (&s)[2][4], float& m0, float& m1, float& l0, float& l1,
                                              float (&o)[kDTiles][4]) {
  // Row maxima over the 4 threads of a row group.
  float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
  float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  if constexpr (kLazy) {
    // -inf > -inf + k is false: a row with nothing unmasked so far and now keeps m = -inf (s all 0 below).
    const bool move = mx0 > m0 + kLazyLog2 || mx1 > m1 + kLazyLog2;
    if (!__any_sync(0xffffffffu, move)) {
      const float base0 = m0 == -INFINITY ? 0.f : m0, base1 = m1 == -INFINITY ? 0.f : m1;
      float sum0, sum1;
      Exp2AndSum(s, base0, base1, sum0, sum1);
      l0 += sum0;
      l1 += sum1;
      return;
    }
  }
  const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
  // A row with nothing unmasked yet keeps m = -inf: subtract 0 instead (exp2(-inf) = 0, no NaN).
  const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
  const float corr0 = Exp2Ftz(m0 - base0), corr1 = Exp2Ftz(m1 - base1);
  m0 = mn0;
  m1 = mn1;
  float sum0, sum1;
  Exp2AndSum(s, base0, base1, sum0, sum1);
  l0 = l0 * corr0 + sum0;
  l1 = l1 * corr1 + sum1;
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) {
    o[d][0] *= corr0;
    o[d][1] *= corr0;
    o[d][2] *= corr1;
    o[d][3] *= corr1;
  }
}

// The end of both tiled kernels: every warp has written its 16 rows' unnormalised O (sm_o [warps][16][HD],
// head_dim in order), running max (log2 units) and denominator (sm_m, sm_l [warps][16]) and the block has
// synchronised. The block merges the warps' states per row and writes `out` (one split) or the normalised
// partial output and (max in natural-log units, denominator) to the workspace for DecodeReduceKernel.
template <int HD>
__device__ __forceinline__ void MergeWarpStates(const float* sm_o, const float* sm_m, const float* sm_l,
                                                int group, int seq, int heads, int head0, int split,
                                                int num_splits, __nv_bfloat16* __restrict__ out,
                                                float* __restrict__ part_out, float* __restrict__ part_ml) {
  constexpr int kThreads = kTiledWarps * 32;
  const int tid = threadIdx.x;
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

// The end of both tiled kernels, after their loops: each row's denominator summed over its 4 threads, every
// warp's 16 rows (O unnormalised, head_dim in order through col(d-tile, column)), max and denominator written
// to shared memory over the no longer read K/V buffers, then merged by MergeWarpStates.
template <int HD, int kDTiles, typename Col>
__device__ __forceinline__ void FinishWarps(unsigned char* smem_raw, const float (&o)[kDTiles][4], float m0,
                                            float m1, float l0, float l1, Col col, int group, int seq, int heads,
                                            int head0, int split, int num_splits, __nv_bfloat16* __restrict__ out,
                                            float* __restrict__ part_out, float* __restrict__ part_ml) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();  // every warp is done with the K/V buffers: the merge area overlays them
  float* sm_o = reinterpret_cast<float*>(smem_raw);  // [kTiledWarps][16][HD]
  float* sm_m = sm_o + kTiledWarps * 16 * HD;          // [kTiledWarps][16]
  float* sm_l = sm_m + kTiledWarps * 16;               // [kTiledWarps][16]
  float* r0 = sm_o + (warp * 16 + g) * HD;
  float* r1 = r0 + 8 * HD;
#pragma unroll
  for (int d = 0; d < kDTiles; ++d) {
    r0[col(d, 2 * t)] = o[d][0];
    r0[col(d, 2 * t + 1)] = o[d][1];
    r1[col(d, 2 * t)] = o[d][2];
    r1[col(d, 2 * t + 1)] = o[d][3];
  }
  if (t == 0) {
    sm_m[warp * 16 + g] = m0;
    sm_l[warp * 16 + g] = l0;
    sm_m[warp * 16 + g + 8] = m1;
    sm_l[warp * 16 + g + 8] = l1;
  }
  __syncthreads();
  MergeWarpStates<HD>(sm_o, sm_m, sm_l, group, seq, heads, head0, split, num_splits, out, part_out, part_ml);
}

template <int HD, int kCache, typename Kv>
__global__ void __launch_bounds__(kTiledWarps * 32)
    DecodeTiledKernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ block_tables,
                      int max_blocks, const int32_t* __restrict__ context_lens, int heads, int group,
                      int partition, float scale_log2, Kv kv, float* __restrict__ part_out,
                      float* __restrict__ part_ml, __nv_bfloat16* __restrict__ out, int kv_bufs) {
  PdlLaunchDependents();
  constexpr bool kQuant = kCache != kCacheBf16;
  constexpr int kThreads = kTiledWarps * 32;
  constexpr int kStride = HD + kSmemRowPad;  // shared row stride of the bf16 tiles, elements
  constexpr int kChunks = HD / 8;            // 16-byte chunks per bf16 row
  constexpr int kCodeChunks = HD / 16;       // 16-byte chunks per 8-bit row
  constexpr int kKSteps = HD / 16;           // k-steps of S = Q·K^T
  constexpr int kDTiles = HD / 8;            // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // bf16: [kv_bufs][kKeys][kStride] K, then V (kv_bufs = 1 when no block has more than one tile: half the
  // shared memory, more blocks per SM). 8-bit: one [kKeys][kStride] K and V, then the codes and scales.
  __nv_bfloat16* sk = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sv = sk + (kQuant ? 1 : kv_bufs) * kKeys * kStride;
  uint8_t* ck8 = reinterpret_cast<uint8_t*>(sv + kKeys * kStride);  // [2][kKeys][HD]
  uint8_t* cv8 = ck8 + 2 * kKeys * HD;                              // [2][kKeys][HD]
  float* ksc = reinterpret_cast<float*>(cv8 + 2 * kKeys * HD);       // [2][kKeys]
  float* vsc = ksc + 2 * kKeys;                                       // [2][kKeys]

  const TiledBlock b(block_tables, max_blocks, context_lens, group, partition, kv.block_size);
  const int split = b.split, kv_head = b.kv_head, seq = b.seq, num_splits = b.num_splits;
  const int begin = b.begin, end = b.end, num_tiles = b.num_tiles, head0 = b.head0, kvh = kv.num_kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  auto slot_of = [&](int p) { return b.Slot(p); };

  // Tile kt's rows into buffer buf. kPick (the first tile, around PdlWait): `skip` >= 0: every row but that
  // position's; `only` >= 0: that position's row alone (so no row is copied twice, and the zero fill past the
  // end happens once). The loop's loads take every row, without the tests.
  auto load_kv = [&](int kt, int buf, auto pick, int skip = -1, int only = -1) {
    constexpr bool kPick = decltype(pick)::value;
    if constexpr (!kQuant) {
      __nv_bfloat16* dk = sk + buf * kKeys * kStride;
      __nv_bfloat16* dv = sv + buf * kKeys * kStride;
      for (int c = tid; c < kKeys * kChunks; c += kThreads) {
        const int r = c / kChunks, ch = c - r * kChunks;
        const int p = begin + kt * kKeys + r;
        if (kPick && (p == skip || (only >= 0 && p != only))) continue;
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
        if (kPick && (p == skip || (only >= 0 && p != only))) continue;
        const bool ok = p < end;
        const int64_t off = ok ? (slot_of(p) * kvh + kv_head) * HD + ch * 16 : 0;
        CpAsync16(dk + r * HD + ch * 16, kv.k + off, ok ? 16 : 0);
        CpAsync16(dv + r * HD + ch * 16, kv.v + off, ok ? 16 : 0);
      }
      // Scales: threads 0..63 the keys' K scales, 64..127 their V scales (zeros past the end).
      const int r = tid & (kKeys - 1);
      const int p = begin + kt * kKeys + r;
      if (kPick && (p == skip || (only >= 0 && p != only))) return;
      const bool ok = p < end;
      const int64_t si = ok ? slot_of(p) * kvh + kv_head : 0;
      const float* src = tid < kKeys ? kv.k_scale + si : kv.v_scale + si;
      float* dst = (tid < kKeys ? ksc : vsc) + buf * kKeys + r;
      CpAsync4(dst, src, ok ? 4 : 0);
    }
  };
  // The first tile is requested before PdlWait: under PDL the kernels still running (the step's RoPE + cache
  // write, the QKV projection) write q and only the newest position's cache row (context_lens[seq] - 1, this
  // step's token); every older row was written by earlier steps. That row follows once they have finished.
  const int newest = end == context_lens[seq] ? end - 1 : -1;  // in this split, else none
  const bool newest_in_first = newest >= begin && newest < begin + kKeys;
  using Pick = std::true_type;
  if (num_tiles > 0) load_kv(0, 0, Pick{}, newest_in_first ? newest : -1);
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  if (num_tiles > 0 && newest_in_first) load_kv(0, 0, Pick{}, -1, newest);
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
    if (kt + 1 < num_tiles) load_kv(kt + 1, (kt + 1) & 1, std::false_type{});
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

    // Scale to log2 units (8-bit: times the key's K scale).
    const float* kscale = ksc + (kt & 1) * kKeys + warp * 16;
    ScaleAndMask(s, t, begin + kt * kKeys + warp * 16, end, [&](float x, int k) {
      x *= scale_log2;
      if constexpr (kQuant) x *= kscale[k];
      return x;
    });

    OnlineSoftmax<kDTiles, /*kLazy=*/true>(s, m0, m1, l0, l1, o);
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

  // Accumulator column c of d-tile d is head_dim column 8d + c.
  FinishWarps<HD>(smem_raw, o, m0, m1, l0, l1, [](int d, int c) { return 8 * d + c; }, group, seq, heads, head0,
                  split, num_splits, out, part_out, part_ml);
}

// ---- 8-bit caches, codes straight into fp16 fragments (AttentionLaunchOptions::decode_tiled_fragments) ----
//
// The same grid, tiles, splits, softmax and merge as DecodeTiledKernel, but nothing is shared between warps
// until the merge: warp w cp.asyncs only its own 16 keys of each tile (codes and scales, double-buffered in
// its own shared memory) and converts them from shared memory straight into fp16 mma fragments in registers,
// so the loop has no block barrier and no bf16 tile is written and read back.
//   codes -> fp16, exact, times a power of two (kFold): fp8 E4M3 by bit moves (sign, then exponent and
//   mantissa into the fp16 fields: value · 2^-8, subnormals included); int8 by the magic-number trick (0x48uu
//   as fp16 is 8 + uu / 128; minus 9 leaves code / 128). S = Q·K^T in fp16 (q · 2^-4 exact for |q| < 2^20)
//   with the head dimension permuted inside each 16-column step so that a thread's B fragment is one 32-bit
//   word of its key's row (logical k 2t, 2t+1, 2t+8, 2t+9 = bytes 0, 2, 1, 3 of the word at 4t); Q's A
//   fragment is permuted the same way. The K scale and the folds go on S in fp32. O += P·V in fp16 with P' =
//   P · v_scale · 2^kFold (in [0, ~amax]) and V' = code · 2^-kFold; the head dimension of O is permuted so
//   that a thread's B fragments for four d-tiles are the four bytes of one 32-bit word per key (d-tile 4G +
//   j, column n = physical d 32G + 4n + j), transposed by byte permutes. (The fp8 codes
//   converted by the hardware's cvt.rn.f16x2.e4m3x2 after a byte permute instead: 1.006-1.024x on the H100 at
//   batch 32-512, not kept: gpu_served_fp8_c512_h100_2026-12-05.json.)
template <int HD, bool kFp8>
struct FragCodes {
  static constexpr int kFold = kFp8 ? 8 : 7;  // log2 of what the fp16 values are divided by
  // The codes in bytes 0 and 2 (lo) or 1 and 3 (hi) of w as an fp16 pair (the first in the low half).
  static __device__ __forceinline__ uint32_t Lo(uint32_t w) {
    if constexpr (kFp8) {
      return ((w << 8) & 0x80008000u) | ((w << 7) & 0x3F803F80u);
    } else {
      return Int8(__byte_perm(w ^ 0x80808080u, 0x48484848u, 0x4240));
    }
  }
  static __device__ __forceinline__ uint32_t Hi(uint32_t w) {
    if constexpr (kFp8) {
      return (w & 0x80008000u) | ((w >> 1) & 0x3F803F80u);
    } else {
      return Int8(__byte_perm(w ^ 0x80808080u, 0x48484848u, 0x4341));
    }
  }
  static __device__ __forceinline__ uint32_t Int8(uint32_t biased) {  // (8 + u/128) - 9 = (u - 128) / 128
    const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&biased), __float2half2_rn(9.f));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
};

// Shared memory of the fragments kernel: per warp kStages buffers, each [16 keys][kFragRow] K codes, the same
// for V, then 16 K and 16 V scales. Rows are padded by 16 bytes: the 8 rows a fragment load touches start 4
// banks apart. kStages (AttentionLaunchOptions::decode_stages, 2..4): tiles kt + 1 .. kt + kStages - 1 are in
// flight while tile kt is used (2: double buffering).
template <int HD>
constexpr int kFragRow = HD + 16;
template <int HD>
constexpr int kFragWarpBuf = 2 * 16 * kFragRow<HD> + 2 * 16 * 4;
template <int HD, int kStages>
constexpr int DecodeFragSmemBytes() {
  return kTiledWarps * kStages * kFragWarpBuf<HD>;
}

template <int HD, bool kFp8, int kStages>
__global__ void __launch_bounds__(kTiledWarps * 32)
    DecodeFragKernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ block_tables,
                     int max_blocks, const int32_t* __restrict__ context_lens, int heads, int group,
                     int partition, float scale_log2, DevicePagedKvQuant kv, float* __restrict__ part_out,
                     float* __restrict__ part_ml, __nv_bfloat16* __restrict__ out) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  using Codes = FragCodes<HD, kFp8>;
  constexpr int kRow = kFragRow<HD>;
  constexpr int kBuf = kFragWarpBuf<HD>;
  constexpr int kKSteps = HD / 16;    // k-steps of S = Q·K^T
  constexpr int kDTiles = HD / 8;     // n-tiles of O
  constexpr int kCodeChunks = HD / 16;  // 16-byte chunks per 8-bit row
  extern __shared__ __align__(16) unsigned char smem_raw[];

  const TiledBlock b(block_tables, max_blocks, context_lens, group, partition, kv.block_size);
  const int split = b.split, kv_head = b.kv_head, seq = b.seq, num_splits = b.num_splits;
  const int begin = b.begin, end = b.end, num_tiles = b.num_tiles, head0 = b.head0, kvh = kv.num_kv_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  auto slot_of = [&](int p) { return b.Slot(p); };
  unsigned char* wbase = smem_raw + warp * kStages * kBuf;  // this warp's kStages buffers

  // This warp's 16 keys of tile kt into buffer buf: lane l finds key (l & 15)'s cache row once (its slot x kv
  // heads + kv head; -1 past the end), the chunk copies take theirs by shuffle; codes by 16-byte copies, then
  // lanes 0..15 the keys' K scales and 16..31 their V scales (zeros past the end).
  auto load = [&](int kt, int buf) {
    unsigned char* kb = wbase + buf * kBuf;
    unsigned char* vb = kb + 16 * kRow;
    const int key0 = begin + kt * kKeys + warp * 16;
    const int r = lane & 15;
    const int p = key0 + r;
    const int64_t my_row = p < end ? slot_of(p) * kvh + kv_head : -1;
#pragma unroll
    for (int c = lane; c < 16 * kCodeChunks; c += 32) {
      const int rr = c / kCodeChunks, ch = c - rr * kCodeChunks;
      const int64_t row = __shfl_sync(0xffffffffu, my_row, rr);
      const bool ok = row >= 0;
      const int64_t off = ok ? row * HD + ch * 16 : 0;
      CpAsync16(kb + rr * kRow + ch * 16, kv.k + off, ok ? 16 : 0);
      CpAsync16(vb + rr * kRow + ch * 16, kv.v + off, ok ? 16 : 0);
    }
    float* sc = reinterpret_cast<float*>(vb + 16 * kRow) + (lane < 16 ? 0 : 16) + r;
    CpAsync4(sc, (lane < 16 ? kv.k_scale : kv.v_scale) + (my_row >= 0 ? my_row : 0), my_row >= 0 ? 4 : 0);
  };
  // Tiles 0 .. kStages - 2, one commit group each (empty groups past the last tile keep the count: tile kt is
  // always group kt).
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles) load(st, st);
    CpAsyncCommit();
  }

  // Q's A fragments in fp16 (times 2^-4), the head dimension permuted as K's: in 16-column step ks, logical
  // columns 2t, 2t+1, 2t+8, 2t+9 are physical 16 ks + 4t + 0, 2, 1, 3. Rows past the group are zeros.
  uint32_t qa[kKSteps][4];
  {
    const bool has0 = g < group, has1 = g + 8 < group;
    const __nv_bfloat16* q0 = q + (static_cast<int64_t>(seq) * heads + head0 + g) * HD + 4 * t;
    const __nv_bfloat16* q1 = q0 + 8 * HD;
    constexpr float kQFold = 0.0625f;
    auto frag = [&](const __nv_bfloat16* p, bool has, uint32_t& even, uint32_t& odd) {
      if (!has) {
        even = odd = 0u;
        return;
      }
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));      // phys 0, 1
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + 2));  // phys 2, 3
      even = PackF16(a.x * kQFold, b.x * kQFold);  // logical 2t, 2t+1 = physical 0, 2
      odd = PackF16(a.y * kQFold, b.y * kQFold);   // logical 2t+8, 2t+9 = physical 1, 3
    };
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      frag(q0 + ks * 16, has0, qa[ks][0], qa[ks][2]);
      frag(q1 + ks * 16, has1, qa[ks][1], qa[ks][3]);
    }
  }
  // S in log2 units = S_acc · 2^(4 + kFold) · k_scale · scale · log2 e.
  const float s_mult = scale_log2 * static_cast<float>(1 << (4 + Codes::kFold));
  const float p_mult = static_cast<float>(1 << Codes::kFold);

  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g + 8; l: this thread's keys only
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int kt = 0, buf = 0; kt < num_tiles; ++kt, buf = buf + 1 == kStages ? 0 : buf + 1) {
    // Groups committed so far: kStages - 1 + kt; the kStages - 2 newest may still be in flight.
    CpAsyncWait<kStages - 2>();
    __syncwarp();  // this warp's tile kt landed (every lane's copies); its lanes are done with tile kt - 1
    // Tile kt + kStages - 1 into the buffer tile kt - 1 used.
    if (kt + kStages - 1 < num_tiles) load(kt + kStages - 1, buf == 0 ? kStages - 1 : buf - 1);
    CpAsyncCommit();
    const unsigned char* kb = wbase + buf * kBuf;
    const unsigned char* vb = kb + 16 * kRow;
    const float* ksc = reinterpret_cast<const float*>(vb + 16 * kRow);
    const float* vsc = ksc + 16;

    // S = Q·K^T: thread (g, t)'s B fragment of n-tile n, k-step ks is the word at byte 16 ks + 4t of key 8n + g.
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const unsigned char* krow = kb + (n * 8 + g) * kRow + 4 * t;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(krow + ks * 16);
        MmaF16(s[n], qa[ks], Codes::Lo(w), Codes::Hi(w));
      }
    }
    ScaleAndMask(s, t, begin + kt * kKeys + warp * 16, end, [&](float x, int k) { return x * s_mult * ksc[k]; });
    OnlineSoftmax<kDTiles, /*kLazy=*/true>(s, m0, m1, l0, l1, o);

    // P' = P · v_scale · 2^kFold as the A fragment (16 rows x the warp's 16 keys, keys in order).
    const float v0 = vsc[2 * t] * p_mult, v1 = vsc[2 * t + 1] * p_mult;
    const float v8 = vsc[2 * t + 8] * p_mult, v9 = vsc[2 * t + 9] * p_mult;
    const uint32_t pa[4] = {PackF16(s[0][0] * v0, s[0][1] * v1), PackF16(s[0][2] * v0, s[0][3] * v1),
                            PackF16(s[1][0] * v8, s[1][1] * v9), PackF16(s[1][2] * v8, s[1][3] * v9)};
    // O += P'·V': per 32 columns G, the words at byte 32 G + 4g of keys 2t, 2t+1, 2t+8, 2t+9 hold column g of
    // d-tiles 4G + 0..3; byte permutes pair the keys per d-tile (bytes 0 / 2 and 1 / 3 of each result).
#pragma unroll
    for (int G = 0; G < HD / 32; ++G) {
      const unsigned char* vcol = vb + 2 * t * kRow + 32 * G + 4 * g;
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(vcol);
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(vcol + kRow);
      const uint32_t w8 = *reinterpret_cast<const uint32_t*>(vcol + 8 * kRow);
      const uint32_t w9 = *reinterpret_cast<const uint32_t*>(vcol + 9 * kRow);
      const uint32_t a01 = __byte_perm(w0, w1, 0x5410), b01 = __byte_perm(w0, w1, 0x7632);
      const uint32_t a89 = __byte_perm(w8, w9, 0x5410), b89 = __byte_perm(w8, w9, 0x7632);
      MmaF16(o[4 * G + 0], pa, Codes::Lo(a01), Codes::Lo(a89));
      MmaF16(o[4 * G + 1], pa, Codes::Hi(a01), Codes::Hi(a89));
      MmaF16(o[4 * G + 2], pa, Codes::Lo(b01), Codes::Lo(b89));
      MmaF16(o[4 * G + 3], pa, Codes::Hi(b01), Codes::Hi(b89));
    }
  }
  CpAsyncWaitAll();

  // Accumulator column c of d-tile 4G + j is head_dim column 32G + 4c + j.
  FinishWarps<HD>(smem_raw, o, m0, m1, l0, l1, [](int nt, int c) { return 32 * (nt >> 2) + 4 * c + (nt & 3); },
                  group, seq, heads, head0, split, num_splits, out, part_out, part_ml);
}

template <int HD, bool kFp8, int kStages>
Status LaunchFrag(const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs,
                  int heads, int splits, int partition, float scale, const DevicePagedKvQuant& kv,
                  float* part_out, float* part_ml, __nv_bfloat16* out, cudaStream_t stream, bool pdl) {
  constexpr int smem = DecodeFragSmemBytes<HD, kStages>();
  static_assert((kTiledWarps * 16 * HD + 2 * kTiledWarps * 16) * 4 <= smem, "merge area of DecodeFragKernel");
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(DecodeFragKernel<HD, kFp8, kStages>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float scale_log2 = scale * 1.4426950408889634f;
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv.num_kv_heads),
                  static_cast<unsigned>(num_seqs));
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, DecodeFragKernel<HD, kFp8, kStages>, grid, dim3(kTiledWarps * 32), smem,
                                    stream, q, bt, max_blocks, ctx, heads, heads / kv.num_kv_heads, partition,
                                    scale_log2, kv, part_out, part_ml, out));
  return OkStatus();
}

template <int HD, bool kFp8>
Status LaunchFragStages(int stages, const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx,
                        int num_seqs, int heads, int splits, int partition, float scale,
                        const DevicePagedKvQuant& kv, float* part_out, float* part_ml, __nv_bfloat16* out,
                        cudaStream_t stream, bool pdl) {
  const auto launch = stages == 4   ? LaunchFrag<HD, kFp8, 4>
                      : stages == 3 ? LaunchFrag<HD, kFp8, 3>
                                    : LaunchFrag<HD, kFp8, 2>;
  return launch(q, bt, max_blocks, ctx, num_seqs, heads, splits, partition, scale, kv, part_out, part_ml, out,
                stream, pdl);
}

template <int HD, int kCache, typename Kv>
Status Launch(const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs,
              int heads, int splits, int partition, float scale, const Kv& kv, float* part_out, float* part_ml,
              __nv_bfloat16* out, cudaStream_t stream, bool pdl) {
  constexpr int smem_max = DecodeTiledSmemBytes<HD, kCache>();
  constexpr int tile = kKeys * (HD + kSmemRowPad) * 2;
  static_assert((kTiledWarps * 16 * HD + 2 * kTiledWarps * 16) * 4 <= 2 * tile, "merge area of DecodeTiledKernel");
  // bf16 with splits of at most one tile (batch 1-8 at contexts up to ~4k): one K and one V buffer, no double
  // buffering to fill, so half the shared memory (35 instead of 70 KB at head_dim 128: four blocks per SM, as
  // many as the registers allow, instead of three; batch 1, context 4096 = 512 blocks is one wave on 132 SMs).
  const int kv_bufs = kCache == kCacheBf16 && partition <= kKeys ? 1 : 2;
  const int smem = kCache == kCacheBf16 ? 2 * kv_bufs * tile : smem_max;
  // Opt in above the 48 KB default (per function and device; cheap, so on every launch).
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(DecodeTiledKernel<HD, kCache, Kv>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
  const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv.num_kv_heads),
                  static_cast<unsigned>(num_seqs));
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, DecodeTiledKernel<HD, kCache, Kv>, grid, dim3(kTiledWarps * 32), smem,
                                    stream, q, bt, max_blocks, ctx, heads, heads / kv.num_kv_heads, partition,
                                    scale_log2, kv, part_out, part_ml, out, kv_bufs));
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
                         __nv_bfloat16* out, cudaStream_t stream, bool pdl) {
  RETURN_IF_ERROR(CheckTiled(q, num_seqs, heads, kv));
  return kv.head_dim == 64
             ? Launch<64, kCacheBf16>(q, block_tables, max_blocks, context_lens, num_seqs, heads, splits,
                                      partition, scale, kv, part_out, part_ml, out, stream, pdl)
             : Launch<128, kCacheBf16>(q, block_tables, max_blocks, context_lens, num_seqs, heads, splits,
                                       partition, scale, kv, part_out, part_ml, out, stream, pdl);
}

Status LaunchDecodeTiled(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                         const int32_t* context_lens, int num_seqs, int heads, int splits, int partition,
                         float scale, const DevicePagedKvQuant& kv, float* part_out, float* part_ml,
                         __nv_bfloat16* out, cudaStream_t stream, bool pdl) {
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
                part_out, part_ml, out, stream, pdl);
}

Status LaunchDecodeTiledFragments(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                                  const int32_t* context_lens, int num_seqs, int heads, int splits,
                                  int partition, float scale, const DevicePagedKvQuant& kv, float* part_out,
                                  float* part_ml, __nv_bfloat16* out, cudaStream_t stream, int stages,
                                  bool pdl) {
  RETURN_IF_ERROR(CheckTiled(q, num_seqs, heads, kv));
  if ((reinterpret_cast<uintptr_t>(kv.k_scale) | reinterpret_cast<uintptr_t>(kv.v_scale)) & 3) {
    return Status(StatusCode::kInvalidArgument, "PagedDecodeAttention (tiled): scales need 4-byte alignment");
  }
  if (stages < 2 || stages > 4) {
    return Status(StatusCode::kInvalidArgument,
                  "PagedDecodeAttention (tiled): decode_stages " + std::to_string(stages) + " must be 2, 3 or 4");
  }
  const bool fp8 = kv.dtype == KvCacheDtype::kFp8;
  const auto launch = kv.head_dim == 64 ? (fp8 ? LaunchFragStages<64, true> : LaunchFragStages<64, false>)
                                        : (fp8 ? LaunchFragStages<128, true> : LaunchFragStages<128, false>);
  return launch(stages, q, block_tables, max_blocks, context_lens, num_seqs, heads, splits, partition, scale,
                kv, part_out, part_ml, out, stream, pdl);
}

}  // namespace stoke::cuda
