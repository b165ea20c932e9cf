// cuda_bench's `elementwise` section (cuda_bench.cc has main and the other sections).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "api/kv_cache_dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_bench.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/quant.h"

namespace stoke::cuda {

// The served step's memory-bound elementwise kernels (Llama-3.1-8B shapes) at m = 256 .. 1024 tokens: the
// SwiGLU over the gate|up GEMM's output (SiluMulFused, inter 14336) and the fp8 activation quantiser before
// each FP8 GEMM (QuantizeRowsFp8, k 4096 and 14336), one value per thread access against 8
// (--vector-elementwise). Each timed call reads the next slice of a 512 MiB pool, so no read is served from
// the 50 MB L2. GB/s counts the bytes each call reads and writes once.
void ElementwiseBench(cudaStream_t s) {
  const int64_t H = 4096, F = 14336;
  const int64_t pool_bytes = int64_t{512} << 20;
  void *in_pool, *out_pool, *q, *sc;
  BENCH_CHECK(cudaMalloc(&in_pool, pool_bytes));
  BENCH_CHECK(cudaMalloc(&out_pool, pool_bytes / 2));
  BENCH_CHECK(cudaMalloc(&q, int64_t{1024} * F));
  BENCH_CHECK(cudaMalloc(&sc, 1024 * 4));
  cudaMemset(in_pool, 0x3c, pool_bytes);
  auto* in = static_cast<__nv_bfloat16*>(in_pool);
  auto* out = static_cast<__nv_bfloat16*>(out_pool);
  auto* q8 = static_cast<uint8_t*>(q);
  auto* scf = static_cast<float*>(sc);
  for (const int64_t m : {256, 512, 1024}) {
    // Slices of the pools, 16-byte aligned (every size here is a multiple of 8 values).
    int64_t next = 0;
    auto slice = [&](int64_t values, int64_t pool_values) {
      return (next++ % (pool_values / values)) * values;
    };
    for (const bool vec : {false, true}) {
      const float ms = TimeMs(s, [&] {
        const int64_t i = slice(m * 2 * F, pool_bytes / 2);
        (void)SiluMulFused(in + i, m, F, out + i / 2, s, vec);
      });
      const double bytes = m * 2.0 * F * 2 + m * 1.0 * F * 2;
      std::printf(
          "{\"bench\":\"elementwise\",\"kernel\":\"silu_mul\",\"m\":%lld,\"cols\":%lld,\"vec8\":%s,"
          "\"ms\":%.4f,\"gbps\":%.1f}\n",
          (long long)m, (long long)F, vec ? "true" : "false", ms, bytes / (ms * 1e-3) / 1e9);
    }
    for (const int64_t k : {H, F}) {
      for (const bool vec : {false, true}) {
        const float ms = TimeMs(s, [&] {
          const int64_t i = slice(m * k, pool_bytes / 2);
          (void)QuantizeRowsFp8(in + i, m, k, k, q8, scf, 1.f, s, vec);
        });
        const double bytes = m * 3.0 * k + m * 4.0;
        std::printf(
            "{\"bench\":\"elementwise\",\"kernel\":\"quantize_fp8\",\"m\":%lld,\"cols\":%lld,"
            "\"vec8\":%s,\"ms\":%.4f,\"gbps\":%.1f}\n",
            (long long)m, (long long)k, vec ? "true" : "false", ms, bytes / (ms * 1e-3) / 1e9);
      }
    }
  }
  for (void* p : {in_pool, out_pool, q, sc}) cudaFree(p);
  // The RoPE + fp8 cache write of each layer (QkvRopeWriteKvQuant): 32 query and 8 kv heads of 128, one
  // token per sequence into its own slot; a block per (token, head) against a warp per head. The same buffers
  // every call (at most 13 MB of qkv: L2-resident), as in the step right after the QKV GEMM: the ratio is the
  // figure, not the GB/s.
  const int heads = 32, kvh = 8, hd = 128, bs = 16;
  for (const int64_t m : {256, 512, 1024}) {
    const int64_t width = int64_t{heads + 2 * kvh} * hd, slots_n = m * 4;
    void *qkv, *qo, *k8, *v8, *ks, *vs, *pos, *slot, *inv;
    BENCH_CHECK(cudaMalloc(&qkv, m * width * 2));
    BENCH_CHECK(cudaMalloc(&qo, m * heads * hd * 2));
    BENCH_CHECK(cudaMalloc(&k8, slots_n * kvh * hd));
    BENCH_CHECK(cudaMalloc(&v8, slots_n * kvh * hd));
    BENCH_CHECK(cudaMalloc(&ks, slots_n * kvh * 4));
    BENCH_CHECK(cudaMalloc(&vs, slots_n * kvh * 4));
    BENCH_CHECK(cudaMalloc(&pos, m * 4));
    BENCH_CHECK(cudaMalloc(&slot, m * 4));
    BENCH_CHECK(cudaMalloc(&inv, hd / 2 * 4));
    cudaMemset(qkv, 0x3c, m * width * 2);
    std::vector<int32_t> hp(m), hs(m);
    for (int64_t t = 0; t < m; ++t)
      hp[t] = static_cast<int32_t>(1000 + t), hs[t] = static_cast<int32_t>(t * 4 + 1);
    std::vector<float> hi(hd / 2);
    for (int i = 0; i < hd / 2; ++i) hi[i] = std::pow(500000.f, -2.f * i / hd);
    cudaMemcpy(pos, hp.data(), m * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(slot, hs.data(), m * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(inv, hi.data(), hd / 2 * 4, cudaMemcpyHostToDevice);
    const DevicePagedKvQuant kv{static_cast<uint8_t*>(k8),
                                static_cast<uint8_t*>(v8),
                                static_cast<float*>(ks),
                                static_cast<float*>(vs),
                                KvCacheDtype::kFp8,
                                static_cast<int>(slots_n / bs),
                                bs,
                                kvh,
                                hd};
    for (const bool warp : {false, true}) {
      const float ms = TimeMs(s, [&] {
        (void)QkvRopeWriteKvQuant(static_cast<__nv_bfloat16*>(qkv), nullptr, static_cast<int32_t*>(pos),
                                  static_cast<int32_t*>(slot), m, heads, static_cast<float*>(inv), kv,
                                  static_cast<__nv_bfloat16*>(qo), s, warp);
      });
      const double bytes = m * (width * 2.0 + heads * hd * 2.0 + 2.0 * kvh * hd + 8.0 * kvh);
      std::printf(
          "{\"bench\":\"elementwise\",\"kernel\":\"rope_write_fp8\",\"m\":%lld,\"warp_per_head\":%s,"
          "\"ms\":%.4f,\"gbps\":%.1f}\n",
          (long long)m, warp ? "true" : "false", ms, bytes / (ms * 1e-3) / 1e9);
    }
    for (void* p : {qkv, qo, k8, v8, ks, vs, pos, slot, inv}) cudaFree(p);
  }
}

}  // namespace stoke::cuda
