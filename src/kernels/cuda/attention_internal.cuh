// Pieces the bf16/fp32 attention kernels (attention.cu) share with the 8-bit-cache ones (attention_quant.cu):
// the online-softmax state, the split merge, the split count and the shape check. Included only by .cu files.
#pragma once

#include <algorithm>
#include <string>

#include "base/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block in the attention kernels
// Keys per shared-memory tile of the tensor-core decode kernel (decode_tiled.cu); with
// AttentionLaunchOptions::decode_tiled a split holds at least this many positions.
constexpr int kDecodeTiledKeys = 64;

// Running softmax state of one warp; lane l holds elements [l * E, (l + 1) * E) of the head vector.
template <int E>
struct WarpState {
  float m = -INFINITY;  // max score so far
  float l = 0.f;        // Σ exp(score - m)
  float acc[E] = {};    // Σ exp(score - m) · v
};

// grid = (heads, num_seqs), block = head_dim threads, num_splits floats of dynamic shared memory: merges the
// splits by their log-sum-exp weights. The max and the weights are computed across the block (a split per
// thread), then each thread sums its dimension over the splits. kPre > 0 (Reduce takes 32 or 64 past 8
// splits): the partial outputs of the first kPre splits are loaded into registers before the two block
// reductions, all in flight at once behind them; summed 8 loads at a time after them, 64 splits (batch 1,
// context 4096) were 8 round trips. The sum's order is the same either way.
template <typename T, int kPre>
__global__ void DecodeReduceKernel(const float* __restrict__ part_out, const float* __restrict__ part_ml,
                                   int num_splits, int heads, int head_dim, T* __restrict__ out) {
  PdlLaunchDependents();  // the output projection may start streaming its weights (gemv.h)
  PdlWait();  // launched with PDL (--pdl): the decode kernel has finished and its writes are visible
  extern __shared__ float weight[];
  __shared__ float scratch[32];
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int64_t row0 = (static_cast<int64_t>(seq) * heads + head) * num_splits;
  float pre[kPre > 0 ? kPre : 1];
#pragma unroll
  for (int s = 0; s < kPre; ++s) pre[s] = s < num_splits ? part_out[(row0 + s) * head_dim + d] : 0.f;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += blockDim.x) {
    if (part_ml[(row0 + s) * 2 + 1] > 0.f) m = fmaxf(m, part_ml[(row0 + s) * 2]);
  }
  m = BlockMax(m, scratch);
  float den = 0.f;
  for (int s = threadIdx.x; s < num_splits; s += blockDim.x) {
    const float l = part_ml[(row0 + s) * 2 + 1];
    const float w = l > 0.f ? l * expf(part_ml[(row0 + s) * 2] - m) : 0.f;
    weight[s] = w;
    den += w;
  }
  den = BlockSum(den, scratch);  // its __syncthreads also publishes weight[]
  float num = 0.f;
#pragma unroll
  for (int s = 0; s < kPre; ++s) {
    if (s < num_splits) num += weight[s] * pre[s];
  }
#pragma unroll 8
  for (int s = kPre; s < num_splits; ++s) num += weight[s] * part_out[(row0 + s) * head_dim + d];
  out[(static_cast<int64_t>(seq) * heads + head) * head_dim + d] = FromFloat<T>(den > 0.f ? num / den : 0.f);
}

// The split merge (nothing to do for one split: the decode kernel wrote `out`).
template <typename T>
Status Reduce(const float* part_out, const float* part_ml, int splits, int num_seqs, int heads, int head_dim,
              T* out, cudaStream_t stream, bool pdl) {
  if (splits <= 1) return OkStatus();
  // Registers for the first 32 or 64 splits' partial outputs past 8 splits (cuda_bench --only decode_attn on
  // the H100: with 64 at every split count, the bf16 calls of 2-8 splits ran at 0.88-0.97x, the predicated
  // loads costing more than they hide; gpu_decode_attention_b1_h100_2026-12-06.json).
  const auto kernel = splits > 32  ? DecodeReduceKernel<T, 64>
                      : splits > 8 ? DecodeReduceKernel<T, 32>
                                   : DecodeReduceKernel<T, 0>;
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, kernel, dim3(heads, num_seqs), dim3(head_dim),
                                    splits * sizeof(float), stream, part_out, part_ml, splits, heads, head_dim,
                                    out));
  return OkStatus();
}

// Column c of a token's fused qkv row as the split would store it: with the Qwen2 bias added, then rounded to
// bf16 (QkvRopeWriteKv's and QkvRopeWriteKvQuant's kernels, both forms).
__device__ __forceinline__ float QkvColumn(const __nv_bfloat16* __restrict__ row, const float* __restrict__ bias,
                                           int64_t c) {
  float x = __bfloat162float(row[c]);
  if (bias != nullptr) x = __bfloat162float(__float2bfloat16_rn(x + bias[c]));
  return x;
}

// Heads per block of the warp-per-head QkvRopeWriteKv kernels (attention.cu, attention_quant.cu): a warp each.
constexpr int kRopeHeadsPerBlock = 4;

// RoPE on pair i of the head whose columns start at col in a token's fused qkv row: columns i and i + half
// (QkvColumn) turned by `angle` (position * inv_freq[i]), each rounded to bf16. The QkvRopeWriteKv kernels, block
// and warp forms, bf16 and quantised caches.
__device__ __forceinline__ void RotatePair(const __nv_bfloat16* __restrict__ row, const float* __restrict__ bias,
                                           int64_t col, int i, int half, float angle, __nv_bfloat16& r0,
                                           __nv_bfloat16& r1) {
  float s, c;
  sincosf(angle, &s, &c);
  const float x0 = QkvColumn(row, bias, col + i), x1 = QkvColumn(row, bias, col + i + half);
  r0 = __float2bfloat16_rn(x0 * c - x1 * s);
  r1 = __float2bfloat16_rn(x1 * c + x0 * s);
}

inline Status CheckShape(const char* what, int heads, int kv_heads, int head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": head_dim " + std::to_string(head_dim) +
                                                    " not supported (64, 128, 256)");
  }
  if (kv_heads <= 0 || heads <= 0 || heads % kv_heads != 0) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": heads " + std::to_string(heads) +
                                                    " not a multiple of kv heads " +
                                                    std::to_string(kv_heads));
  }
  return OkStatus();
}

// Splits per (sequence, head): at least one per launch.decode_partition positions (bounded workspace at large
// batch), and more when the batch is small, so that about kDecodeTargetBlocks blocks share the GPU (batch 1 x
// 32 heads would otherwise leave 100+ SMs idle behind a few latency-bound blocks), but never fewer than
// launch.decode_min_partition positions per split (AttentionLaunchOptions, attention.h).
constexpr int kDecodeTargetBlocks = 2048;
inline int NumSplits(int num_seqs, int heads, int max_context_len, const AttentionLaunchOptions& launch) {
  if (max_context_len <= 0) return 1;
  // The tiled kernel reads keys 64 at a time: smaller splits would leave its warps idle. Whichever kernel then
  // runs (the warp kernel where the tiled one does not apply) gets the same split, so the workspace
  // (DecodeWorkspaceBytes) always matches.
  const int min_partition = std::max(launch.decode_tiled ? kDecodeTiledKeys : 1, launch.decode_min_partition);
  const int partition = std::max(1, launch.decode_partition);
  const int by_partition = (max_context_len + partition - 1) / partition;
  const int by_min = (max_context_len + min_partition - 1) / min_partition;
  const int64_t rows = std::max<int64_t>(1, int64_t{num_seqs} * heads);
  const int by_occupancy =
      static_cast<int>(std::min<int64_t>(by_min, (kDecodeTargetBlocks + rows - 1) / rows));
  return std::max(by_partition, by_occupancy);
}

}  // namespace

// decode_tiled.cu: the tensor-core decode kernel for `splits` splits of `partition` positions (NumSplits);
// with splits > 1 it writes part_out / part_ml for DecodeReduceKernel, else `out`.
Status LaunchDecodeTiled(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                         const int32_t* context_lens, int num_seqs, int heads, int splits, int partition,
                         float scale, const DevicePagedKv<__nv_bfloat16>& kv, float* part_out, float* part_ml,
                         __nv_bfloat16* out, cudaStream_t stream, bool pdl);
// The same over an 8-bit cache (int8 or fp8 codes widened to bf16 in shared memory, scales on S and P).
Status LaunchDecodeTiled(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                         const int32_t* context_lens, int num_seqs, int heads, int splits, int partition,
                         float scale, const DevicePagedKvQuant& kv, float* part_out, float* part_ml,
                         __nv_bfloat16* out, cudaStream_t stream, bool pdl);

// The same over an 8-bit cache with no shared bf16 tile and no block barrier in the loop: each warp loads its
// own 16 keys of a tile and converts the codes into fp16 mma fragments in registers
// (AttentionLaunchOptions::decode_tiled_fragments), with `stages` (2..4) tiles per warp in its cp.async
// pipeline (AttentionLaunchOptions::decode_stages).
Status LaunchDecodeTiledFragments(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks,
                                  const int32_t* context_lens, int num_seqs, int heads, int splits,
                                  int partition, float scale, const DevicePagedKvQuant& kv, float* part_out,
                                  float* part_ml, __nv_bfloat16* out, cudaStream_t stream, int stages, bool pdl);

// Whether PrefillAttention runs the tiled tensor-core kernel (PrefillAttentionTiled) for this call, over
// either cache kind: not forced to the warp kernel, a head_dim it takes, 16-byte aligned q / out / cache, and
// a grid within bounds (64-row tiles); otherwise the warp kernel.
template <typename Kv>
inline bool PrefillTakesTiled(const void* q, const Kv& kv, const void* out, int64_t total_tokens,
                              int num_seqs, int heads, const AttentionLaunchOptions& launch) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  return !launch.prefill_force_warp && PrefillAttentionTiledSupports(kv.head_dim) && aligned(q) &&
         aligned(kv.k) && aligned(kv.v) && aligned(out) && total_tokens / 64 + num_seqs <= 65535 &&
         heads <= 65535;
}

}  // namespace stoke::cuda
