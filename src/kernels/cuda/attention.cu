#include <cstdlib>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block in the attention kernels

// ---- RoPE + cache write
// ------------------------------------------------------------------------------------

// One block per token. Work items: (heads + kv_heads) * half rotation pairs, then kv_heads * head_dim V
// copies.
template <typename T>
__global__ void RopeWriteKvKernel(T* q, const T* __restrict__ k, const T* __restrict__ v,
                                  const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                                  int heads, const float* __restrict__ inv_freq, DevicePagedKv<T> kv) {
  const int64_t t = blockIdx.x;
  const int hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads;
  const float pos = static_cast<float>(positions[t]);
  const int32_t slot = slots[t];
  const int rot_items = (heads + kvh) * half;
  for (int w = threadIdx.x; w < rot_items; w += blockDim.x) {
    const int h = w / half, i = w - h * half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    if (h < heads) {
      T* a = q + (t * heads + h) * hd;
      const float x0 = ToFloat(a[i]), x1 = ToFloat(a[i + half]);
      a[i] = FromFloat<T>(x0 * c - x1 * s);
      a[i + half] = FromFloat<T>(x1 * c + x0 * s);
    } else if (slot >= 0) {
      const int kh = h - heads;
      const T* a = k + (t * kvh + kh) * hd;
      T* dst = kv.k + (static_cast<int64_t>(slot) * kvh + kh) * hd;
      const float x0 = ToFloat(a[i]), x1 = ToFloat(a[i + half]);
      dst[i] = FromFloat<T>(x0 * c - x1 * s);
      dst[i + half] = FromFloat<T>(x1 * c + x0 * s);
    }
  }
  if (slot < 0) return;
  for (int w = threadIdx.x; w < kvh * hd; w += blockDim.x) {
    kv.v[static_cast<int64_t>(slot) * kvh * hd + w] = v[t * kvh * hd + w];
  }
}

// ---- attention core
// ----------------------------------------------------------------------------------------

// Running softmax state of one warp; lane l holds elements [l * E, (l + 1) * E) of the head vector.
template <int E>
struct WarpState {
  float m = -INFINITY;  // max score so far
  float l = 0.f;        // Σ exp(score - m)
  float acc[E] = {};    // Σ exp(score - m) · v
};

// Folds positions begin, begin + step, ... < end of one (sequence, kv head) into the warp's state.
// q holds this lane's E query elements, already multiplied by the scale.
template <typename T, int E>
__device__ __forceinline__ void WarpAttend(const float (&q)[E], const DevicePagedKv<T>& kv,
                                           const int32_t* __restrict__ table, int kv_head, int begin, int end,
                                           int step, WarpState<E>& st) {
  const int lane = threadIdx.x & 31;
  const int hd = E * 32, bs = kv.block_size;
  for (int p = begin; p < end; p += step) {
    const int64_t slot = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    const int64_t off = (slot * kv.num_kv_heads + kv_head) * hd + lane * E;
    float kr[E], vr[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kr[e] = ToFloat(kv.k[off + e]);
      vr[e] = ToFloat(kv.v[off + e]);
    }
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s += q[e] * kr[e];
    s = WarpSum(s);
    const float m_new = fmaxf(st.m, s);
    const float corr = expf(st.m - m_new);  // exp(-inf) = 0 on the first position
    const float p_s = expf(s - m_new);
    st.l = st.l * corr + p_s;
#pragma unroll
    for (int e = 0; e < E; ++e) st.acc[e] = st.acc[e] * corr + p_s * vr[e];
    st.m = m_new;
  }
}

// Merges the kWarps warp states of a block through shared memory. Returns, for lane-element (lane, e), the
// merged (unnormalised) accumulator and, in *m_out / *l_out, the merged max and denominator. Called by all
// threads.
template <int E>
__device__ __forceinline__ void MergeWarps(WarpState<E>& st, float* sm_m, float* sm_l, float* sm_acc,
                                           float* m_out, float* l_out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm_m[warp] = st.m;
    sm_l[warp] = st.l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) sm_acc[warp * E * 32 + lane * E + e] = st.acc[e];
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, sm_m[w]);
  float l = 0.f;
  float acc[E] = {};
  for (int w = 0; w < kWarps; ++w) {
    if (sm_l[w] == 0.f) continue;  // a warp that saw no position (m = -inf)
    const float f = expf(sm_m[w] - m);
    l += sm_l[w] * f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += sm_acc[w * E * 32 + lane * E + e] * f;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) st.acc[e] = acc[e];
  *m_out = m;
  *l_out = l;
}

// grid = (num_splits, heads, num_seqs), block = kWarps * 32. Split s covers positions
// [s * kDecodePartition, min((s + 1) * kDecodePartition, ctx)). With one split the result goes straight to
// out; otherwise (normalised partial output, max, denominator) go to the workspace for DecodeReduceKernel.
template <typename T, int E>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeKernel(const T* __restrict__ q, const int32_t* __restrict__ block_tables, int max_blocks,
                 const int32_t* __restrict__ context_lens, int heads, float scale, DevicePagedKv<T> kv,
                 float* __restrict__ part_out, float* __restrict__ part_ml, T* __restrict__ out) {
  constexpr int kHd = E * 32;
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps * kHd];
  const int split = blockIdx.x, head = blockIdx.y, seq = blockIdx.z, num_splits = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ctx = context_lens[seq];
  const int begin = split * kDecodePartition;
  const int end = min(ctx, begin + kDecodePartition);
  const int kv_head = head / (heads / kv.num_kv_heads);
  const int64_t qo = (static_cast<int64_t>(seq) * heads + head) * kHd + lane * E;
  float qr[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = ToFloat(q[qo + e]) * scale;
  WarpState<E> st;
  WarpAttend<T, E>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head, begin + warp, end,
                   kWarps, st);
  float m, l;
  MergeWarps<E>(st, sm_m, sm_l, sm_acc, &m, &l);
  if (warp != 0) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (num_splits == 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) out[qo + e] = FromFloat<T>(st.acc[e] * inv);
    return;
  }
  const int64_t row = (static_cast<int64_t>(seq) * heads + head) * num_splits + split;
#pragma unroll
  for (int e = 0; e < E; ++e) part_out[row * kHd + lane * E + e] = st.acc[e] * inv;
  if (lane == 0) {
    part_ml[row * 2] = m;
    part_ml[row * 2 + 1] = l;
  }
}

// grid = (heads, num_seqs), block = head_dim threads: merges the splits by their log-sum-exp weights.
template <typename T>
__global__ void DecodeReduceKernel(const float* __restrict__ part_out, const float* __restrict__ part_ml,
                                   int num_splits, int heads, int head_dim, T* __restrict__ out) {
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int64_t row0 = (static_cast<int64_t>(seq) * heads + head) * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) {
    if (part_ml[(row0 + s) * 2 + 1] > 0.f) m = fmaxf(m, part_ml[(row0 + s) * 2]);
  }
  float num = 0.f, den = 0.f;
  for (int s = 0; s < num_splits; ++s) {
    const float l = part_ml[(row0 + s) * 2 + 1];
    if (l == 0.f) continue;
    const float w = l * expf(part_ml[(row0 + s) * 2] - m);
    num += w * part_out[(row0 + s) * head_dim + d];
    den += w;
  }
  out[(static_cast<int64_t>(seq) * heads + head) * head_dim + d] = FromFloat<T>(den > 0.f ? num / den : 0.f);
}

// One warp per (token, head): grid = ceil(total_tokens * heads / kWarps), block = kWarps * 32.
template <typename T, int E>
__global__ void __launch_bounds__(kWarps * 32)
    PrefillKernel(const T* __restrict__ q, const int32_t* __restrict__ cu_seqlens,
                  const int32_t* __restrict__ start_pos, int num_seqs, int64_t total_tokens,
                  const int32_t* __restrict__ block_tables, int max_blocks, int heads, float scale,
                  DevicePagedKv<T> kv, T* __restrict__ out) {
  constexpr int kHd = E * 32;
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= total_tokens * heads) return;
  const int64_t t = item / heads;
  const int head = static_cast<int>(item - t * heads);
  // The sequence of token t: the last s with cu_seqlens[s] <= t.
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int seq = lo;
  const int pos = start_pos[seq] + static_cast<int>(t - cu_seqlens[seq]);
  const int kv_head = head / (heads / kv.num_kv_heads);
  const int64_t qo = (t * heads + head) * kHd + lane * E;
  float qr[E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = ToFloat(q[qo + e]) * scale;
  WarpState<E> st;
  WarpAttend<T, E>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head, 0, pos + 1, 1, st);
  const float inv = st.l > 0.f ? 1.f / st.l : 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) out[qo + e] = FromFloat<T>(st.acc[e] * inv);
}

Status CheckShape(const char* what, int heads, int kv_heads, int head_dim) {
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

int NumSplits(int max_context_len) {
  return max_context_len <= 0 ? 1 : (max_context_len + kDecodePartition - 1) / kDecodePartition;
}

template <typename T, int E>
Status LaunchDecode(const T* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs,
                    int heads, int max_ctx, float scale, const DevicePagedKv<T>& kv, void* ws, T* out,
                    cudaStream_t stream) {
  const int splits = NumSplits(max_ctx);
  float* part_out = static_cast<float*>(ws);
  float* part_ml = part_out + static_cast<int64_t>(num_seqs) * heads * splits * kv.head_dim;
  if (splits > 1 && ws == nullptr) {
    return Status(StatusCode::kInvalidArgument, "PagedDecodeAttention: long contexts need a workspace");
  }
  dim3 grid(splits, heads, num_seqs);
  DecodeKernel<T, E>
      <<<grid, kWarps * 32, 0, stream>>>(q, bt, max_blocks, ctx, heads, scale, kv, part_out, part_ml, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (splits > 1) {
    DecodeReduceKernel<T><<<dim3(heads, num_seqs), kv.head_dim, 0, stream>>>(part_out, part_ml, splits, heads,
                                                                             kv.head_dim, out);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return OkStatus();
}

template <typename T>
Status Decode(const T* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs, int heads,
              int max_ctx, float scale, const DevicePagedKv<T>& kv, void* ws, T* out, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShape("PagedDecodeAttention", heads, kv.num_kv_heads, kv.head_dim));
  if (num_seqs <= 0) return OkStatus();
  switch (kv.head_dim) {
    case 64:
      return LaunchDecode<T, 2>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream);
    case 128:
      return LaunchDecode<T, 4>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream);
    default:
      return LaunchDecode<T, 8>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream);
  }
}

template <typename T>
Status Prefill(const T* q, const int32_t* cu, const int32_t* sp, int num_seqs, int64_t total,
               const int32_t* bt, int max_blocks, int heads, float scale, const DevicePagedKv<T>& kv, T* out,
               cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShape("PrefillAttention", heads, kv.num_kv_heads, kv.head_dim));
  if (num_seqs <= 0 || total <= 0) return OkStatus();
  const int64_t blocks = (total * heads + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "PrefillAttention: too many tokens");
  const unsigned g = static_cast<unsigned>(blocks);
  switch (kv.head_dim) {
    case 64:
      PrefillKernel<T, 2>
          <<<g, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt, max_blocks, heads, scale, kv, out);
      break;
    case 128:
      PrefillKernel<T, 4>
          <<<g, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt, max_blocks, heads, scale, kv, out);
      break;
    default:
      PrefillKernel<T, 8>
          <<<g, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt, max_blocks, heads, scale, kv, out);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

template <typename T>
Status Rope(T* q, const T* k, const T* v, const int32_t* positions, const int32_t* slots, int64_t tokens,
            int heads, const float* inv_freq, const DevicePagedKv<T>& kv, cudaStream_t stream) {
  if (kv.head_dim <= 0 || kv.head_dim % 2 != 0) {
    return Status(StatusCode::kInvalidArgument, "RopeWriteKv: head_dim must be even");
  }
  if (tokens <= 0) return OkStatus();
  if (tokens > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "RopeWriteKv: too many tokens");
  RopeWriteKvKernel<T>
      <<<static_cast<unsigned>(tokens), 256, 0, stream>>>(q, k, v, positions, slots, heads, inv_freq, kv);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace

size_t DecodeWorkspaceBytes(int num_seqs, int heads, int head_dim, int max_context_len) {
  const int splits = NumSplits(max_context_len);
  if (splits <= 1) return 0;
  return static_cast<size_t>(num_seqs) * heads * splits * (head_dim + 2) * sizeof(float);
}

Status RopeWriteKv(float* q, const float* k, const float* v, const int32_t* positions, const int32_t* slots,
                   int64_t tokens, int heads, const float* inv_freq, const DevicePagedKv<float>& kv,
                   cudaStream_t stream) {
  return Rope(q, k, v, positions, slots, tokens, heads, inv_freq, kv, stream);
}
Status RopeWriteKv(__nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const int32_t* positions,
                   const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                   const DevicePagedKv<__nv_bfloat16>& kv, cudaStream_t stream) {
  return Rope(q, k, v, positions, slots, tokens, heads, inv_freq, kv, stream);
}

Status PagedDecodeAttention(const float* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<float>& kv, void* workspace, float* out,
                            cudaStream_t stream) {
  return Decode(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads, max_context_len, scale,
                kv, workspace, out, stream);
}
Status PagedDecodeAttention(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<__nv_bfloat16>& kv, void* workspace,
                            __nv_bfloat16* out, cudaStream_t stream) {
  return Decode(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads, max_context_len, scale,
                kv, workspace, out, stream);
}

Status PrefillAttention(const float* q, const int32_t* cu_seqlens, const int32_t* start_pos, int num_seqs,
                        int64_t total_tokens, const int32_t* block_tables, int max_blocks_per_seq, int heads,
                        float scale, const DevicePagedKv<float>& kv, float* out, cudaStream_t stream) {
  return Prefill(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables, max_blocks_per_seq, heads,
                 scale, kv, out, stream);
}
Status PrefillAttention(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                        int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                        int max_blocks_per_seq, int heads, float scale,
                        const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  // STOKE_PREFILL_ATTENTION=warp forces the warp kernel (A/B runs, a way around a tiled-kernel problem).
  static const bool force_warp = [] {
    const char* e = std::getenv("STOKE_PREFILL_ATTENTION");
    return e != nullptr && std::string(e) == "warp";
  }();
  if (!force_warp && PrefillAttentionTiledSupports(kv.head_dim) && aligned(q) && aligned(kv.k) &&
      aligned(kv.v) && aligned(out) && total_tokens / 64 + num_seqs <= 65535 && heads <= 65535) {
    return PrefillAttentionTiled(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                 max_blocks_per_seq, heads, scale, kv, out, stream);
  }
  return Prefill(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables, max_blocks_per_seq, heads,
                 scale, kv, out, stream);
}
Status PrefillAttentionWarp(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                            int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                            int max_blocks_per_seq, int heads, float scale,
                            const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream) {
  return Prefill(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables, max_blocks_per_seq, heads,
                 scale, kv, out, stream);
}

}  // namespace stoke::cuda
