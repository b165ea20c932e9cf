// Microbenchmarks of the CUDA path, one JSON object per line on stdout (progress on stderr):
//   d2d_copy      cudaMemcpy device->device, GB/s counting bytes read + written
//   h2d           pinned vs pageable host->device, GB/s
//   gemm          bf16 GEMM through BlasLtGemm (tuned), TFLOP/s, at 8192^3 and Llama-3.1-8B shapes
//   gemm_fp8      the served step's projections at m = 256..2048: bf16 GEMM vs activation quantise + FP8 GEMM
//   elementwise   the served step's SwiGLU and fp8 activation quantiser at m = 256..1024 tokens, one value vs
//                 8 values per thread access, and the RoPE + fp8 cache write, a block vs a warp per head
//                 (--vector-elementwise), GB/s of bytes read + written
//   gemv          decode projections at batch 1 / 8: bf16 GEMV vs cuBLASLt, GB/s of weights read
//   gemv8         the 1-byte GEMVs (fp8 E4M3, GGUF Q8_0) at batch 1, every warps-per-row choice, GB/s of
//                 weight + scale bytes read; fp8 at 1-8 rows vs cuBLASLt's FP8 GEMM (gemv8_rows)
//   gemvk         the GGUF K-quant GEMVs (Q4_K, Q6_K) at batch 1: auto, and fp32 and int8 activations with
//                 each rows-per-warp choice, GB/s of super-block bytes read
//   decode_attn   paged decode attention, warp vs tensor-core kernel, GB/s of KV read
//   prefill_attn  causal prefill attention on the paged cache, tensor-core vs warp kernel, TFLOP/s (median)
//   encoder_attn  the encoder's bidirectional attention (BERT-base / -large shapes), tensor-core kernel with
//                 16 vs 32 query rows per warp, TFLOP/s (median)
// Usage: cuda_bench [--quick] [--only SECTION] [--gemm-cache FILE]   (--quick: fewer iterations, for a smoke
// run; SECTION: copies, gemm, gemm_fp8, elementwise, gemv, gemv8, gemvk, decode_attn, prefill_attn or
// encoder_attn;
// --gemm-cache: the cuBLASLt algorithm cache reused across runs, as stoke serve --gemm-cache)
#include "kernels/cuda/cuda_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant.h"

namespace stoke::cuda {
namespace {

void CopyBench(cudaStream_t s) {
  for (size_t mib : {256, 2048}) {
    const size_t bytes = mib << 20;
    void *a, *b;
    BENCH_CHECK(cudaMalloc(&a, bytes));
    BENCH_CHECK(cudaMalloc(&b, bytes));
    cudaMemset(a, 1, bytes);
    const float ms = TimeMs(s, [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s); });
    std::printf("{\"bench\":\"d2d_copy\",\"bytes\":%zu,\"ms\":%.4f,\"gbps_rw\":%.1f}\n", bytes, ms,
                2.0 * bytes / (ms * 1e-3) / 1e9);
    cudaFree(a);
    cudaFree(b);
  }
  const size_t bytes = 256u << 20;
  void* d;
  BENCH_CHECK(cudaMalloc(&d, bytes));
  void* pinned;
  BENCH_CHECK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  std::memset(pinned, 1, bytes);
  std::vector<char> pageable(bytes, 1);
  const float ms_p = TimeMs(
      s, [&] { cudaMemcpyAsync(d, pinned, bytes, cudaMemcpyHostToDevice, s); }, 10);
  const float ms_q = TimeMs(
      s, [&] { cudaMemcpyAsync(d, pageable.data(), bytes, cudaMemcpyHostToDevice, s); }, 10);
  std::printf("{\"bench\":\"h2d\",\"memory\":\"pinned\",\"bytes\":%zu,\"ms\":%.4f,\"gbps\":%.1f}\n", bytes,
              ms_p, bytes / (ms_p * 1e-3) / 1e9);
  std::printf("{\"bench\":\"h2d\",\"memory\":\"pageable\",\"bytes\":%zu,\"ms\":%.4f,\"gbps\":%.1f}\n", bytes,
              ms_q, bytes / (ms_q * 1e-3) / 1e9);
  cudaFreeHost(pinned);
  cudaFree(d);
}

void GemmBench(cudaStream_t s, const std::string& gemm_cache) {
  GemmOptions opt;
  opt.cache_path = gemm_cache;  // reused across runs
  auto gemm = BlasLtGemm::Create(opt);
  if (!gemm.ok()) {
    std::fprintf(stderr, "gemm: %s\n", gemm.status().ToString().c_str());
    return;
  }
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  // Llama-3.1-8B: hidden 4096, fused qkv 6144 (32 + 2*8 heads of 128), gate|up 2*14336, vocab 128256.
  const Shape shapes[] = {
      {"square_8192", 8192, 8192, 8192},      {"decode_qkv_b1", 1, 6144, 4096},
      {"decode_o_b1", 1, 4096, 4096},         {"decode_gateup_b1", 1, 28672, 4096},
      {"decode_down_b1", 1, 4096, 14336},     {"decode_gateup_b64", 64, 28672, 4096},
      {"prefill_qkv_2k", 2048, 6144, 4096},   {"prefill_gateup_2k", 2048, 28672, 4096},
      {"prefill_down_2k", 2048, 4096, 14336}, {"lm_head_b64", 64, 128256, 4096},
  };
  for (const Shape& sh : shapes) {
    void *x, *w, *y;
    BENCH_CHECK(cudaMalloc(&x, sh.m * sh.k * 2));
    BENCH_CHECK(cudaMalloc(&w, sh.n * sh.k * 2));
    BENCH_CHECK(cudaMalloc(&y, sh.m * sh.n * 2));
    cudaMemset(x, 0x3c, sh.m * sh.k * 2);  // small finite bf16 values
    cudaMemset(w, 0x3c, sh.n * sh.k * 2);
    auto* xb = static_cast<__nv_bfloat16*>(x);
    auto* wb = static_cast<__nv_bfloat16*>(w);
    Status st = (*gemm)->Tune(xb, wb, y, DType::kBF16, sh.m, sh.n, sh.k, s);
    if (!st.ok()) {
      std::fprintf(stderr, "gemm %s: %s\n", sh.name, st.ToString().c_str());
    } else {
      const float ms = TimeMs(s, [&] { (void)(*gemm)->Run(xb, wb, y, DType::kBF16, sh.m, sh.n, sh.k, s); });
      const double flops = 2.0 * sh.m * sh.n * sh.k;
      const double bytes = 2.0 * (sh.m * sh.k + sh.n * sh.k + sh.m * sh.n);
      std::printf(
          "{\"bench\":\"gemm\",\"shape\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"ms\":%.4f,"
          "\"tflops\":%.1f,\"gbps\":%.1f}\n",
          sh.name, (long long)sh.m, (long long)sh.n, (long long)sh.k, ms, flops / (ms * 1e-3) / 1e12,
          bytes / (ms * 1e-3) / 1e9);
    }
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
  }
  std::fprintf(stderr, "gemm cache: %s (%s)\n", (*gemm)->cache_key().c_str(), (*gemm)->load_status().c_str());
  if (Status st = (*gemm)->Save(); !st.ok()) std::fprintf(stderr, "gemm cache: %s\n", st.ToString().c_str());
}

// The served step's projections (Llama-3.1-8B shapes) at m = 256 .. 2048 tokens: the bf16 GEMM against the
// fp8 path of --quantization fp8 (QuantizeRowsFp8 of the activations, then the FP8 GEMM with per-token x
// per-channel scales), each part timed alone. TFLOP/s of the GEMM alone and of quantise + GEMM.
void GemmFp8Bench(cudaStream_t s, const std::string& gemm_cache) {
  GemmOptions opt;
  opt.cache_path = gemm_cache;
  auto gemm = BlasLtGemm::Create(opt);
  if (!gemm.ok()) {
    std::fprintf(stderr, "gemm_fp8: %s\n", gemm.status().ToString().c_str());
    return;
  }
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {
      {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gateup", 28672, 4096}, {"down", 4096, 14336}};
  for (const int64_t m : {256, 512, 1024, 2048}) {
    for (const Shape& sh : shapes) {
      void *x, *w, *y, *xq, *wq, *xs, *ws;
      BENCH_CHECK(cudaMalloc(&x, m * sh.k * 2));
      BENCH_CHECK(cudaMalloc(&w, sh.n * sh.k * 2));
      BENCH_CHECK(cudaMalloc(&y, m * sh.n * 2));
      BENCH_CHECK(cudaMalloc(&xq, m * sh.k));
      BENCH_CHECK(cudaMalloc(&wq, sh.n * sh.k));
      BENCH_CHECK(cudaMalloc(&xs, m * 4));
      BENCH_CHECK(cudaMalloc(&ws, sh.n * 4));
      cudaMemset(x, 0x3c, m * sh.k * 2);
      cudaMemset(w, 0x3c, sh.n * sh.k * 2);
      auto* xb = static_cast<__nv_bfloat16*>(x);
      auto* wb = static_cast<__nv_bfloat16*>(w);
      auto* xq8 = static_cast<uint8_t*>(xq);
      auto* wq8 = static_cast<uint8_t*>(wq);
      auto* xsf = static_cast<float*>(xs);
      auto* wsf = static_cast<float*>(ws);
      Status st = (*gemm)->Tune(xb, wb, y, DType::kBF16, m, sh.n, sh.k, s);
      if (st.ok()) st = QuantizeRowsFp8(wb, sh.n, sh.k, sh.k, wq8, wsf, 1.f, s);
      if (st.ok()) st = QuantizeRowsFp8(xb, m, sh.k, sh.k, xq8, xsf, 1.f, s);
      if (st.ok()) st = (*gemm)->RunFp8(xq8, xsf, wq8, wsf, y, DType::kBF16, m, sh.n, sh.k, s);
      if (!st.ok()) {
        std::fprintf(stderr, "gemm_fp8 %s m=%lld: %s\n", sh.name, (long long)m, st.ToString().c_str());
      } else {
        const float bf16_ms =
            TimeMs(s, [&] { (void)(*gemm)->Run(xb, wb, y, DType::kBF16, m, sh.n, sh.k, s); });
        const float fp8_ms =
            TimeMs(s, [&] { (void)(*gemm)->RunFp8(xq8, xsf, wq8, wsf, y, DType::kBF16, m, sh.n, sh.k, s); });
        const float quant_ms = TimeMs(s, [&] { (void)QuantizeRowsFp8(xb, m, sh.k, sh.k, xq8, xsf, 1.f, s); });
        const double tf = 2.0 * m * sh.n * sh.k / 1e12;
        std::printf(
            "{\"bench\":\"gemm_fp8\",\"shape\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"bf16_ms\":%.4f,"
            "\"fp8_gemm_ms\":%.4f,\"fp8_quant_ms\":%.4f,\"bf16_tflops\":%.1f,\"fp8_gemm_tflops\":%.1f,"
            "\"fp8_over_bf16\":%.3f,\"fp8_with_quant_over_bf16\":%.3f}\n",
            sh.name, (long long)m, (long long)sh.n, (long long)sh.k, bf16_ms, fp8_ms, quant_ms,
            tf / (bf16_ms * 1e-3), tf / (fp8_ms * 1e-3), bf16_ms / fp8_ms, bf16_ms / (fp8_ms + quant_ms));
      }
      for (void* p : {x, w, y, xq, wq, xs, ws}) cudaFree(p);
    }
  }
  if (Status st = (*gemm)->Save(); !st.ok()) std::fprintf(stderr, "gemm cache: %s\n", st.ToString().c_str());
}

// Decode projections at batch 1, 2, 4 and 8 (Llama-3.1-8B shapes): the bf16 GEMV (gemv.h) vs cuBLASLt on the
// same buffers. Each timed call reads the next of several weight copies (>= 512 MiB in all), so no run is
// served from the 50 MB L2 the way a repeated 32 MB matrix would be. GB/s counts weight bytes only.
void GemvBench(cudaStream_t s) {
  GemmOptions opt;
  opt.candidates = 8;
  auto gemm = BlasLtGemm::Create(opt);
  if (!gemm.ok()) {
    std::fprintf(stderr, "gemv: %s\n", gemm.status().ToString().c_str());
    return;
  }
  struct Shape {
    const char* name;
    int64_t n, k;
    bool silu;  // gate|up fused with SwiGLU (n = 2 x inter rows read, inter outputs)
    bool f32;   // fp32 output (lm_head)
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, false, false},
                          {"o", 4096, 4096, false, false},
                          {"gate_up_swiglu", 28672, 4096, true, false},
                          {"down", 4096, 14336, false, false},
                          {"lm_head", 128256, 4096, false, true}};
  for (const Shape& sh : shapes) {
    const size_t wbytes = static_cast<size_t>(sh.n) * sh.k * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / wbytes + 1));
    std::vector<void*> ws(copies);
    for (void*& w : ws) {
      BENCH_CHECK(cudaMalloc(&w, wbytes));
      cudaMemset(w, 0x3c, wbytes);
    }
    void *x, *y;
    BENCH_CHECK(cudaMalloc(&x, 8 * sh.k * 2));
    BENCH_CHECK(cudaMalloc(&y, 8 * sh.n * 4));
    cudaMemset(x, 0x3c, 8 * sh.k * 2);
    auto* xb = static_cast<__nv_bfloat16*>(x);
    for (int64_t m : {1, 2, 4, 8}) {
      int next = 0;
      auto w = [&] { return static_cast<__nv_bfloat16*>(ws[next++ % copies]); };
      Status st;
      const float gemv_ms = TimeMs(s, [&] {
        if (sh.silu) {
          st = Bf16GemvSiluMul(w(), sh.n / 2, sh.k, xb, m, static_cast<__nv_bfloat16*>(y), false, s);
        } else if (sh.f32) {
          st = Bf16Gemv(w(), sh.n, sh.k, xb, m, static_cast<float*>(y), sh.n, false, s);
        } else {
          st = Bf16Gemv(w(), sh.n, sh.k, xb, m, static_cast<__nv_bfloat16*>(y), sh.n, false, s);
        }
      });
      if (!st.ok()) std::fprintf(stderr, "gemv %s: %s\n", sh.name, st.ToString().c_str());
      const DType out = sh.f32 ? DType::kF32 : DType::kBF16;
      for (void* wc : ws) (void)(*gemm)->Tune(xb, static_cast<__nv_bfloat16*>(wc), y, out, m, sh.n, sh.k, s);
      const float lt_ms = TimeMs(s, [&] { (void)(*gemm)->Run(xb, w(), y, out, m, sh.n, sh.k, s); });
      std::printf(
          "{\"bench\":\"gemv\",\"shape\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"weight_copies\":%d,"
          "\"gemv_ms\":%.4f,\"gemv_gbps\":%.1f,\"cublaslt_ms\":%.4f,\"cublaslt_gbps\":%.1f%s}\n",
          sh.name, (long long)m, (long long)sh.n, (long long)sh.k, copies, gemv_ms,
          wbytes / (gemv_ms * 1e-3) / 1e9, lt_ms, wbytes / (lt_ms * 1e-3) / 1e9,
          sh.silu ? ",\"note\":\"cublaslt without the SwiGLU kernel\"" : "");
    }
    for (void* w : ws) cudaFree(w);
    cudaFree(x);
    cudaFree(y);
  }
}

// Llama-3.1-8B attention (32 heads, 8 kv heads, head_dim 128), bf16 cache, block size 16; each case with the
// warp kernel and the tensor-core one (AttentionLaunchOptions::decode_tiled), the merge kernel included; an
// fp8 cache with both tiled forms, named as --decode-attention names them: "tiled-smem" (codes widened in
// shared memory) and "tiled" (the default: codes straight into fragments, decode_tiled_fragments). Results
// before 2026-12-05 called the fragment form "tiled-regs".
void DecodeAttentionBench(cudaStream_t s) {
  const int heads = 32, kvh = 8, hd = 128, bs = 16;
  struct Case {
    int seqs, ctx;
  };
  for (const Case c : {Case{1, 512}, Case{1, 4096}, Case{1, 32768}, Case{32, 2048}, Case{64, 1000},
                       Case{64, 4096}, Case{256, 1000}, Case{256, 1500}, Case{512, 1500}}) {
    const int blocks_per_seq = (c.ctx + bs - 1) / bs;
    const int num_blocks = blocks_per_seq * c.seqs;
    const size_t cache_elems = static_cast<size_t>(num_blocks) * bs * kvh * hd;
    void *k, *v, *q, *out, *bt, *lens;
    BENCH_CHECK(cudaMalloc(&k, cache_elems * 2));
    BENCH_CHECK(cudaMalloc(&v, cache_elems * 2));
    cudaMemset(k, 0x3c, cache_elems * 2);
    cudaMemset(v, 0x3c, cache_elems * 2);
    BENCH_CHECK(cudaMalloc(&q, c.seqs * heads * hd * 2));
    BENCH_CHECK(cudaMalloc(&out, c.seqs * heads * hd * 2));
    cudaMemset(q, 0x3c, c.seqs * heads * hd * 2);
    std::vector<int32_t> table(static_cast<size_t>(c.seqs) * blocks_per_seq), ctx(c.seqs, c.ctx);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7919) % num_blocks);
    BENCH_CHECK(cudaMalloc(&bt, table.size() * 4));
    BENCH_CHECK(cudaMalloc(&lens, c.seqs * 4));
    cudaMemcpy(bt, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(lens, ctx.data(), c.seqs * 4, cudaMemcpyHostToDevice);
    // Both kernels over one cache (bf16, or 8-bit codes with a scale per row: bytes_per_row counts both).
    // 8-bit caches also with the tiled kernel's fragment form
    // (AttentionLaunchOptions::decode_tiled_fragments).
    auto run = [&](const char* cache, const auto& cache_kv, double bytes_per_row) {
      constexpr bool kQuant = std::is_same_v<std::decay_t<decltype(cache_kv)>, DevicePagedKvQuant>;
      // warp, tiled (8-bit caches: tiled-smem), 8-bit caches: tiled; from batch 64 the default tiled form
      // again with decode_partition 512 ("/p512", the default before 2026-12-05).
      // 8-bit caches also: the default tiled form with 3 and 4 cp.async stages ("tiled/s3", "tiled/s4").
      // bf16 at batch 1 also: the tiled form with splits of at least 128 / 256 positions ("tiled/m128",
      // "tiled/m256", --decode-min-partition; the default 16 gives the tiled kernel 64-position splits): fewer,
      // longer splits against more blocks and a larger merge.
      for (const int variant : {0, 1, 2, 3, 4, 5, 6, 7}) {
        if ((variant == 2 || variant == 4 || variant == 5) && !kQuant) continue;
        if (variant >= 6 && (kQuant || c.seqs != 1)) continue;
        if (variant == 3 && c.seqs < 64) continue;
        AttentionLaunchOptions launch;
        const bool tiled = variant > 0;
        launch.decode_tiled = tiled;
        launch.decode_tiled_fragments = variant == 2 || variant >= 4 || (variant == 3 && kQuant);
        if (variant == 3) launch.decode_partition = 512;
        if (variant >= 6) launch.decode_min_partition = variant == 6 ? 128 : 256;
        launch.decode_stages = variant == 4 ? 3 : variant == 5 ? 4 : 2;
        const size_t ws_bytes = DecodeWorkspaceBytes(c.seqs, heads, hd, c.ctx, launch);
        void* ws;
        BENCH_CHECK(cudaMalloc(&ws, ws_bytes > 0 ? ws_bytes : 1));
        Status st;
        const float ms = TimeMs(s, [&] {
          st = PagedDecodeAttention(static_cast<__nv_bfloat16*>(q), static_cast<int32_t*>(bt), blocks_per_seq,
                                    static_cast<int32_t*>(lens), c.seqs, heads, c.ctx, 0.088f, cache_kv, ws,
                                    static_cast<__nv_bfloat16*>(out), s, launch);
        });
        if (!st.ok()) std::fprintf(stderr, "decode_attn %s: %s\n", cache, st.ToString().c_str());
        const double kv_bytes = 2.0 * c.seqs * static_cast<double>(c.ctx) * kvh * bytes_per_row;
        std::printf(
            "{\"bench\":\"decode_attn\",\"cache\":\"%s\",\"kernel\":\"%s\",\"seqs\":%d,\"ctx\":%d,"
            "\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"ms\":%.4f,\"kv_gbps\":%.1f}\n",
            cache,
            variant == 0             ? "warp"
            : variant == 3           ? "tiled/p512"
            : variant == 4           ? "tiled/s3"
            : variant == 5           ? "tiled/s4"
            : variant == 6           ? "tiled/m128"
            : variant == 7           ? "tiled/m256"
            : kQuant && variant == 1 ? "tiled-smem"
                                     : "tiled",
            c.seqs, c.ctx, heads, kvh, hd, ms, kv_bytes / (ms * 1e-3) / 1e9);
        cudaFree(ws);
      }
    };
    run("bf16",
        DevicePagedKv<__nv_bfloat16>{static_cast<__nv_bfloat16*>(k), static_cast<__nv_bfloat16*>(v),
                                     num_blocks, bs, kvh, hd},
        hd * 2.0);
    // An fp8 cache (half the bytes; codes 0x3c with scale 1), from batch 32 up.
    if (c.seqs >= 32) {
      void *ks, *vs;
      const size_t scales = static_cast<size_t>(num_blocks) * bs * kvh;
      BENCH_CHECK(cudaMalloc(&ks, scales * 4));
      BENCH_CHECK(cudaMalloc(&vs, scales * 4));
      std::vector<float> ones(scales, 1.f);
      cudaMemcpy(ks, ones.data(), scales * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(vs, ones.data(), scales * 4, cudaMemcpyHostToDevice);
      run("fp8",
          DevicePagedKvQuant{static_cast<uint8_t*>(k), static_cast<uint8_t*>(v), static_cast<float*>(ks),
                             static_cast<float*>(vs), KvCacheDtype::kFp8, num_blocks, bs, kvh, hd},
          hd + 4.0);
      cudaFree(ks);
      cudaFree(vs);
    }
    for (void* p : {k, v, q, out, bt, lens}) cudaFree(p);
  }
}

// Median milliseconds of one call of fn over g_iters calls (after 2 warm-ups), each timed by its own events.
template <typename Fn>
float MedianMs(cudaStream_t s, Fn fn) {
  for (int i = 0; i < 2; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> times;
  for (int i = 0; i < g_iters; ++i) {
    cudaEventRecord(a, s);
    fn();
    cudaEventRecord(b, s);
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Llama-3.1-8B prefill attention (32 heads, 8 kv heads, head_dim 128), bf16 cache, block size 16, shuffled
// blocks: the tensor-core kernel (tiled) vs the warp-per-(token, head) kernel (warp). Causal FLOPs =
// 4 · hd · heads · Σ_s (T_s (T_s + 1) / 2 + T_s · start_s).
// EncoderAttentionTiled on [seqs x len] tokens of fused qkv (16 heads of 64: BERT-large; 12: BERT-base),
// every sequence `len` long, with 16 and 32 query rows per warp.
void EncoderAttentionBench(cudaStream_t s) {
  struct Case {
    const char* name;
    int seqs, len, heads;
  };
  for (const Case c : {Case{"bert-large_64x384", 64, 384, 16}, Case{"bert-large_256x384", 256, 384, 16},
                       Case{"bert-base_256x128", 256, 128, 12}, Case{"bert-large_8x384", 8, 384, 16}}) {
    const int hd = 64;
    const int64_t tokens = int64_t{c.seqs} * c.len, hidden = int64_t{c.heads} * hd;
    void *qkv, *out, *cu;
    BENCH_CHECK(cudaMalloc(&qkv, tokens * 3 * hidden * 2));
    BENCH_CHECK(cudaMalloc(&out, tokens * hidden * 2));
    cudaMemset(qkv, 0x3c, tokens * 3 * hidden * 2);
    std::vector<int32_t> cus(c.seqs + 1);
    for (int i = 0; i <= c.seqs; ++i) cus[i] = i * c.len;
    BENCH_CHECK(cudaMalloc(&cu, cus.size() * 4));
    cudaMemcpy(cu, cus.data(), cus.size() * 4, cudaMemcpyHostToDevice);
    const double flops = 4.0 * hd * c.heads * c.seqs * static_cast<double>(c.len) * c.len;
    for (const int rows : {16, 32}) {
      Status st;
      const float ms = MedianMs(s, [&] {
        st = EncoderAttentionTiled(static_cast<__nv_bfloat16*>(qkv), static_cast<int32_t*>(cu), c.seqs, c.len,
                                   c.heads, hd, 0.125f, static_cast<__nv_bfloat16*>(out), s, rows);
      });
      if (!st.ok()) std::fprintf(stderr, "encoder_attn: %s\n", st.ToString().c_str());
      std::printf(
          "{\"bench\":\"encoder_attn\",\"case\":\"%s\",\"warp_rows\":%d,\"ms\":%.4f,\"tflops\":%.1f}\n",
          c.name, rows, ms, flops / (ms * 1e-3) / 1e12);
    }
    for (void* p : {qkv, out, cu}) cudaFree(p);
  }
}

void PrefillAttentionBench(cudaStream_t s) {
  const int heads = 32, kvh = 8, hd = 128, bs = 16;
  struct Case {
    const char* name;
    int seqs, tokens, start;  // every sequence: `tokens` new tokens after `start` cached positions
  };
  for (const Case c :
       {Case{"1x2048", 1, 2048, 0}, Case{"4x512", 4, 512, 0}, Case{"1x512_after_3584", 1, 512, 3584}}) {
    const int ctx = c.start + c.tokens;
    const int blocks_per_seq = (ctx + bs - 1) / bs;
    const int num_blocks = blocks_per_seq * c.seqs;
    const int total = c.seqs * c.tokens;
    const size_t cache_elems = static_cast<size_t>(num_blocks) * bs * kvh * hd;
    const size_t q_elems = static_cast<size_t>(total) * heads * hd;
    void *k, *v, *q, *out, *bt, *cu, *sp;
    BENCH_CHECK(cudaMalloc(&k, cache_elems * 2));
    BENCH_CHECK(cudaMalloc(&v, cache_elems * 2));
    BENCH_CHECK(cudaMalloc(&q, q_elems * 2));
    BENCH_CHECK(cudaMalloc(&out, q_elems * 2));
    cudaMemset(k, 0x3c, cache_elems * 2);  // small finite bf16 values
    cudaMemset(v, 0x3c, cache_elems * 2);
    cudaMemset(q, 0x3c, q_elems * 2);
    std::vector<int32_t> table(static_cast<size_t>(c.seqs) * blocks_per_seq), cus(c.seqs + 1),
        sps(c.seqs, c.start);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7919) % num_blocks);
    for (int i = 0; i <= c.seqs; ++i) cus[i] = i * c.tokens;
    BENCH_CHECK(cudaMalloc(&bt, table.size() * 4));
    BENCH_CHECK(cudaMalloc(&cu, cus.size() * 4));
    BENCH_CHECK(cudaMalloc(&sp, sps.size() * 4));
    cudaMemcpy(bt, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(cu, cus.data(), cus.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(sp, sps.data(), sps.size() * 4, cudaMemcpyHostToDevice);
    DevicePagedKv<__nv_bfloat16> kv{
        static_cast<__nv_bfloat16*>(k), static_cast<__nv_bfloat16*>(v), num_blocks, bs, kvh, hd};
    const double flops =
        4.0 * hd * heads * c.seqs *
        (static_cast<double>(c.tokens) * (c.tokens + 1) / 2 + static_cast<double>(c.tokens) * c.start);
    struct Kernel {
      const char* name;
      int rows;  // 0: the warp kernel
    };
    for (const Kernel kern : {Kernel{"tiled64", 64}, Kernel{"tiled128", 128}, Kernel{"warp", 0}}) {
      const char* kernel = kern.name;
      const int rows = kern.rows;
      const bool warp = rows == 0;
      Status st;
      const float ms = MedianMs(s, [&] {
        auto* qq = static_cast<__nv_bfloat16*>(q);
        auto* oo = static_cast<__nv_bfloat16*>(out);
        auto* cc = static_cast<int32_t*>(cu);
        auto* ss = static_cast<int32_t*>(sp);
        auto* tt = static_cast<int32_t*>(bt);
        st = warp ? PrefillAttentionWarp(qq, cc, ss, c.seqs, total, tt, blocks_per_seq, heads, 0.088f, kv, oo,
                                         s)
                  : PrefillAttentionTiled(qq, cc, ss, c.seqs, total, tt, blocks_per_seq, heads, 0.088f, kv,
                                          oo, s, rows);
      });
      const cudaError_t err = cudaStreamSynchronize(s);
      if (!st.ok() || err != cudaSuccess) {
        std::fprintf(stderr, "prefill_attn %s %s: %s %s\n", c.name, kernel, st.ToString().c_str(),
                     cudaGetErrorString(err));
        continue;
      }
      std::printf(
          "{\"bench\":\"prefill_attn\",\"case\":\"%s\",\"kernel\":\"%s\",\"seqs\":%d,\"tokens\":%d,"
          "\"start\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"ms\":%.4f,\"tflops\":%.1f}\n",
          c.name, kernel, c.seqs, c.tokens, c.start, heads, kvh, hd, ms, flops / (ms * 1e-3) / 1e12);
    }
    for (void* p : {k, v, q, out, bt, cu, sp}) cudaFree(p);
  }
}

}  // namespace
// The fp8 and Q8_0 GEMVs at m = 1 on the 8B shapes, each warps-per-row choice (0 = the auto rule; for fp8 the
// tensor-core kernel, 1-4 the CUDA-core one), and fp8 at 1-8 rows against cuBLASLt's FP8 GEMM, over
// >= 512 MiB of weight copies as GemvBench. Measured on the H200
// (bench/results/gpu_gemv8_h200_2026-12-04.json): the auto rule is within run-to-run noise (~7 %) of the best
// choice on every shape; a two-rows-per-warp form (tried, removed) gained nothing outside that noise.
void Gemv8Bench(cudaStream_t s) {
  GemmOptions opt;
  opt.candidates = 8;
  auto created = BlasLtGemm::Create(opt);
  if (!created.ok()) std::fprintf(stderr, "gemv8: cuBLASLt: %s\n", created.status().ToString().c_str());
  BlasLtGemm* gemm = created.ok() ? created->get() : nullptr;
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  BENCH_CHECK(cudaMalloc(&xq, 8 * 14336));
  BENCH_CHECK(cudaMalloc(&xs, 8 * sizeof(float)));
  struct Shape {
    const char* name;
    int64_t n, k;
    bool silu;
    bool f32;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, false, false},
                          {"o", 4096, 4096, false, false},
                          {"gate_up_swiglu", 28672, 4096, true, false},
                          {"down", 4096, 14336, false, false},
                          {"lm_head", 128256, 4096, false, true}};
  for (const char* fmt : {"fp8", "q8_0"}) {
    const bool q8 = std::strcmp(fmt, "q8_0") == 0;
    for (const Shape& sh : shapes) {
      const size_t qbytes = static_cast<size_t>(sh.n) * sh.k;
      const size_t sbytes = q8 ? static_cast<size_t>(sh.n) * (sh.k / 32) * 2 : static_cast<size_t>(sh.n) * 4;
      const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / (qbytes + sbytes) + 1));
      std::vector<void*> qs(copies), ss(copies);
      for (int i = 0; i < copies; ++i) {
        BENCH_CHECK(cudaMalloc(&qs[i], qbytes));
        BENCH_CHECK(cudaMalloc(&ss[i], sbytes));
        cudaMemset(qs[i], 0x21, qbytes);  // small finite values in both formats
        cudaMemset(ss[i], 0x1c, sbytes);
      }
      void *x, *y;
      BENCH_CHECK(cudaMalloc(&x, 8 * sh.k * 2));
      BENCH_CHECK(cudaMalloc(&y, 8 * sh.n * 4));
      cudaMemset(x, 0x3c, 8 * sh.k * 2);
      auto* xb = static_cast<__nv_bfloat16*>(x);
      // The fp8 GEMV on weight copy i for m rows of x.
      auto fp8 = [&](int i, int64_t m, int split) {
        const auto* q = static_cast<const uint8_t*>(qs[i]);
        const auto* sc = static_cast<const float*>(ss[i]);
        if (sh.silu)
          return Fp8GemvSiluMul(q, sc, sh.n / 2, sh.k, xb, m, static_cast<__nv_bfloat16*>(y), false, s,
                                split);
        if (sh.f32) return Fp8Gemv(q, sc, sh.n, sh.k, xb, m, static_cast<float*>(y), sh.n, false, s, split);
        return Fp8Gemv(q, sc, sh.n, sh.k, xb, m, static_cast<__nv_bfloat16*>(y), sh.n, false, s, split);
      };
      for (int split : {0, 1, 2, 4}) {
        int next = 0;
        Status st;
        const float ms = TimeMs(s, [&] {
          const int i = next++ % copies;
          const auto* q = static_cast<const uint8_t*>(qs[i]);
          if (q8) {
            const auto* qi = reinterpret_cast<const int8_t*>(q);
            const auto* d = static_cast<const __half*>(ss[i]);
            if (sh.silu) {
              st = Q8GemvSiluMul(qi, d, sh.n / 2, sh.k, xb, 1, static_cast<__nv_bfloat16*>(y), false, s,
                                 split);
            } else if (sh.f32) {
              st = Q8Gemv(qi, d, sh.n, sh.k, xb, 1, static_cast<float*>(y), sh.n, false, s, split);
            } else {
              st = Q8Gemv(qi, d, sh.n, sh.k, xb, 1, static_cast<__nv_bfloat16*>(y), sh.n, false, s, split);
            }
          } else {
            st = fp8(i, 1, split);
          }
        });
        if (!st.ok()) std::fprintf(stderr, "gemv8 %s %s: %s\n", fmt, sh.name, st.ToString().c_str());
        std::printf(
            "{\"bench\":\"gemv8\",\"format\":\"%s\",\"shape\":\"%s\",\"n\":%lld,\"k\":%lld,\"split\":\"%s\","
            "\"auto_split\":%d,\"ms\":%.4f,\"gbps\":%.1f}\n",
            fmt, sh.name, (long long)sh.n, (long long)sh.k, std::to_string(split).c_str(),
            Fp8GemvSplitFor(1, sh.k, 0), ms, (qbytes + sbytes) / (ms * 1e-3) / 1e9);
      }
      // fp8 at 1-8 rows of x: the tensor-core GEMV (split 0) against cuBLASLt's FP8 GEMM with the activations
      // quantised per token first (the decoder's path past --fp8-gemv-max-rows); the gate|up shape without
      // SwiGLU.
      if (!q8 && gemm != nullptr) {
        for (int64_t m : {1, 2, 4, 8}) {
          int next = 0;
          Status st;
          const float gemv_ms = TimeMs(s, [&] { st = fp8(next++ % copies, m, 0); });
          const DType out = sh.f32 ? DType::kF32 : DType::kBF16;
          const float lt_ms = TimeMs(s, [&] {
            const int i = next++ % copies;
            (void)QuantizeRowsFp8(xb, m, sh.k, sh.k, xq, xs, 1.f, s, /*vec8=*/true);
            (void)gemm->RunFp8(xq, xs, static_cast<const uint8_t*>(qs[i]), static_cast<const float*>(ss[i]),
                               y, out, m, sh.n, sh.k, s);
          });
          if (!st.ok()) std::fprintf(stderr, "gemv8 rows %s: %s\n", sh.name, st.ToString().c_str());
          std::printf(
              "{\"bench\":\"gemv8_rows\",\"format\":\"fp8\",\"shape\":\"%s\",\"m\":%lld,\"n\":%lld,"
              "\"k\":%lld,\"gemv_ms\":%.4f,\"gemv_gbps\":%.1f,\"cublaslt_fp8_ms\":%.4f%s}\n",
              sh.name, (long long)m, (long long)sh.n, (long long)sh.k, gemv_ms,
              (qbytes + sbytes) / (gemv_ms * 1e-3) / 1e9, lt_ms,
              sh.silu ? ",\"note\":\"cublaslt without the SwiGLU kernel\"" : "");
        }
      }
      for (int i = 0; i < copies; ++i) {
        cudaFree(qs[i]);
        cudaFree(ss[i]);
      }
      cudaFree(x);
      cudaFree(y);
    }
  }
  cudaFree(xq);
  cudaFree(xs);
}

// The GGUF K-quant GEMVs (QuantGemv over Q4_K / Q6_K super-blocks) at m = 1 on the 8B shapes, bf16 in
// (fp32 out for the lm_head), each KGemvMath and rows-per-warp choice (0 = the default; kAuto with the
// default rows only: the choice the decoder makes), over >= 512 MiB of weight copies as GemvBench: GB/s of
// block bytes read.
void GemvKBench(cudaStream_t s) {
  struct Shape {
    const char* name;
    int64_t n, k;
    bool f32;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, false},
                          {"o", 4096, 4096, false},
                          {"gate_up", 28672, 4096, false},
                          {"down", 4096, 14336, false},
                          {"lm_head", 128256, 4096, true}};
  for (const DType t : {DType::kQ4_K, DType::kQ6_K}) {
    const size_t block_bytes = t == DType::kQ4_K ? 144 : 210;
    for (const Shape& sh : shapes) {
      const size_t bytes = static_cast<size_t>(sh.n) * (sh.k / 256) * block_bytes;
      const int copies = static_cast<int>(std::max<size_t>(2, (size_t{512} << 20) / bytes + 1));
      std::vector<void*> ws(copies);
      for (void*& w : ws) {
        BENCH_CHECK(cudaMalloc(&w, bytes));
        cudaMemset(w, 0x21, bytes);  // fp16 0x2121 scales: small finite values in both formats
      }
      void *x, *y;
      BENCH_CHECK(cudaMalloc(&x, sh.k * 2));
      BENCH_CHECK(cudaMalloc(&y, sh.n * 4));
      cudaMemset(x, 0x3c, sh.k * 2);
      const auto* xb = static_cast<const __nv_bfloat16*>(x);
      for (const KGemvMath math : {KGemvMath::kAuto, KGemvMath::kFp32, KGemvMath::kInt8Activations}) {
        // "int8_activations" as in the results before 2026-12-05 (bench/gpu/gemvk_ab.sh's keys).
        const char* math_name =
            math == KGemvMath::kInt8Activations ? "int8_activations" : KGemvMathName(math);
        for (const int rows : {0, 1, 2, 4}) {
          if (math == KGemvMath::kAuto && rows != 0) continue;
          int next = 0;
          Status st;
          const float ms = TimeMs(s, [&] {
            const void* w = ws[next++ % copies];
            st = sh.f32 ? QuantGemv(t, w, sh.n, sh.k, xb, static_cast<float*>(y), s, rows, math)
                        : QuantGemv(t, w, sh.n, sh.k, xb, static_cast<__nv_bfloat16*>(y), s, rows, math);
          });
          if (!st.ok()) std::fprintf(stderr, "gemvk %s: %s\n", sh.name, st.ToString().c_str());
          std::printf(
              "{\"bench\":\"gemvk\",\"format\":\"%s\",\"shape\":\"%s\",\"n\":%lld,\"k\":%lld,"
              "\"math\":\"%s\",\"rows_per_warp\":%d,\"ms\":%.4f,\"gbps\":%.1f}\n",
              std::string(DTypeName(t)).c_str(), sh.name, (long long)sh.n, (long long)sh.k, math_name, rows,
              ms, bytes / (ms * 1e-3) / 1e9);
        }
      }
      for (void* w : ws) cudaFree(w);
      cudaFree(x);
      cudaFree(y);
    }
  }
}

}  // namespace stoke::cuda

int main(int argc, char** argv) {
  using namespace stoke::cuda;
  std::string only;        // --only SECTION (see the top of the file)
  std::string gemm_cache;  // --gemm-cache FILE
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gemm-cache") == 0 && i + 1 < argc) gemm_cache = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) g_iters = 3;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
  }
  auto want = [&](const char* section) { return only.empty() || only == section; };
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    std::printf("{\"bench\":\"none\",\"error\":\"no CUDA device\"}\n");
    return 0;
  }
  auto info = GetDeviceInfo(0);
  if (info.ok()) {
    std::printf("{\"bench\":\"device\",\"name\":\"%s\",\"sm\":\"%d.%d\",\"sms\":%d,\"memory_gib\":%.1f}\n",
                info->name.c_str(), info->sm_major, info->sm_minor, info->num_sms,
                info->total_memory / 1073741824.0);
  }
  cudaStream_t s;
  BENCH_CHECK(cudaStreamCreate(&s));
  if (want("copies")) {
    std::fprintf(stderr, "cuda_bench: copies\n");
    CopyBench(s);
    std::fflush(stdout);
  }
  if (want("gemm")) {
    std::fprintf(stderr, "cuda_bench: gemm\n");
    GemmBench(s, gemm_cache);
    std::fflush(stdout);
  }
  if (want("gemm_fp8")) {
    std::fprintf(stderr, "cuda_bench: gemm_fp8\n");
    GemmFp8Bench(s, gemm_cache);
    std::fflush(stdout);
  }
  if (want("elementwise")) {
    std::fprintf(stderr, "cuda_bench: elementwise\n");
    ElementwiseBench(s);
    std::fflush(stdout);
  }
  if (want("gemv")) {
    std::fprintf(stderr, "cuda_bench: gemv\n");
    GemvBench(s);
    std::fflush(stdout);
  }
  if (want("gemv8")) {
    std::fprintf(stderr, "cuda_bench: gemv8\n");
    Gemv8Bench(s);
    std::fflush(stdout);
  }
  if (want("gemvk")) {
    std::fprintf(stderr, "cuda_bench: gemvk\n");
    GemvKBench(s);
    std::fflush(stdout);
  }
  if (want("decode_attn")) {
    std::fprintf(stderr, "cuda_bench: decode attention\n");
    DecodeAttentionBench(s);
    std::fflush(stdout);
  }
  if (want("prefill_attn")) {
    std::fprintf(stderr, "cuda_bench: prefill attention\n");
    PrefillAttentionBench(s);
  }
  if (want("encoder_attn")) {
    std::fprintf(stderr, "cuda_bench: encoder attention\n");
    EncoderAttentionBench(s);
    std::fflush(stdout);
  }
  cudaStreamDestroy(s);
  return 0;
}
