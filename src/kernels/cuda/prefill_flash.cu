// Tensor-core prefill attention (FlashAttention-2 style) over the paged KV cache, bf16 in and out, fp32
// softmax statistics and accumulation. See PrefillAttentionTiled in attention.h for the contract.
//
// One CTA of W warps (4 or 8) per (query tile of kRows = 16 W MT rows, head, sequence); warp w owns query rows
// [16 MT w, 16 MT (w + 1)): MT = 1, or 2 in the encoder's tensor32 form (two m-tiles per K/V fragment). Grid = (heads, tile slots): slot y maps to (sequence, tile) by a walk over cu_seqlens, the
// last (heaviest, causal) tile of a sequence first; slots past the last tile exit. Key tiles of kKeys = 64
// positions are gathered from their cache blocks with cp.async (zero-filled past the end) into a
// double-buffered shared-memory K/V tile: tile j + 1 is in flight while tile j is used.
//   S = Q·K^T   mma.sync m16n8k16 (A = Q fragments in registers, B = K rows read as 32-bit pairs)
//   online softmax on the S accumulators (the SFU's exp2 with the scale folded into one FFMA, the running
//               max rescaled lazily), causal mask only on tiles that need it
//   O += P·V    mma.sync with P repacked from the S accumulators (no shared memory round trip) and V
//               fragments from ldmatrix.trans
// Fragment layouts and the mma / ldmatrix / cp.async helpers: kernels/cuda/mma.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/kv_codes.cuh"
#include "kernels/cuda/mma.cuh"

namespace stoke::cuda {
namespace {

constexpr int kKeys = 64;  // keys per K/V tile
// Lazy rescaling of the online softmax (log2 units): the running max moves only by more than this.
constexpr float kPrefillLazyLog2 = 8.f;
// K fragments by ldmatrix.x4 (4 registers per instruction) or by plain 32-bit shared loads (the simplest
// mapping of the B layout; flip to false to rule ldmatrix out if the tiled tests ever fail).
constexpr bool kKByLdMatrix = true;
constexpr int kPad = kSmemRowPad;

// Shared memory: Q [16 W MT][HD + kPad], then K[2] and V[2] of [kKeys][HD + kPad] (bf16). An 8-bit cache:
// one bf16 K and V tile each (the codes widened), then the codes K[2] and V[2] of [kKeys][HD] bytes and their
// scales K[2] and V[2] of [kKeys] floats, by cp.async.
template <int HD, int W, int MT, int kCache = kCacheBf16>
constexpr int FlashSmemBytes() {
  if constexpr (kCache == kCacheBf16) return (16 * W * MT + 4 * kKeys) * (HD + kPad) * 2;
  return (16 * W * MT + 2 * kKeys) * (HD + kPad) * 2 + 4 * kKeys * HD + 4 * kKeys * 4;
}

// kDense = false: the decoder's causal prefill over the paged cache (the contract of PrefillAttentionTiled).
// kDense = true: the encoder's bidirectional attention (EncoderAttentionTiled): q, k and v are rows of the
// fused qkv buffer (row stride q_stride = kv_stride = 3 x hidden, k at dense_k, v at dense_v), a query sees
// every key of its own sequence, grid = (heads, tiles of the longest sequence, sequences).
// MT: 16-row m-tiles per warp. 2 reuses every K/V fragment read from shared memory for two mma tiles (half
// the ldmatrix traffic per score), at twice the accumulator registers (head_dim 64 only). kCache: the paged
// cache's kind (kv_codes.cuh). 8-bit (causal form only): each tile's codes and scales arrive by cp.async
// (double-buffered), are widened to bf16 in shared memory once the tile lands, and the K scales multiply the
// scores, the V scales the softmax weights before P·V (the denominator keeps the unscaled ones).
template <int HD, int W, bool kDense, int MT = 1, int kCache = kCacheBf16>
__global__ void __launch_bounds__(W * 32) FlashPrefillKernel(
    const __nv_bfloat16* __restrict__ q, int64_t q_stride, const int32_t* __restrict__ cu_seqlens,
    const int32_t* __restrict__ start_pos, int num_seqs, const int32_t* __restrict__ block_tables,
    int max_blocks, int heads, float scale_log2,
    std::conditional_t<kCache == kCacheBf16, DevicePagedKv<__nv_bfloat16>, DevicePagedKvQuant> kv,
    const __nv_bfloat16* __restrict__ dense_k, const __nv_bfloat16* __restrict__ dense_v, int64_t kv_stride,
    __nv_bfloat16* __restrict__ out) {
  static_assert(MT == 1 || (MT == 2 && HD <= 64), "two m-tiles per warp only for head_dim <= 64");
  constexpr bool kQuant = kCache != kCacheBf16;
  static_assert(!(kQuant && kDense), "8-bit codes only in the paged (causal) form");
  constexpr int kRows = 16 * W * MT;  // query rows per CTA
  constexpr int kFlashThreads = W * 32;
  constexpr int kStride = HD + kPad;  // shared row stride, elements
  constexpr int kChunks = HD / 8;     // 16-byte chunks per row
  constexpr int kKSteps = HD / 16;    // k-steps of S = Q·K^T
  constexpr int kDTiles = HD / 8;     // n-tiles of O
  constexpr int kSTiles = kKeys / 8;  // n-tiles of S
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  constexpr int kTileBufs = kQuant ? 1 : 2;  // bf16 K/V tiles: cp.async targets, or the widened codes
  constexpr int kCodeChunks = HD / 16;       // 8-bit: 16-byte chunks of codes per row
  __nv_bfloat16* sk = sq + kRows * kStride;
  __nv_bfloat16* sv = sk + kTileBufs * kKeys * kStride;
  uint8_t* ck8 = reinterpret_cast<uint8_t*>(sv + kTileBufs * kKeys * kStride);  // 8-bit: [2][kKeys][HD]
  uint8_t* cv8 = ck8 + 2 * kKeys * HD;                                          // 8-bit: [2][kKeys][HD]
  float* ksc = reinterpret_cast<float*>(cv8 + 2 * kKeys * HD);                  // 8-bit: [2][kKeys]
  float* vsc = ksc + 2 * kKeys;                                                 // 8-bit: [2][kKeys]

  const int head = blockIdx.x;
  // Slot -> (sequence, tile); the sequence's last tile first.
  int seq = -1, tile = 0;
  if constexpr (kDense) {
    seq = blockIdx.z;
    tile = blockIdx.y;
    if ((cu_seqlens[seq + 1] - cu_seqlens[seq] + kRows - 1) / kRows <= tile) return;
  } else {
    int slot = blockIdx.y;
    for (int s = 0; s < num_seqs; ++s) {
      const int len = cu_seqlens[s + 1] - cu_seqlens[s];
      const int tiles = (len + kRows - 1) / kRows;
      if (slot < tiles) {
        seq = s;
        tile = tiles - 1 - slot;
        break;
      }
      slot -= tiles;
    }
  }
  if (seq < 0) return;  // a spare slot (the grid is an upper bound)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = cu_seqlens[seq];
  const int len = cu_seqlens[seq + 1] - tok0;
  const int start = kDense ? 0 : start_pos[seq];
  const int q0 = tile * kRows;                          // first local query row of the tile
  const int rows = min(kRows, len - q0);                // valid rows
  const int kv_end = kDense ? len : start + q0 + rows;  // keys [0, kv_end) are visited
  const int num_kv_tiles = (kv_end + kKeys - 1) / kKeys;
  const int kvh = kv.num_kv_heads;
  const int kv_head = kDense ? head : head / (heads / kvh);
  const int bs = kv.block_size;
  const int32_t* table = kDense ? nullptr : block_tables + static_cast<int64_t>(seq) * max_blocks;

  // Q tile (rows past the sequence: zeros).
  for (int c = tid; c < kRows * kChunks; c += kFlashThreads) {
    const int r = c / kChunks, ch = c - r * kChunks;
    const bool ok = r < rows;
    const __nv_bfloat16* src =
        ok ? q + static_cast<int64_t>(tok0 + q0 + r) * q_stride + head * HD + ch * 8 : q;
    CpAsync16(sq + r * kStride + ch * 8, src, ok ? 16 : 0);
  }
  auto load_kv = [&](int kt, int buf) {
    if constexpr (kQuant) {
      uint8_t* dk = ck8 + buf * kKeys * HD;
      uint8_t* dv = cv8 + buf * kKeys * HD;
      for (int c = tid; c < kKeys * kCodeChunks; c += kFlashThreads) {
        const int r = c / kCodeChunks, ch = c - r * kCodeChunks;
        const int p = kt * kKeys + r;
        const bool ok = p < kv_end;
        const int64_t off =
            ok ? (PagedSlot(table, p, bs) * kvh + kv_head) * HD + ch * 16 : 0;
        CpAsync16(dk + r * HD + ch * 16, kv.k + off, ok ? 16 : 0);
        CpAsync16(dv + r * HD + ch * 16, kv.v + off, ok ? 16 : 0);
      }
      for (int c = tid; c < 2 * kKeys; c += kFlashThreads) {  // K scales, then V scales (zeros past the end)
        const int r = c & (kKeys - 1);
        const int p = kt * kKeys + r;
        const bool ok = p < kv_end;
        const int64_t si = ok ? PagedSlot(table, p, bs) * kvh + kv_head : 0;
        CpAsync4((c < kKeys ? ksc : vsc) + buf * kKeys + r, (c < kKeys ? kv.k_scale : kv.v_scale) + si,
                 ok ? 4 : 0);
      }
      return;
    }
    __nv_bfloat16* dk = sk + buf * kKeys * kStride;
    __nv_bfloat16* dv = sv + buf * kKeys * kStride;
    for (int c = tid; c < kKeys * kChunks; c += kFlashThreads) {
      const int r = c / kChunks, ch = c - r * kChunks;
      const int p = kt * kKeys + r;
      const bool ok = p < kv_end;
      int64_t off = 0;
      if constexpr (kDense) {
        if (ok) off = static_cast<int64_t>(tok0 + p) * kv_stride + head * HD + ch * 8;
        CpAsync16(dk + r * kStride + ch * 8, dense_k + off, ok ? 16 : 0);
        CpAsync16(dv + r * kStride + ch * 8, dense_v + off, ok ? 16 : 0);
      } else {
        if constexpr (!kQuant) {
          if (ok) {
            const int64_t slot = PagedSlot(table, p, bs);
            off = (slot * kvh + kv_head) * HD + ch * 8;
          }
          CpAsync16(dk + r * kStride + ch * 8, kv.k + off, ok ? 16 : 0);
          CpAsync16(dv + r * kStride + ch * 8, kv.v + off, ok ? 16 : 0);
        }
      }
    }
  };
  load_kv(0, 0);
  CpAsyncCommit();

  // Per thread and m-tile mt: rows r0 = 16 (MT warp + mt) + g and r1 = r0 + 8 of the tile.
  const int row_base = warp * 16 * MT + g;
  const int tile_min_pos = start + q0;  // smallest position of the tile
  float m[MT][2], l[MT][2];             // l: this thread's part of the row sum
  float o[MT][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  }
  // Q's A fragments stay in registers for the whole key walk.
  CpAsyncWaitAll();
  __syncthreads();
  uint32_t qa[MT][kKSteps][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const __nv_bfloat16* a = sq + (row_base + 16 * mt) * kStride + 2 * t;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      qa[mt][ks][0] = Ld32(a + ks * 16);
      qa[mt][ks][1] = Ld32(a + 8 * kStride + ks * 16);
      qa[mt][ks][2] = Ld32(a + ks * 16 + 8);
      qa[mt][ks][3] = Ld32(a + 8 * kStride + ks * 16 + 8);
    }
  }

  for (int kt = 0; kt < num_kv_tiles; ++kt) {
    CpAsyncWaitAll();
    __syncthreads();  // tile kt visible to all; every warp is done with tile kt - 1's buffer
    if (kt + 1 < num_kv_tiles) load_kv(kt + 1, (kt + 1) & 1);
    CpAsyncCommit();
    if constexpr (kQuant) {  // widen tile kt's codes into the bf16 tiles (the previous tile's readers are
                             // done)
      const uint8_t* fk = ck8 + (kt & 1) * kKeys * HD;
      const uint8_t* fv = cv8 + (kt & 1) * kKeys * HD;
      for (int c = tid; c < kKeys * kCodeChunks; c += kFlashThreads) {
        const int r = c / kCodeChunks, ch = c - r * kCodeChunks;
        WidenCodes<kCache>(*reinterpret_cast<const uint4*>(fk + r * HD + ch * 16),
                           sk + r * kStride + ch * 16);
        WidenCodes<kCache>(*reinterpret_cast<const uint4*>(fv + r * HD + ch * 16),
                           sv + r * kStride + ch * 16);
      }
      __syncthreads();
    }
    const __nv_bfloat16* ck = sk + (kQuant ? 0 : kt & 1) * kKeys * kStride;
    const __nv_bfloat16* cv = sv + (kQuant ? 0 : kt & 1) * kKeys * kStride;
    const float* kscale = ksc + (kt & 1) * kKeys;  // 8-bit only
    const float* vscale = vsc + (kt & 1) * kKeys;

    // S = Q·K^T for this warp's 16 MT rows and the tile's 64 keys.
    float s[MT][kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    }
    if constexpr (kKByLdMatrix) {
      // ldmatrix.x4 (not transposed): matrices (keys n*8 + 0..7, d 32k + 8i .. 8i + 7), i = 0..3, are b0, b1
      // of k-step 2k and b0, b1 of k-step 2k + 1.
      const __nv_bfloat16* krow = ck + (lane & 7) * kStride + (lane >> 3) * 8;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ks += 2) {
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
          uint32_t b0, b1, b2, b3;
          LdMatrixX4(b0, b1, b2, b3, krow + n * 8 * kStride + ks * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Mma(s[mt][n], qa[mt][ks], b0, b1);
            Mma(s[mt][n], qa[mt][ks + 1], b2, b3);
          }
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
          const __nv_bfloat16* b = ck + (n * 8 + g) * kStride + ks * 16 + 2 * t;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) Mma(s[mt][n], qa[mt][ks], Ld32(b), Ld32(b + 8));
        }
      }
    }

    // An 8-bit cache's K scales multiply the scores here (to log2 units); a bf16 cache's scores stay raw and
    // the scale to log2 units is folded into the exponent's FFMA below (sc). Masked keys become -inf; only
    // tiles reaching past the tile's first row (causal) or holding the sequence's end (dense) need it.
    const float sc = kQuant ? 1.f : scale_log2;
    const int key0 = kt * kKeys;
    const bool need_mask = kDense ? key0 + kKeys > kv_end : key0 + kKeys - 1 > tile_min_pos;
    if (kQuant || need_mask) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int pos0 = start + q0 + row_base + 16 * mt, pos1 = pos0 + 8;  // past `rows`: beyond kv_end
#pragma unroll
        for (int n = 0; n < kSTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[mt][n][e];
            if constexpr (kQuant) x *= scale_log2 * kscale[n * 8 + 2 * t + (e & 1)];
            if (need_mask) {
              const int key = key0 + n * 8 + 2 * t + (e & 1);
              const int pos = e < 2 ? pos0 : pos1;
              if ((!kDense && key > pos) || key >= kv_end) x = -INFINITY;
            }
            s[mt][n][e] = x;
          }
        }
      }
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // Online softmax: row maxima over the 4 threads of a row group (in the scores' units; sc > 0).
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      // Lazy rescaling: the running max moves only when some row's tile max passes it by more than
      // kPrefillLazyLog2 (or the row had none yet: -inf + x = -inf), decided for the whole warp; otherwise the
      // weights are taken against the old max (at most 2^kPrefillLazyLog2, exact enough in fp32 and as bf16
      // P) and O and l keep their scale. The same softmax; after the first tiles the max rarely moves so far.
      const float lazy = kPrefillLazyLog2 / sc;
      if (__any_sync(0xffffffffu, mx0 > m[mt][0] + lazy || mx1 > m[mt][1] + lazy)) {
        const float mn0 = fmaxf(m[mt][0], mx0), mn1 = fmaxf(m[mt][1], mx1);
        // A row with nothing unmasked yet keeps m = -inf: subtract 0 instead (2^-inf = 0, no NaN).
        const float base0 = mn0 == -INFINITY ? 0.f : mn0, base1 = mn1 == -INFINITY ? 0.f : mn1;
        const float corr0 = Exp2Ftz((m[mt][0] - base0) * sc), corr1 = Exp2Ftz((m[mt][1] - base1) * sc);
        m[mt][0] = mn0;
        m[mt][1] = mn1;
        l[mt][0] *= corr0;
        l[mt][1] *= corr1;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d) {
          o[mt][d][0] *= corr0;
          o[mt][d][1] *= corr0;
          o[mt][d][2] *= corr1;
          o[mt][d][3] *= corr1;
        }
      }
      // p = 2^(s sc - m sc): one FFMA and the SFU's exp2 per weight.
      const float nb0 = -(m[mt][0] == -INFINITY ? 0.f : m[mt][0]) * sc;
      const float nb1 = -(m[mt][1] == -INFINITY ? 0.f : m[mt][1]) * sc;
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < kSTiles; ++n) {
        s[mt][n][0] = Exp2Ftz(fmaf(s[mt][n][0], sc, nb0));
        s[mt][n][1] = Exp2Ftz(fmaf(s[mt][n][1], sc, nb0));
        s[mt][n][2] = Exp2Ftz(fmaf(s[mt][n][2], sc, nb1));
        s[mt][n][3] = Exp2Ftz(fmaf(s[mt][n][3], sc, nb1));
        sum0 += s[mt][n][0] + s[mt][n][1];
        sum1 += s[mt][n][2] + s[mt][n][3];
      }
      l[mt][0] += sum0;
      l[mt][1] += sum1;
    }

    // O += P·V: P's A fragment for keys [16j, 16j + 16) is S n-tiles 2j and 2j + 1.
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j) {
      uint32_t pa[MT][4];
      // 8-bit: P times the keys' V scales (keys 16j + 2t, + 1, + 8, + 9 for this thread's columns).
      float v0 = 1.f, v1 = 1.f, v2 = 1.f, v3 = 1.f;
      if constexpr (kQuant) {
        const float* vs = vscale + j * 16 + 2 * t;
        v0 = vs[0];
        v1 = vs[1];
        v2 = vs[8];
        v3 = vs[9];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = PackBf16(s[mt][2 * j][0] * v0, s[mt][2 * j][1] * v1);
        pa[mt][1] = PackBf16(s[mt][2 * j][2] * v0, s[mt][2 * j][3] * v1);
        pa[mt][2] = PackBf16(s[mt][2 * j + 1][0] * v2, s[mt][2 * j + 1][1] * v3);
        pa[mt][3] = PackBf16(s[mt][2 * j + 1][2] * v2, s[mt][2 * j + 1][3] * v3);
      }
      // ldmatrix.x4.trans: matrices (keys +0..7, d +0..7), (keys +8..15, d +0..7), (keys +0..7, d +8..15),
      // (keys +8..15, d +8..15) = b0, b1 of d-tile 2dp and b0, b1 of d-tile 2dp + 1.
      const __nv_bfloat16* vrow =
          cv + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + (lane >> 4) * 8;
#pragma unroll
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4Trans(b0, b1, b2, b3, vrow + dp * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma(o[mt][2 * dp], pa[mt], b0, b1);
          Mma(o[mt][2 * dp + 1], pa[mt], b2, b3);
        }
      }
    }
  }
  CpAsyncWaitAll();  // nothing is in flight, but leave no copy behind

  // Full row sums, normalise, store the valid rows.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float l0 = l[mt][0], l1 = l[mt][1];
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, off);
      l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    const int row0 = row_base + 16 * mt;
    __nv_bfloat16* o0 = out + (static_cast<int64_t>(tok0 + q0 + row0) * heads + head) * HD + 2 * t;
    __nv_bfloat16* o1 = o0 + static_cast<int64_t>(8) * heads * HD;
    const bool w0 = row0 < rows, w1 = row0 + 8 < rows;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d) {
      if (w0) *reinterpret_cast<uint32_t*>(o0 + d * 8) = PackBf16(o[mt][d][0] * inv0, o[mt][d][1] * inv0);
      if (w1) *reinterpret_cast<uint32_t*>(o1 + d * 8) = PackBf16(o[mt][d][2] * inv1, o[mt][d][3] * inv1);
    }
  }
}

template <int HD, int W, int kCache = kCacheBf16, typename Kv>
Status LaunchFlash(const __nv_bfloat16* q, const int32_t* cu, const int32_t* sp, int num_seqs, int64_t total,
                   const int32_t* bt, int max_blocks, int heads, float scale, const Kv& kv,
                   __nv_bfloat16* out, cudaStream_t stream) {
  // Tiles <= sum over sequences of ceil(len / kRows) <= total / kRows + num_seqs.
  constexpr int kRows = 16 * W;
  const int64_t slots = total / kRows + num_seqs;
  if (slots > 65535 || heads > 65535) {
    return Status(StatusCode::kInvalidArgument, "PrefillAttentionTiled: " + std::to_string(total) +
                                                    " tokens in " + std::to_string(num_seqs) +
                                                    " sequences need " + std::to_string(slots) +
                                                    " query tiles (at most 65535)");
  }
  constexpr int smem = FlashSmemBytes<HD, W, 1, kCache>();
  static_assert(smem <= 227 * 1024, "shared memory of FlashPrefillKernel");
  // Opt in above the 48 KB default (per function and device; cheap, so on every launch).
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(FlashPrefillKernel<HD, W, false, 1, kCache>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const float scale_log2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x · log2 e)
  FlashPrefillKernel<HD, W, false, 1, kCache>
      <<<dim3(heads, static_cast<unsigned>(slots)), W * 32, smem, stream>>>(
          q, int64_t{heads} * HD, cu, sp, num_seqs, bt, max_blocks, heads, scale_log2, kv, nullptr, nullptr,
          0, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

template <int HD, int MT>
Status LaunchDenseFlash(const __nv_bfloat16* qkv, const int32_t* cu, int num_seqs, int max_len, int heads,
                        float scale, __nv_bfloat16* out, cudaStream_t stream) {
  constexpr int W = 4, kRows = 16 * W * MT;
  const int tiles = (max_len + kRows - 1) / kRows;
  if (tiles > 65535 || num_seqs > 65535 || heads > 65535) {
    return Status(StatusCode::kInvalidArgument, "EncoderAttentionTiled: grid too large (" +
                                                    std::to_string(num_seqs) + " sequences up to " +
                                                    std::to_string(max_len) + " tokens)");
  }
  constexpr int smem = FlashSmemBytes<HD, W, MT>();
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(FlashPrefillKernel<HD, W, true, MT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t hidden = int64_t{heads} * HD;
  const float scale_log2 = scale * 1.4426950408889634f;
  DevicePagedKv<__nv_bfloat16> none{};
  FlashPrefillKernel<HD, W, true, MT>
      <<<dim3(heads, static_cast<unsigned>(tiles), static_cast<unsigned>(num_seqs)), W * 32, smem, stream>>>(
          qkv, 3 * hidden, cu, nullptr, num_seqs, nullptr, 0, heads, scale_log2, none, qkv + hidden,
          qkv + 2 * hidden, 3 * hidden, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

bool EncoderAttentionTiledSupports(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

Status EncoderAttentionTiled(const __nv_bfloat16* qkv, const int32_t* cu_seqlens, int num_seqs, int max_len,
                             int heads, int head_dim, float scale, __nv_bfloat16* out, cudaStream_t stream,
                             int warp_rows) {
  if (!EncoderAttentionTiledSupports(head_dim)) {
    return Status(
        StatusCode::kInvalidArgument,
        "EncoderAttentionTiled: head_dim " + std::to_string(head_dim) + " not supported (32, 64, 128)");
  }
  if (warp_rows != 16 && !(warp_rows == 32 && head_dim <= 64)) {
    return Status(StatusCode::kInvalidArgument, "EncoderAttentionTiled: warp_rows " + std::to_string(warp_rows) +
                                                    " (16, or 32 for head_dim <= 64)");
  }
  if ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(out)) & 15) {
    return Status(StatusCode::kInvalidArgument, "EncoderAttentionTiled: qkv and out need 16-byte alignment");
  }
  if (num_seqs <= 0 || max_len <= 0 || heads <= 0) return OkStatus();
  const bool wide = warp_rows == 32;
  switch (head_dim) {
    case 32:
      return wide ? LaunchDenseFlash<32, 2>(qkv, cu_seqlens, num_seqs, max_len, heads, scale, out, stream)
                  : LaunchDenseFlash<32, 1>(qkv, cu_seqlens, num_seqs, max_len, heads, scale, out, stream);
    case 64:
      return wide ? LaunchDenseFlash<64, 2>(qkv, cu_seqlens, num_seqs, max_len, heads, scale, out, stream)
                  : LaunchDenseFlash<64, 1>(qkv, cu_seqlens, num_seqs, max_len, heads, scale, out, stream);
    default:
      return LaunchDenseFlash<128, 1>(qkv, cu_seqlens, num_seqs, max_len, heads, scale, out, stream);
  }
}

bool PrefillAttentionTiledSupports(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}

namespace {

// PrefillAttentionTiled's checks and launch over either cache kind.
template <int kCache, typename Kv>
Status PrefillTiled(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos, int num_seqs,
                    int64_t total_tokens, const int32_t* block_tables, int max_blocks_per_seq, int heads,
                    float scale, const Kv& kv, __nv_bfloat16* out, cudaStream_t stream, int tile_rows) {
  if (tile_rows != 64 && tile_rows != 128) {
    return Status(StatusCode::kInvalidArgument,
                  "PrefillAttentionTiled: tile_rows " + std::to_string(tile_rows) + " (64 or 128)");
  }
  if (!PrefillAttentionTiledSupports(kv.head_dim)) {
    return Status(StatusCode::kInvalidArgument, "PrefillAttentionTiled: head_dim " +
                                                    std::to_string(kv.head_dim) + " not supported (64, 128)");
  }
  if (kv.num_kv_heads <= 0 || heads <= 0 || heads % kv.num_kv_heads != 0) {
    return Status(StatusCode::kInvalidArgument, "PrefillAttentionTiled: heads " + std::to_string(heads) +
                                                    " not a multiple of kv heads " +
                                                    std::to_string(kv.num_kv_heads));
  }
  if (kv.block_size <= 0) {
    return Status(StatusCode::kInvalidArgument,
                  "PrefillAttentionTiled: block_size " + std::to_string(kv.block_size));
  }
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(q) || misaligned(kv.k) || misaligned(kv.v) || misaligned(out)) {
    return Status(StatusCode::kInvalidArgument,
                  "PrefillAttentionTiled: q, out and the cache need 16-byte alignment");
  }
  if (num_seqs <= 0 || total_tokens <= 0) return OkStatus();
  const bool hd64 = kv.head_dim == 64, big = tile_rows == 128;
  if (hd64) {
    return big ? LaunchFlash<64, 8, kCache>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                            max_blocks_per_seq, heads, scale, kv, out, stream)
               : LaunchFlash<64, 4, kCache>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                            max_blocks_per_seq, heads, scale, kv, out, stream);
  }
  return big ? LaunchFlash<128, 8, kCache>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                           max_blocks_per_seq, heads, scale, kv, out, stream)
             : LaunchFlash<128, 4, kCache>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                           max_blocks_per_seq, heads, scale, kv, out, stream);
}

}  // namespace

Status PrefillAttentionTiled(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                             int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                             int max_blocks_per_seq, int heads, float scale,
                             const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream,
                             int tile_rows) {
  return PrefillTiled<kCacheBf16>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                  max_blocks_per_seq, heads, scale, kv, out, stream, tile_rows);
}

Status PrefillAttentionTiled(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                             int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                             int max_blocks_per_seq, int heads, float scale, const DevicePagedKvQuant& kv,
                             __nv_bfloat16* out, cudaStream_t stream, int tile_rows) {
  if (kv.dtype != KvCacheDtype::kInt8 && kv.dtype != KvCacheDtype::kFp8) {
    return Status(StatusCode::kInvalidArgument, "PrefillAttentionTiled: an 8-bit cache must be int8 or fp8");
  }
  if (kv.k_scale == nullptr || kv.v_scale == nullptr) {
    return Status(StatusCode::kInvalidArgument, "PrefillAttentionTiled: the 8-bit cache has no scales");
  }
  if (kv.dtype == KvCacheDtype::kFp8) {
    return PrefillTiled<kCacheFp8>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                   max_blocks_per_seq, heads, scale, kv, out, stream, tile_rows);
  }
  return PrefillTiled<kCacheInt8>(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                  max_blocks_per_seq, heads, scale, kv, out, stream, tile_rows);
}

}  // namespace stoke::cuda
