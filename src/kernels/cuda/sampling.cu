#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling.h"

namespace stoke::cuda {
namespace {

constexpr int kThreads = 1024;
using Scan = cub::BlockScan<float, kThreads>;
using Reduce = cub::BlockReduce<float, kThreads>;

// Order-preserving map of a float to uint32 (larger float -> larger key). Callers skip NaN.
__device__ __forceinline__ uint32_t Key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Sampler::Uniform (sampler.cc), bit for bit.
__device__ __forceinline__ double Uniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(step ^ 0x5851f42d4c957f2dull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

struct ArgPair {
  float v;
  int32_t i;  // -1: none (all NaN so far)
};
__device__ __forceinline__ ArgPair Better(ArgPair a, ArgPair b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  if (a.v != b.v) return a.v > b.v ? a : b;
  return a.i < b.i ? a : b;
}

// The first largest non-NaN value's index (0 when every value is NaN). Better() picks the larger value and,
// between equal values, the lower index, so the order the threads visit the row in does not matter: the body
// reads it as float4 (four independent 16-byte loads in flight per thread, where one scalar load at a time
// left a 128k-entry row latency-bound: ~41 us on the H200) with scalar heads and tails to the alignment.
__device__ int32_t BlockArgmax(const float* __restrict__ x, int vocab) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  ArgPair best{0.f, -1};
  auto visit = [&best](float v, int i) {
    if (!isnan(v)) best = Better(best, ArgPair{v, i});
  };
  const int head = min(vocab, static_cast<int>(((16 - (reinterpret_cast<uintptr_t>(x) & 15)) & 15) / 4));
  const int n4 = (vocab - head) / 4;
  for (int i = threadIdx.x; i < head; i += blockDim.x) visit(x[i], i);
  const float4* x4 = reinterpret_cast<const float4*>(x + head);
#pragma unroll 4
  for (int j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = __ldg(x4 + j);
    const int i = head + 4 * j;
    visit(v.x, i);
    visit(v.y, i + 1);
    visit(v.z, i + 2);
    visit(v.w, i + 3);
  }
  for (int i = head + 4 * n4 + threadIdx.x; i < vocab; i += blockDim.x) visit(x[i], i);
  for (int off = 16; off > 0; off >>= 1) {
    ArgPair o{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
    best = Better(best, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = best.v;
    si[warp] = best.i;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < (blockDim.x >> 5) ? ArgPair{sv[lane], si[lane]} : ArgPair{0.f, -1};
    for (int off = 16; off > 0; off >>= 1) {
      ArgPair o{__shfl_xor_sync(0xffffffffu, best.v, off), __shfl_xor_sync(0xffffffffu, best.i, off)};
      best = Better(best, o);
    }
    if (lane == 0) si[0] = best.i < 0 ? 0 : best.i;
  }
  __syncthreads();
  return si[0];
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int vocab, int64_t ld, int32_t* __restrict__ out) {
  const int32_t r = BlockArgmax(logits + static_cast<int64_t>(blockIdx.x) * ld, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

// The kept set: id i is kept when its key beats a cut (key > cut, or key == cut and i <= tie_last).
struct Cut {
  uint32_t key = 0;  // 0 with tie_last = INT_MAX keeps everything that is not NaN
  int32_t tie_last = 0x7fffffff;
  __device__ bool Keeps(uint32_t k, int i) const { return k > key || (k == key && i <= tie_last); }
};

struct One {
  __device__ float operator()(float) const { return 1.f; }
};
struct Prob {  // unnormalised probability exp((v - max) / T)
  float m, inv_t;
  __device__ float operator()(float v) const { return expf((v - m) * inv_t); }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct SampleShared {
  union {
    Scan::TempStorage scan;
    Reduce::TempStorage reduce;
  } tmp;
  float f;
  int32_t i;
};

// Σ over kept ids of w(i) (w = probability weight, or 1 to count). Strided, coalesced. All threads get it.
template <typename W>
__device__ float KeptSum(const float* x, int vocab, Cut a, Cut b, W w, SampleShared& sh) {
  float s = 0.f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    if (isnan(v)) continue;
    const uint32_t k = Key(v);
    if (a.Keeps(k, i) && b.Keeps(k, i)) s += w(v);
  }
  const float total = Reduce(sh.tmp.reduce).Sum(s);
  __syncthreads();
  if (threadIdx.x == 0) sh.f = total;
  __syncthreads();
  const float r = sh.f;
  __syncthreads();
  return r;
}

// Among ids kept by `a`, with key == `key`, in id order: the last id whose inclusive running weight stays
// below `need` plus one more (i.e. the first id where the running weight reaches `need`). Chunked per thread
// so the running sum follows id order. Returns INT_MAX when the weight never reaches `need` (keep all ties).
template <typename W>
__device__ int32_t TieCut(const float* x, int vocab, Cut a, uint32_t key, float need, W w, SampleShared& sh) {
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
  float mine = 0.f;
  for (int i = lo; i < hi; ++i) {
    const float v = x[i];
    if (!isnan(v) && Key(v) == key && a.Keeps(key, i)) mine += w(v);
  }
  float before;
  Scan(sh.tmp.scan).ExclusiveSum(mine, before);
  if (threadIdx.x == 0) sh.i = 0x7fffffff;
  __syncthreads();
  if (before < need && before + mine >= need) {
    float run = before;
    for (int i = lo; i < hi; ++i) {
      const float v = x[i];
      if (isnan(v) || Key(v) != key || !a.Keeps(key, i)) continue;
      run += w(v);
      if (run >= need) {
        atomicMin(&sh.i, i);
        break;
      }
    }
  }
  __syncthreads();
  const int32_t r = sh.i;
  __syncthreads();
  return r;
}

// The largest key K with weight(kept by `a`, key >= K) >= need, by bisection on the key bits.
template <typename W>
__device__ uint32_t Threshold(const float* x, int vocab, Cut a, float need, W w, SampleShared& sh) {
  uint32_t prefix = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = prefix | (1u << bit);
    const Cut ge{cand - 1u, -1};  // key > cand - 1, i.e. key >= cand
    if (KeptSum(x, vocab, a, ge, w, sh) >= need) prefix = cand;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, int64_t ld,
                 const RowSampling* __restrict__ params, int32_t* __restrict__ out) {
  __shared__ SampleShared sh;
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * ld;
  const RowSampling p = params[blockIdx.x];
  if (p.temperature <= 0.f || p.top_k == 1 || p.top_p <= 0.f) {
    const int32_t r = BlockArgmax(x, vocab);
    if (threadIdx.x == 0) out[blockIdx.x] = r;
    return;
  }
  const Cut all;
  const One one;
  // Max over non-NaN logits.
  float m = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    if (!isnan(x[i])) m = fmaxf(m, x[i]);
  }
  m = Reduce(sh.tmp.reduce).Reduce(m, MaxOp());
  if (threadIdx.x == 0) sh.f = m;
  __syncthreads();
  m = sh.f;
  __syncthreads();
  const float inv_t = 1.f / p.temperature;
  const Prob prob{m, inv_t};
  const float valid = KeptSum(x, vocab, all, all, one, sh);
  if (valid == 0.f) {  // every logit NaN
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  // Top-k: the k-th best key, then the lowest-id ties that complete k.
  Cut ck;
  if (p.top_k > 0 && static_cast<float>(p.top_k) < valid) {
    ck.key = Threshold(x, vocab, all, static_cast<float>(p.top_k), one, sh);
    const float above = KeptSum(x, vocab, all, Cut{ck.key, -1}, one, sh);
    ck.tie_last = TieCut(x, vocab, all, ck.key, static_cast<float>(p.top_k) - above, one, sh);
  }
  // Top-p over the top-k survivors: the smallest best-first prefix with mass >= top_p * Z.
  Cut cp;
  if (p.top_p < 1.f) {
    const float z = KeptSum(x, vocab, ck, all, prob, sh);
    const float need = p.top_p * z;
    cp.key = Threshold(x, vocab, ck, need, prob, sh);
    const float above = KeptSum(x, vocab, ck, Cut{cp.key, -1}, prob, sh);
    cp.tie_last = TieCut(x, vocab, ck, cp.key, need - above, prob, sh);
  }
  // Draw: u * Z_kept, walked in id order.
  const float z = KeptSum(x, vocab, ck, cp, prob, sh);
  const float target = static_cast<float>(Uniform(p.seed, p.step)) * z;
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
  float mine = 0.f;
  int32_t last_kept = -1;
  for (int i = lo; i < hi; ++i) {
    const float v = x[i];
    if (isnan(v) || !ck.Keeps(Key(v), i) || !cp.Keeps(Key(v), i)) continue;
    mine += prob(v);
    last_kept = i;
  }
  float before;
  Scan(sh.tmp.scan).ExclusiveSum(mine, before);
  constexpr int32_t kNone = -0x7fffffff - 1;  // below every encoded pick, so atomicMax replaces it
  if (threadIdx.x == 0) sh.i = kNone;
  __syncthreads();
  if (target >= before && target < before + mine) {
    float run = before;
    int32_t pick = last_kept;
    for (int i = lo; i < hi; ++i) {
      const float v = x[i];
      if (isnan(v) || !ck.Keeps(Key(v), i) || !cp.Keeps(Key(v), i)) continue;
      run += prob(v);
      if (run > target) {
        pick = i;
        break;
      }
    }
    atomicMax(&sh.i, -2 - pick);  // the lowest pick wins (encoded so atomicMax finds it)
  }
  __syncthreads();
  int32_t r = sh.i == kNone ? -1 : -2 - sh.i;
  __syncthreads();
  if (r < 0) {  // rounding put the target past the last kept id: take the last kept id
    if (threadIdx.x == 0) sh.i = -1;
    __syncthreads();
    if (last_kept >= 0) atomicMax(&sh.i, last_kept);
    __syncthreads();
    r = sh.i < 0 ? 0 : sh.i;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

}  // namespace

Status ArgmaxRows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t stream, int64_t ld) {
  if (rows <= 0) return OkStatus();
  if (vocab <= 0) return Status(StatusCode::kInvalidArgument, "ArgmaxRows: vocab must be positive");
  if (ld == 0) ld = vocab;
  if (ld < vocab) return Status(StatusCode::kInvalidArgument, "ArgmaxRows: row stride below vocab");
  ArgmaxKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, ld, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

Status SampleRows(const float* logits, int rows, int vocab, const RowSampling* params, int32_t* out,
                  cudaStream_t stream, int64_t ld) {
  if (rows <= 0) return OkStatus();
  if (vocab <= 0) return Status(StatusCode::kInvalidArgument, "SampleRows: vocab must be positive");
  if (ld == 0) ld = vocab;
  if (ld < vocab) return Status(StatusCode::kInvalidArgument, "SampleRows: row stride below vocab");
  SampleKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, ld, params, out);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return OkStatus();
}

}  // namespace stoke::cuda
