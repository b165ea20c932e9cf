#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {
namespace {

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

// The fused form for bf16 (decoder steps): reads the fused projection output qkv = [tokens, q_dim + 2 kv_dim]
// (+ bias, rounded to bf16 as SplitQkv stores it), writes rotated q densely and rotated k / plain v into the
// cache. grid = (tokens, heads + kv_heads), block = head_dim / 2 threads: thread i rotates pair (i, i + half)
// of its head and, for a kv head, also copies v elements i and i + half.
__global__ void QkvRopeWriteKvKernel(const __nv_bfloat16* __restrict__ qkv, const float* __restrict__ bias,
                                     const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
                                     int heads, const float* __restrict__ inv_freq,
                                     DevicePagedKv<__nv_bfloat16> kv, __nv_bfloat16* __restrict__ q_out) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const int hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads;
  const int64_t width = static_cast<int64_t>(heads + 2 * kvh) * hd;
  const __nv_bfloat16* row = qkv + t * width;
  const int32_t slot = slots[t];
  auto load = [&](int64_t c) { return QkvColumn(row, bias, c); };
  const int64_t col = static_cast<int64_t>(h) * hd;  // q heads, then k heads
  __nv_bfloat16 r0, r1;
  RotatePair(row, bias, col, i, half, static_cast<float>(positions[t]) * inv_freq[i], r0, r1);
  if (h < heads) {
    __nv_bfloat16* a = q_out + (t * heads + h) * hd;
    a[i] = r0;
    a[i + half] = r1;
    return;
  }
  if (slot < 0) return;
  const int kh = h - heads;
  const int64_t dst = (static_cast<int64_t>(slot) * kvh + kh) * hd;
  kv.k[dst + i] = r0;
  kv.k[dst + i + half] = r1;
  const int64_t vcol = static_cast<int64_t>(heads + kvh + kh) * hd;
  kv.v[dst + i] = __float2bfloat16_rn(load(vcol + i));
  kv.v[dst + i + half] = __float2bfloat16_rn(load(vcol + i + half));
}

// The same with one warp per head, 4 heads per block, instead of a block of head_dim / 2 threads per (token,
// head) (warp_heads, --vector-elementwise): lane l rotates pairs l, l + 32, ... (head_dim % 64 == 0, <= 256).
// Per value the same arithmetic: the same q and cache bytes.

__global__ void QkvRopeWriteKvWarpKernel(const __nv_bfloat16* __restrict__ qkv,
                                         const float* __restrict__ bias,
                                         const int32_t* __restrict__ positions,
                                         const int32_t* __restrict__ slots, int heads,
                                         const float* __restrict__ inv_freq, DevicePagedKv<__nv_bfloat16> kv,
                                         __nv_bfloat16* __restrict__ q_out) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kRopeHeadsPerBlock + (threadIdx.x >> 5);
  const int hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads, pairs = half / 32;
  if (h >= heads + kvh) return;
  const int64_t width = static_cast<int64_t>(heads + 2 * kvh) * hd;
  const __nv_bfloat16* row = qkv + t * width;
  const int32_t slot = slots[t];
  if (h >= heads && slot < 0) return;  // a kv head of a padding token writes nothing
  auto load = [&](int64_t c) { return QkvColumn(row, bias, c); };
  const float pos = static_cast<float>(positions[t]);
  const int64_t col = static_cast<int64_t>(h) * hd;  // q heads, then k heads
  const int kh = h - heads;
  const int64_t dst = (static_cast<int64_t>(slot) * kvh + kh) * hd;
  const int64_t vcol = static_cast<int64_t>(heads + kvh + kh) * hd;
  for (int p = 0; p < pairs; ++p) {
    const int i = lane + 32 * p;
    __nv_bfloat16 r0, r1;
    RotatePair(row, bias, col, i, half, pos * inv_freq[i], r0, r1);
    if (h < heads) {
      __nv_bfloat16* a = q_out + (t * heads + h) * hd;
      a[i] = r0;
      a[i + half] = r1;
      continue;
    }
    kv.k[dst + i] = r0;
    kv.k[dst + i + half] = r1;
    kv.v[dst + i] = __float2bfloat16_rn(load(vcol + i));
    kv.v[dst + i + half] = __float2bfloat16_rn(load(vcol + i + half));
  }
}

// ---- attention core
// ----------------------------------------------------------------------------------------

// Folds positions begin, begin + step, ... < end of one (sequence, kv head) into the warp's states of the G
// query heads that share that kv head (GQA): each K/V row is loaded once for all G of them. q[g] holds this
// lane's E query elements of head g, already multiplied by the scale.
template <typename T, int E, int G>
__device__ __forceinline__ void WarpAttend(const float (&q)[G][E], const DevicePagedKv<T>& kv,
                                           const int32_t* __restrict__ table, int kv_head, int begin, int end,
                                           int step, bool pipeline, WarpState<E> (&st)[G]) {
  const int lane = threadIdx.x & 31;
  const int hd = E * 32, bs = kv.block_size;
  auto offset = [&](int p) {
    const int64_t slot = PagedSlot(table, p, bs);
    return (slot * kv.num_kv_heads + kv_head) * hd + lane * E;
  };
  // Software pipeline: the next position's K/V rows are loaded before this one's scores are computed, so
  // each position's memory latency overlaps the previous position's shuffles and exponentials (the
  // arithmetic and its order are unchanged).
  T kn[E], vn[E];
  if (pipeline && begin < end) {
    const int64_t off = offset(begin);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kn[e] = kv.k[off + e];
      vn[e] = kv.v[off + e];
    }
  }
  for (int p = begin; p < end; p += step) {
    if (!pipeline) {
      const int64_t off = offset(p);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kn[e] = kv.k[off + e];
        vn[e] = kv.v[off + e];
      }
    }
    float kr[E], vr[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kr[e] = ToFloat(kn[e]);
      vr[e] = ToFloat(vn[e]);
    }
    if (pipeline && p + step < end) {
      const int64_t off = offset(p + step);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        kn[e] = kv.k[off + e];
        vn[e] = kv.v[off + e];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) s += q[g][e] * kr[e];
      s = WarpSum(s);
      const float m_new = fmaxf(st[g].m, s);
      const float corr = expf(st[g].m - m_new);  // exp(-inf) = 0 on the first position
      const float p_s = expf(s - m_new);
      st[g].l = st[g].l * corr + p_s;
#pragma unroll
      for (int e = 0; e < E; ++e) st[g].acc[e] = st[g].acc[e] * corr + p_s * vr[e];
      st[g].m = m_new;
    }
  }
}

// grid = (num_splits, heads / G, num_seqs), block = kWarps * 32: the G query heads [y * G, y * G + G), which
// share one kv head, over split x of sequence z. Split s covers positions [s * partition, min((s + 1) *
// partition, ctx)), the warps taking every kWarps-th position. The warps' states merge through shared memory
// (in warp order); warp 0 writes: with one split straight to out, otherwise (normalised partial output, max,
// denominator) to the workspace for DecodeReduceKernel.
template <typename T, int E, int G>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeKernel(const T* __restrict__ q, const int32_t* __restrict__ block_tables, int max_blocks,
                 const int32_t* __restrict__ context_lens, int heads, int partition, float scale,
                 DevicePagedKv<T> kv, float* __restrict__ part_out, float* __restrict__ part_ml,
                 T* __restrict__ out, bool pipeline) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  constexpr int kHd = E * 32;
  __shared__ float sm_m[kWarps * G], sm_l[kWarps * G];
  __shared__ float sm_acc[kWarps * G * kHd];
  const int split = blockIdx.x, head0 = blockIdx.y * G, seq = blockIdx.z, num_splits = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ctx = context_lens[seq];
  const int begin = split * partition;
  const int end = min(ctx, begin + partition);
  const int kv_head = head0 / (heads / kv.num_kv_heads);
  float qr[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int64_t qo = (static_cast<int64_t>(seq) * heads + head0 + g) * kHd + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) qr[g][e] = ToFloat(q[qo + e]) * scale;
  }
  WarpState<E> st[G];
  WarpAttend<T, E, G>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head, begin + warp,
                      end, kWarps, pipeline, st);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm_m[warp * G + g] = st[g].m;
      sm_l[warp * G + g] = st[g].l;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) sm_acc[(warp * G + g) * kHd + lane * E + e] = st[g].acc[e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, sm_m[w * G + g]);
    float l = 0.f;
    float acc[E] = {};
    for (int w = 0; w < kWarps; ++w) {
      if (sm_l[w * G + g] == 0.f) continue;  // a warp that saw no position (m = -inf)
      const float f = expf(sm_m[w * G + g] - m);
      l += sm_l[w * G + g] * f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += sm_acc[(w * G + g) * kHd + lane * E + e] * f;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t hrow = static_cast<int64_t>(seq) * heads + head0 + g;
    if (num_splits == 1) {
#pragma unroll
      for (int e = 0; e < E; ++e) out[hrow * kHd + lane * E + e] = FromFloat<T>(acc[e] * inv);
      continue;
    }
    const int64_t row = hrow * num_splits + split;
#pragma unroll
    for (int e = 0; e < E; ++e) part_out[row * kHd + lane * E + e] = acc[e] * inv;
    if (lane == 0) {
      part_ml[row * 2] = m;
      part_ml[row * 2 + 1] = l;
    }
  }
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
  float qr[1][E];
#pragma unroll
  for (int e = 0; e < E; ++e) qr[0][e] = ToFloat(q[qo + e]) * scale;
  WarpState<E> st[1];
  WarpAttend<T, E, 1>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head, 0, pos + 1, 1,
                      /*pipeline=*/true, st);
  const float inv = st[0].l > 0.f ? 1.f / st[0].l : 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) out[qo + e] = FromFloat<T>(st[0].acc[e] * inv);
}

template <typename T, int E>
Status LaunchDecode(const T* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs,
                    int heads, int max_ctx, float scale, const DevicePagedKv<T>& kv, void* ws, T* out,
                    cudaStream_t stream, const AttentionLaunchOptions& launch) {
  const int splits = NumSplits(num_seqs, heads, max_ctx, launch);
  const int partition = max_ctx <= 0 ? 1 : (max_ctx + splits - 1) / splits;
  float* part_out = static_cast<float*>(ws);
  float* part_ml = part_out + static_cast<int64_t>(num_seqs) * heads * splits * kv.head_dim;
  if (splits > 1 && ws == nullptr) {
    return Status(StatusCode::kInvalidArgument, "PagedDecodeAttention: long contexts need a workspace");
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (launch.decode_tiled && PagedDecodeAttentionTiledSupports(heads, kv.num_kv_heads, kv.head_dim)) {
      RETURN_IF_ERROR(LaunchDecodeTiled(q, bt, max_blocks, ctx, num_seqs, heads, splits, partition, scale, kv,
                                        part_out, part_ml, out, stream, launch.pdl));
      return Reduce(part_out, part_ml, splits, num_seqs, heads, kv.head_dim, out, stream, launch.pdl);
    }
  }
  // The query heads sharing a kv head run in one block (each K/V row loaded once for the group): G = the
  // largest of 8, 4, 3, 2 dividing heads / kv_heads, else 1.
  const int group = heads / kv.num_kv_heads;
  const int G = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1;
  auto kernel = G == 8   ? DecodeKernel<T, E, 8>
                : G == 4 ? DecodeKernel<T, E, 4>
                : G == 3 ? DecodeKernel<T, E, 3>
                : G == 2 ? DecodeKernel<T, E, 2>
                         : DecodeKernel<T, E, 1>;
  const dim3 grid(splits, heads / G, num_seqs);
  CUDA_RETURN_IF_ERROR(LaunchKernel(launch.pdl, kernel, grid, dim3(kWarps * 32), 0, stream, q, bt, max_blocks,
                                    ctx, heads, partition, scale, kv, part_out, part_ml, out,
                                    launch.decode_pipeline));
  return Reduce(part_out, part_ml, splits, num_seqs, heads, kv.head_dim, out, stream, launch.pdl);
}

template <typename T>
Status Decode(const T* q, const int32_t* bt, int max_blocks, const int32_t* ctx, int num_seqs, int heads,
              int max_ctx, float scale, const DevicePagedKv<T>& kv, void* ws, T* out, cudaStream_t stream,
              const AttentionLaunchOptions& launch) {
  RETURN_IF_ERROR(CheckShape("PagedDecodeAttention", heads, kv.num_kv_heads, kv.head_dim));
  if (num_seqs <= 0) return OkStatus();
  switch (kv.head_dim) {
    case 64:
      return LaunchDecode<T, 2>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream,
                                launch);
    case 128:
      return LaunchDecode<T, 4>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream,
                                launch);
    default:
      return LaunchDecode<T, 8>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out, stream,
                                launch);
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

size_t DecodeWorkspaceBytes(int num_seqs, int heads, int head_dim, int max_context_len,
                            const AttentionLaunchOptions& launch) {
  const int splits = NumSplits(num_seqs, heads, max_context_len, launch);
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

Status QkvRopeWriteKv(const __nv_bfloat16* qkv, const float* bias, const int32_t* positions,
                      const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                      const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* q, cudaStream_t stream,
                      bool warp_heads, bool pdl) {
  if (kv.head_dim <= 0 || kv.head_dim % 2 != 0 || kv.head_dim > 2048) {
    return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKv: head_dim must be even and <= 2048");
  }
  if (heads <= 0 || kv.num_kv_heads <= 0) {
    return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKv: heads must be positive");
  }
  if (tokens <= 0) return OkStatus();
  if (tokens > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKv: too many tokens");
  if (warp_heads && kv.head_dim % 64 == 0 && kv.head_dim <= 256) {
    const dim3 grid(
        static_cast<unsigned>(tokens),
        static_cast<unsigned>((heads + kv.num_kv_heads + kRopeHeadsPerBlock - 1) / kRopeHeadsPerBlock));
    CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, QkvRopeWriteKvWarpKernel, grid, dim3(32 * kRopeHeadsPerBlock), 0,
                                      stream, qkv, bias, positions, slots, heads, inv_freq, kv, q));
    return OkStatus();
  }
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads + kv.num_kv_heads));
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, QkvRopeWriteKvKernel, grid, dim3(kv.head_dim / 2), 0, stream, qkv, bias,
                                    positions, slots, heads, inv_freq, kv, q));
  return OkStatus();
}

Status PagedDecodeAttention(const float* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<float>& kv, void* workspace, float* out,
                            cudaStream_t stream, const AttentionLaunchOptions& launch) {
  return Decode(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads, max_context_len, scale,
                kv, workspace, out, stream, launch);
}
Status PagedDecodeAttention(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKv<__nv_bfloat16>& kv, void* workspace,
                            __nv_bfloat16* out, cudaStream_t stream, const AttentionLaunchOptions& launch) {
  return Decode(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads, max_context_len, scale,
                kv, workspace, out, stream, launch);
}

Status PrefillAttention(const float* q, const int32_t* cu_seqlens, const int32_t* start_pos, int num_seqs,
                        int64_t total_tokens, const int32_t* block_tables, int max_blocks_per_seq, int heads,
                        float scale, const DevicePagedKv<float>& kv, float* out, cudaStream_t stream,
                        const AttentionLaunchOptions& /*launch: fp32 always runs the warp kernel*/) {
  return Prefill(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables, max_blocks_per_seq, heads,
                 scale, kv, out, stream);
}
Status PrefillAttention(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                        int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                        int max_blocks_per_seq, int heads, float scale,
                        const DevicePagedKv<__nv_bfloat16>& kv, __nv_bfloat16* out, cudaStream_t stream,
                        const AttentionLaunchOptions& launch) {
  if (PrefillTakesTiled(q, kv, out, total_tokens, num_seqs, heads, launch)) {
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
