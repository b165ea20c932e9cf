// Attention over an 8-bit paged KV cache (int8 or fp8 E4M3, one fp32 scale per (slot, kv head)): the cache
// write with quantisation, and the decode and prefill kernels dequantising K/V in registers as they read
// them. The arithmetic after dequantisation is attention.cu's (same WarpState, split merge and split count).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {
namespace {

template <bool kFp8>
__device__ __forceinline__ float QuantMax() {
  return kFp8 ? 448.f : 127.f;
}

// x already multiplied by QuantMax() / amax: the stored byte, as cpu::QuantizeKvRow rounds it.
template <bool kFp8>
__device__ __forceinline__ uint8_t QuantizeScaled(float x) {
  if constexpr (kFp8) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
  } else {
    const int r = max(-127, min(127, __float2int_rn(x)));
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
}

template <bool kFp8>
__device__ __forceinline__ float DequantizeByte(uint8_t b) {
  if constexpr (kFp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    return __half2float(__half(h));
  } else {
    return static_cast<float>(static_cast<int8_t>(b));
  }
}

// E consecutive bytes at p (p aligned to E bytes: lane * E into a row of 32 * E bytes).
template <int E>
__device__ __forceinline__ void LoadBytes(const uint8_t* __restrict__ p, uint8_t (&b)[E]) {
  if constexpr (E == 2) {
    const uint16_t w = *reinterpret_cast<const uint16_t*>(p);
    b[0] = w & 0xff;
    b[1] = w >> 8;
  } else if constexpr (E == 4) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) b[e] = (w >> (8 * e)) & 0xff;
  } else {
    static_assert(E == 8);
    const uint2 w = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      b[e] = (w.x >> (8 * e)) & 0xff;
      b[e + 4] = (w.y >> (8 * e)) & 0xff;
    }
  }
}

// ---- cache write ------------------------------------------------------------------------------------------

// grid = (tokens, heads + kv_heads), block = head_dim / 2 rounded up to a warp: thread i < head_dim / 2
// rotates pair (i, i + half) as QkvRopeWriteKvKernel does; for a kv head the block then reduces |K| and |V|
// to their row maxima and stores the quantised bytes and the two scales.
template <bool kFp8>
__global__ void QkvRopeWriteKvQuantKernel(const __nv_bfloat16* __restrict__ qkv,
                                          const float* __restrict__ bias,
                                          const int32_t* __restrict__ positions,
                                          const int32_t* __restrict__ slots, int heads,
                                          const float* __restrict__ inv_freq, DevicePagedKvQuant kv,
                                          __nv_bfloat16* __restrict__ q_out) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const int hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads;
  const bool active = i < half;
  const int64_t width = static_cast<int64_t>(heads + 2 * kvh) * hd;
  const __nv_bfloat16* row = qkv + t * width;
  const int32_t slot = slots[t];
  auto load = [&](int64_t c) { return QkvColumn(row, bias, c); };
  const int64_t col = static_cast<int64_t>(h) * hd;  // q heads, then k heads
  __nv_bfloat16 r0 = __float2bfloat16_rn(0.f), r1 = r0;
  if (active) RotatePair(row, bias, col, i, half, static_cast<float>(positions[t]) * inv_freq[i], r0, r1);
  if (h < heads) {  // the whole block: a query head
    if (active) {
      __nv_bfloat16* a = q_out + (t * heads + h) * hd;
      a[i] = r0;
      a[i + half] = r1;
    }
    return;
  }
  if (slot < 0) return;  // the whole block: a padding token
  const int kh = h - heads;
  const int64_t vcol = static_cast<int64_t>(heads + kvh + kh) * hd;
  const float k0 = __bfloat162float(r0), k1 = __bfloat162float(r1);
  float v0 = 0.f, v1 = 0.f;
  if (active) {
    v0 = __bfloat162float(__float2bfloat16_rn(load(vcol + i)));
    v1 = __bfloat162float(__float2bfloat16_rn(load(vcol + i + half)));
  }
  const float kmax = BlockMax(fmaxf(fabsf(k0), fabsf(k1)), scratch);
  const float vmax = BlockMax(fmaxf(fabsf(v0), fabsf(v1)), scratch);
  const float qmax = QuantMax<kFp8>();
  const bool kok = kmax > 0.f && isfinite(kmax), vok = vmax > 0.f && isfinite(vmax);
  const float kinv = kok ? qmax / kmax : 0.f, vinv = vok ? qmax / vmax : 0.f;
  const int64_t r = static_cast<int64_t>(slot) * kvh + kh;  // (slot, kv head)
  if (active) {
    kv.k[r * hd + i] = QuantizeScaled<kFp8>(k0 * kinv);
    kv.k[r * hd + i + half] = QuantizeScaled<kFp8>(k1 * kinv);
    kv.v[r * hd + i] = QuantizeScaled<kFp8>(v0 * vinv);
    kv.v[r * hd + i + half] = QuantizeScaled<kFp8>(v1 * vinv);
  }
  if (i == 0) {
    kv.k_scale[r] = kok ? kmax / qmax : 0.f;
    kv.v_scale[r] = vok ? vmax / qmax : 0.f;
  }
}

// The same with one warp per head instead of one block (warp_heads, --vector-elementwise): 4 heads per block,
// lane l rotating pairs l, l + 32, ... (head_dim % 64 == 0, <= 256: 1..4 pairs per lane), a kv head's |K| and
// |V| maxima by warp shuffles, no barrier. Per value the same arithmetic; a max does not depend on its order:
// the same q, bytes and scales.

template <bool kFp8>
__global__ void QkvRopeWriteKvQuantWarpKernel(const __nv_bfloat16* __restrict__ qkv,
                                              const float* __restrict__ bias,
                                              const int32_t* __restrict__ positions,
                                              const int32_t* __restrict__ slots, int heads,
                                              const float* __restrict__ inv_freq, DevicePagedKvQuant kv,
                                              __nv_bfloat16* __restrict__ q_out) {
  PdlLaunchDependents();
  PdlWait();  // launched with PDL (--pdl): the kernels before it have finished and their writes are visible
  constexpr int kMaxPairs = 4;
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.y * kRopeHeadsPerBlock + (threadIdx.x >> 5);
  const int hd = kv.head_dim, half = hd / 2, kvh = kv.num_kv_heads, pairs = half / 32;
  if (h >= heads + kvh) return;
  const int64_t width = static_cast<int64_t>(heads + 2 * kvh) * hd;
  const __nv_bfloat16* row = qkv + t * width;
  auto load = [&](int64_t c) { return QkvColumn(row, bias, c); };
  const int64_t col = static_cast<int64_t>(h) * hd;  // q heads, then k heads
  const float pos = static_cast<float>(positions[t]);
  __nv_bfloat16 r0[kMaxPairs], r1[kMaxPairs];
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    if (p < pairs) {
      const int i = lane + 32 * p;
      RotatePair(row, bias, col, i, half, pos * inv_freq[i], r0[p], r1[p]);
    }
  }
  if (h < heads) {  // the whole warp: a query head
    __nv_bfloat16* a = q_out + (t * heads + h) * hd;
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p) {
      if (p < pairs) {
        a[lane + 32 * p] = r0[p];
        a[lane + 32 * p + half] = r1[p];
      }
    }
    return;
  }
  const int32_t slot = slots[t];
  if (slot < 0) return;  // the whole warp: a padding token
  const int kh = h - heads;
  const int64_t vcol = static_cast<int64_t>(heads + kvh + kh) * hd;
  float k0[kMaxPairs], k1[kMaxPairs], v0[kMaxPairs], v1[kMaxPairs];
  float kmax = 0.f, vmax = 0.f;
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    if (p < pairs) {
      const int i = lane + 32 * p;
      k0[p] = __bfloat162float(r0[p]);
      k1[p] = __bfloat162float(r1[p]);
      v0[p] = __bfloat162float(__float2bfloat16_rn(load(vcol + i)));
      v1[p] = __bfloat162float(__float2bfloat16_rn(load(vcol + i + half)));
      kmax = fmaxf(kmax, fmaxf(fabsf(k0[p]), fabsf(k1[p])));
      vmax = fmaxf(vmax, fmaxf(fabsf(v0[p]), fabsf(v1[p])));
    }
  }
  kmax = WarpMax(kmax);
  vmax = WarpMax(vmax);
  const float qmax = QuantMax<kFp8>();
  const bool kok = kmax > 0.f && isfinite(kmax), vok = vmax > 0.f && isfinite(vmax);
  const float kinv = kok ? qmax / kmax : 0.f, vinv = vok ? qmax / vmax : 0.f;
  const int64_t r = static_cast<int64_t>(slot) * kvh + kh;  // (slot, kv head)
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    if (p < pairs) {
      const int i = lane + 32 * p;
      kv.k[r * hd + i] = QuantizeScaled<kFp8>(k0[p] * kinv);
      kv.k[r * hd + i + half] = QuantizeScaled<kFp8>(k1[p] * kinv);
      kv.v[r * hd + i] = QuantizeScaled<kFp8>(v0[p] * vinv);
      kv.v[r * hd + i + half] = QuantizeScaled<kFp8>(v1[p] * vinv);
    }
  }
  if (lane == 0) {
    kv.k_scale[r] = kok ? kmax / qmax : 0.f;
    kv.v_scale[r] = vok ? vmax / qmax : 0.f;
  }
}

// ---- attention --------------------------------------------------------------------------------------------

// WarpAttend (attention.cu) over the 8-bit cache: the lane's E bytes of K and V and the row's two scales are
// fetched (one position ahead when pipelined), dequantised to fp32, and folded in with the same arithmetic.
template <int E, int G, bool kFp8>
__device__ __forceinline__ void WarpAttendQuant(const float (&q)[G][E], const DevicePagedKvQuant& kv,
                                                const int32_t* __restrict__ table, int kv_head, int begin,
                                                int end, int step, bool pipeline, WarpState<E> (&st)[G]) {
  const int lane = threadIdx.x & 31;
  const int hd = E * 32, bs = kv.block_size;
  uint8_t kn[E], vn[E];
  float ksn = 0.f, vsn = 0.f;
  auto fetch = [&](int p) {
    const int64_t r = PagedSlot(table, p, bs) * kv.num_kv_heads + kv_head;
    LoadBytes<E>(kv.k + r * hd + lane * E, kn);
    LoadBytes<E>(kv.v + r * hd + lane * E, vn);
    ksn = kv.k_scale[r];
    vsn = kv.v_scale[r];
  };
  if (pipeline && begin < end) fetch(begin);
  for (int p = begin; p < end; p += step) {
    if (!pipeline) fetch(p);
    float kr[E], vr[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      kr[e] = DequantizeByte<kFp8>(kn[e]) * ksn;
      vr[e] = DequantizeByte<kFp8>(vn[e]) * vsn;
    }
    if (pipeline && p + step < end) fetch(p + step);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) s += q[g][e] * kr[e];
      s = WarpSum(s);
      const float m_new = fmaxf(st[g].m, s);
      const float corr = expf(st[g].m - m_new);
      const float p_s = expf(s - m_new);
      st[g].l = st[g].l * corr + p_s;
#pragma unroll
      for (int e = 0; e < E; ++e) st[g].acc[e] = st[g].acc[e] * corr + p_s * vr[e];
      st[g].m = m_new;
    }
  }
}

// DecodeKernel (attention.cu) over the 8-bit cache: grid = (num_splits, heads / G, num_seqs).
template <int E, int G, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeQuantKernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ block_tables,
                      int max_blocks, const int32_t* __restrict__ context_lens, int heads, int partition,
                      float scale, DevicePagedKvQuant kv, float* __restrict__ part_out,
                      float* __restrict__ part_ml, __nv_bfloat16* __restrict__ out, bool pipeline) {
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
    for (int e = 0; e < E; ++e) qr[g][e] = __bfloat162float(q[qo + e]) * scale;
  }
  WarpState<E> st[G];
  WarpAttendQuant<E, G, kFp8>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head,
                              begin + warp, end, kWarps, pipeline, st);
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
      if (sm_l[w * G + g] == 0.f) continue;
      const float f = expf(sm_m[w * G + g] - m);
      l += sm_l[w * G + g] * f;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] += sm_acc[(w * G + g) * kHd + lane * E + e] * f;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t hrow = static_cast<int64_t>(seq) * heads + head0 + g;
    if (num_splits == 1) {
#pragma unroll
      for (int e = 0; e < E; ++e) out[hrow * kHd + lane * E + e] = __float2bfloat16_rn(acc[e] * inv);
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

// PrefillKernel (attention.cu) over the 8-bit cache: one warp per (token, head).
template <int E, bool kFp8>
__global__ void __launch_bounds__(kWarps * 32)
    PrefillQuantKernel(const __nv_bfloat16* __restrict__ q, const int32_t* __restrict__ cu_seqlens,
                       const int32_t* __restrict__ start_pos, int num_seqs, int64_t total_tokens,
                       const int32_t* __restrict__ block_tables, int max_blocks, int heads, float scale,
                       DevicePagedKvQuant kv, __nv_bfloat16* __restrict__ out) {
  constexpr int kHd = E * 32;
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (item >= total_tokens * heads) return;
  const int64_t t = item / heads;
  const int head = static_cast<int>(item - t * heads);
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
  for (int e = 0; e < E; ++e) qr[0][e] = __bfloat162float(q[qo + e]) * scale;
  WarpState<E> st[1];
  WarpAttendQuant<E, 1, kFp8>(qr, kv, block_tables + static_cast<int64_t>(seq) * max_blocks, kv_head, 0,
                              pos + 1, 1, /*pipeline=*/true, st);
  const float inv = st[0].l > 0.f ? 1.f / st[0].l : 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) out[qo + e] = __float2bfloat16_rn(st[0].acc[e] * inv);
}

Status CheckQuantKv(const char* what, const DevicePagedKvQuant& kv) {
  if (kv.dtype != KvCacheDtype::kInt8 && kv.dtype != KvCacheDtype::kFp8) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": the 8-bit cache must be int8 or fp8");
  }
  if (kv.k == nullptr || kv.v == nullptr || kv.k_scale == nullptr || kv.v_scale == nullptr) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": cache or scale pointer is null");
  }
  return OkStatus();
}

template <int E, bool kFp8>
Status LaunchDecodeQuant(const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx,
                         int num_seqs, int heads, int max_ctx, float scale, const DevicePagedKvQuant& kv,
                         void* ws, __nv_bfloat16* out, cudaStream_t stream,
                         const AttentionLaunchOptions& launch) {
  const int splits = NumSplits(num_seqs, heads, max_ctx, launch);
  const int partition = max_ctx <= 0 ? 1 : (max_ctx + splits - 1) / splits;
  float* part_out = static_cast<float*>(ws);
  float* part_ml = part_out + static_cast<int64_t>(num_seqs) * heads * splits * kv.head_dim;
  if (splits > 1 && ws == nullptr) {
    return Status(StatusCode::kInvalidArgument, "PagedDecodeAttention: long contexts need a workspace");
  }
  if (launch.decode_tiled && PagedDecodeAttentionTiledSupports(heads, kv.num_kv_heads, kv.head_dim)) {
    RETURN_IF_ERROR(launch.decode_tiled_fragments
                        ? LaunchDecodeTiledFragments(q, bt, max_blocks, ctx, num_seqs, heads, splits,
                                                     partition, scale, kv, part_out, part_ml, out, stream,
                                                     launch.decode_stages, launch.pdl)
                        : LaunchDecodeTiled(q, bt, max_blocks, ctx, num_seqs, heads, splits, partition, scale,
                                            kv, part_out, part_ml, out, stream, launch.pdl));
    return Reduce(part_out, part_ml, splits, num_seqs, heads, kv.head_dim, out, stream, launch.pdl);
  }
  const int group = heads / kv.num_kv_heads;
  const int G = group % 8 == 0 ? 8 : group % 4 == 0 ? 4 : group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1;
  auto kernel = G == 8   ? DecodeQuantKernel<E, 8, kFp8>
                : G == 4 ? DecodeQuantKernel<E, 4, kFp8>
                : G == 3 ? DecodeQuantKernel<E, 3, kFp8>
                : G == 2 ? DecodeQuantKernel<E, 2, kFp8>
                         : DecodeQuantKernel<E, 1, kFp8>;
  const dim3 grid(splits, heads / G, num_seqs);
  CUDA_RETURN_IF_ERROR(LaunchKernel(launch.pdl, kernel, grid, dim3(kWarps * 32), 0, stream, q, bt, max_blocks,
                                    ctx, heads, partition, scale, kv, part_out, part_ml, out,
                                    launch.decode_pipeline));
  return Reduce(part_out, part_ml, splits, num_seqs, heads, kv.head_dim, out, stream, launch.pdl);
}

template <bool kFp8>
Status DecodeQuant(const __nv_bfloat16* q, const int32_t* bt, int max_blocks, const int32_t* ctx,
                   int num_seqs, int heads, int max_ctx, float scale, const DevicePagedKvQuant& kv, void* ws,
                   __nv_bfloat16* out, cudaStream_t stream, const AttentionLaunchOptions& launch) {
  switch (kv.head_dim) {
    case 64:
      return LaunchDecodeQuant<2, kFp8>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out,
                                        stream, launch);
    case 128:
      return LaunchDecodeQuant<4, kFp8>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out,
                                        stream, launch);
    default:
      return LaunchDecodeQuant<8, kFp8>(q, bt, max_blocks, ctx, num_seqs, heads, max_ctx, scale, kv, ws, out,
                                        stream, launch);
  }
}

template <bool kFp8>
void LaunchPrefillQuant(unsigned grid, const __nv_bfloat16* q, const int32_t* cu, const int32_t* sp,
                        int num_seqs, int64_t total, const int32_t* bt, int max_blocks, int heads,
                        float scale, const DevicePagedKvQuant& kv, __nv_bfloat16* out, cudaStream_t stream) {
  switch (kv.head_dim) {
    case 64:
      PrefillQuantKernel<2, kFp8><<<grid, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt,
                                                                    max_blocks, heads, scale, kv, out);
      break;
    case 128:
      PrefillQuantKernel<4, kFp8><<<grid, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt,
                                                                    max_blocks, heads, scale, kv, out);
      break;
    default:
      PrefillQuantKernel<8, kFp8><<<grid, kWarps * 32, 0, stream>>>(q, cu, sp, num_seqs, total, bt,
                                                                    max_blocks, heads, scale, kv, out);
  }
}

}  // namespace

Status QkvRopeWriteKvQuant(const __nv_bfloat16* qkv, const float* bias, const int32_t* positions,
                           const int32_t* slots, int64_t tokens, int heads, const float* inv_freq,
                           const DevicePagedKvQuant& kv, __nv_bfloat16* q, cudaStream_t stream,
                           bool warp_heads, bool pdl) {
  RETURN_IF_ERROR(CheckQuantKv("QkvRopeWriteKvQuant", kv));
  if (kv.head_dim <= 0 || kv.head_dim % 2 != 0 || kv.head_dim > 512) {
    return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKvQuant: head_dim must be even and <= 512");
  }
  if (heads <= 0 || kv.num_kv_heads <= 0) {
    return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKvQuant: heads must be positive");
  }
  if (tokens <= 0) return OkStatus();
  if (tokens > 0x7fffffff)
    return Status(StatusCode::kInvalidArgument, "QkvRopeWriteKvQuant: too many tokens");
  if (warp_heads && kv.head_dim % 64 == 0 && kv.head_dim <= 256) {
    const dim3 grid(
        static_cast<unsigned>(tokens),
        static_cast<unsigned>((heads + kv.num_kv_heads + kRopeHeadsPerBlock - 1) / kRopeHeadsPerBlock));
    const auto kernel =
        kv.dtype == KvCacheDtype::kFp8 ? QkvRopeWriteKvQuantWarpKernel<true> : QkvRopeWriteKvQuantWarpKernel<false>;
    CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, kernel, grid, dim3(32 * kRopeHeadsPerBlock), 0, stream, qkv, bias,
                                      positions, slots, heads, inv_freq, kv, q));
    return OkStatus();
  }
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads + kv.num_kv_heads));
  const int threads = (kv.head_dim / 2 + 31) / 32 * 32;  // whole warps for the block reductions
  const auto kernel =
      kv.dtype == KvCacheDtype::kFp8 ? QkvRopeWriteKvQuantKernel<true> : QkvRopeWriteKvQuantKernel<false>;
  CUDA_RETURN_IF_ERROR(LaunchKernel(pdl, kernel, grid, dim3(threads), 0, stream, qkv, bias, positions, slots,
                                    heads, inv_freq, kv, q));
  return OkStatus();
}

Status PagedDecodeAttention(const __nv_bfloat16* q, const int32_t* block_tables, int max_blocks_per_seq,
                            const int32_t* context_lens, int num_seqs, int heads, int max_context_len,
                            float scale, const DevicePagedKvQuant& kv, void* workspace, __nv_bfloat16* out,
                            cudaStream_t stream, const AttentionLaunchOptions& launch) {
  RETURN_IF_ERROR(CheckShape("PagedDecodeAttention", heads, kv.num_kv_heads, kv.head_dim));
  RETURN_IF_ERROR(CheckQuantKv("PagedDecodeAttention", kv));
  if (num_seqs <= 0) return OkStatus();
  if (kv.dtype == KvCacheDtype::kFp8) {
    return DecodeQuant<true>(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads,
                             max_context_len, scale, kv, workspace, out, stream, launch);
  }
  return DecodeQuant<false>(q, block_tables, max_blocks_per_seq, context_lens, num_seqs, heads,
                            max_context_len, scale, kv, workspace, out, stream, launch);
}

Status PrefillAttention(const __nv_bfloat16* q, const int32_t* cu_seqlens, const int32_t* start_pos,
                        int num_seqs, int64_t total_tokens, const int32_t* block_tables,
                        int max_blocks_per_seq, int heads, float scale, const DevicePagedKvQuant& kv,
                        __nv_bfloat16* out, cudaStream_t stream, const AttentionLaunchOptions& launch) {
  RETURN_IF_ERROR(CheckShape("PrefillAttention", heads, kv.num_kv_heads, kv.head_dim));
  RETURN_IF_ERROR(CheckQuantKv("PrefillAttention", kv));
  if (num_seqs <= 0 || total_tokens <= 0) return OkStatus();
  if (PrefillTakesTiled(q, kv, out, total_tokens, num_seqs, heads, launch)) {
    return PrefillAttentionTiled(q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                                 max_blocks_per_seq, heads, scale, kv, out, stream);
  }
  const int64_t blocks = (total_tokens * heads + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return Status(StatusCode::kInvalidArgument, "PrefillAttention: too many tokens");
  const unsigned g = static_cast<unsigned>(blocks);
  if (kv.dtype == KvCacheDtype::kFp8) {
    LaunchPrefillQuant<true>(g, q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                             max_blocks_per_seq, heads, scale, kv, out, stream);
  } else {
    LaunchPrefillQuant<false>(g, q, cu_seqlens, start_pos, num_seqs, total_tokens, block_tables,
                              max_blocks_per_seq, heads, scale, kv, out, stream);
  }
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
