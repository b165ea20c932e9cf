// GPU RoPE + KV write, paged decode attention (with the split-context reduction) and prefill attention
// against cpu::RopeNeox / cpu::WriteKv / cpu::PagedAttention, and the GPU argmax / sampler. Skipped without a
// GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "base/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/decoder_ops.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/sampling.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::kTolBf16;
using testing::kTolF32;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

std::vector<float> InvFreq(int head_dim, float theta = 10000.f) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) f[i] = std::pow(theta, -2.f * i / head_dim);
  return f;
}

// A paged cache with shuffled physical blocks, one block table row per sequence, filled with random K/V for
// every position of every sequence (the CPU holds the fp32 copy, the GPU fp32 or bf16).
struct PagedFixture {
  int block_size = 16, kv_heads = 2, head_dim = 64, num_blocks = 0, max_blocks = 0;
  std::vector<int> lens;
  std::vector<int32_t> tables;  // [num_seqs, max_blocks]
  std::vector<float> k, v;      // [num_blocks, block_size, kv_heads, head_dim]

  PagedFixture(std::vector<int> seq_lens, int bs, int kvh, int hd, bool bf16, uint32_t seed)
      : block_size(bs), kv_heads(kvh), head_dim(hd), lens(std::move(seq_lens)) {
    for (int l : lens) max_blocks = std::max(max_blocks, (l + bs - 1) / bs);
    num_blocks = max_blocks * static_cast<int>(lens.size()) + 3;
    std::vector<int32_t> phys(num_blocks);
    std::iota(phys.begin(), phys.end(), 0);
    std::shuffle(phys.begin(), phys.end(), std::mt19937(seed));
    tables.assign(lens.size() * max_blocks, 0);
    for (size_t s = 0, next = 0; s < lens.size(); ++s) {
      for (int b = 0; b < (lens[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = phys[next++];
    }
    const size_t n = static_cast<size_t>(num_blocks) * bs * kvh * hd;
    k = RandomFloats(n, seed + 1);
    v = RandomFloats(n, seed + 2);
    if (bf16) k = RoundBf16(k), v = RoundBf16(v);
  }
  cpu::PagedKvLayer Cpu() { return {k.data(), v.data(), num_blocks, block_size, kv_heads, head_dim}; }
};

template <typename T>
DevicePagedKv<T> Gpu(const PagedFixture& f, T* k, T* v) {
  return DevicePagedKv<T>{k, v, f.num_blocks, f.block_size, f.kv_heads, f.head_dim};
}

// The CPU reference of a decode step: one query per sequence at its last position (q = [seqs, heads, hd]).
std::vector<float> CpuDecode(PagedFixture& f, const std::vector<float>& q, int heads, float scale) {
  std::vector<float> want(q.size());
  auto kvc = f.Cpu();
  const int64_t row = int64_t{heads} * f.head_dim;
  for (size_t s = 0; s < f.lens.size(); ++s) {
    cpu::PagedAttention(q.data() + s * row, 1, heads, f.lens[s] - 1, f.tables.data() + s * f.max_blocks, kvc,
                        scale, want.data() + s * row, ThreadPool::Default());
  }
  return want;
}

class CudaDecode : public ::testing::TestWithParam<int> {};  // head_dim

// Contexts of 1, 17, 513 (just past one split), 1500 and 4100 positions: one-split and multi-split paths.
TEST_P(CudaDecode, MatchesCpuPagedAttention) {
  SKIP_WITHOUT_GPU();
  const int hd = GetParam(), heads = 8, kvh = 2;
  const std::vector<int> lens = {1, 17, 513, 1500, 4100};
  const int max_ctx = 4100, num_seqs = static_cast<int>(lens.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (bool bf16 : {false, true}) {
    PagedFixture f(lens, 16, kvh, hd, bf16, 100 + hd);
    auto q = RandomFloats(static_cast<size_t>(num_seqs) * heads * hd, 200 + hd, -2.f, 2.f);
    if (bf16) q = RoundBf16(q);
    const std::vector<float> want = CpuDecode(f, q, heads, scale);
    DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
    const size_t ws_bytes = DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx);
    ASSERT_GT(ws_bytes, 0u);
    DeviceBuffer<uint8_t> ws(ws_bytes);
    if (!bf16) {
      DeviceBuffer<float> dq(q), dk(f.k), dv(f.v), out(q.size());
      STATUS_ASSERT(PagedDecodeAttention(dq.get(), dt.get(), f.max_blocks, dl.get(), num_seqs, heads, max_ctx,
                                         scale, Gpu<float>(f, dk.get(), dv.get()), ws.get(), out.get(),
                                         nullptr));
      EXPECT_CLOSE(out.Download(), want, kTolF32, ("decode f32 hd=" + std::to_string(hd)).c_str());
    } else {
      DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
      STATUS_ASSERT(PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, heads,
                                         max_ctx, scale, Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()),
                                         ws.get(), out.bf16(), nullptr));
      EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16,
                   ("decode bf16 hd=" + std::to_string(hd)).c_str());
    }
  }
}
INSTANTIATE_TEST_SUITE_P(HeadDims, CudaDecode, ::testing::Values(64, 128));

// The GQA grouping: every query-head group size the launcher picks a kernel for (3 as SmolLM2's 9 over 3, 8,
// 2, and 1 = no sharing), against the CPU, bf16 cache, contexts on both sides of a split.
TEST(CudaDecode, EveryHeadGroupSizeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int hd = 64;
  const std::vector<int> lens = {3, 40, 700};
  const int max_ctx = 700, num_seqs = static_cast<int>(lens.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (auto [heads, kvh] : {std::pair{9, 3}, std::pair{16, 2}, std::pair{4, 2}, std::pair{6, 6}}) {
    PagedFixture f(lens, 16, kvh, hd, /*bf16=*/true, 300 + heads);
    const auto q =
        RoundBf16(RandomFloats(static_cast<size_t>(num_seqs) * heads * hd, 400 + heads, -2.f, 2.f));
    const std::vector<float> want = CpuDecode(f, q, heads, scale);
    DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx)));
    DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
    STATUS_ASSERT(PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, heads, max_ctx,
                                       scale, Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()), ws.get(),
                                       out.bf16(), nullptr));
    const std::string what = "decode bf16 heads " + std::to_string(heads) + " / kv " + std::to_string(kvh);
    EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, what.c_str());
  }
}

// --decode-attention tiled (AttentionLaunchOptions::decode_tiled): the tensor-core kernel against the CPU for
// group sizes 1, 3, 4, 7, 8 and 16 (rows past the group are padding of the mma tile), head_dim 64 and 128,
// block sizes 16 and 5 (a tile gathers from many blocks), contexts 0 (zeros), 1, 63, 64, 65 (a partial last
// tile), 700 and 4100 (several splits); then batch 1, where the split count comes from the occupancy rule.
TEST(CudaDecode, TiledMatchesCpu) {
  SKIP_WITHOUT_GPU();
  AttentionLaunchOptions tiled, warp;
  tiled.decode_tiled = true;
  warp.decode_tiled = false;
  EXPECT_FALSE(PagedDecodeAttentionTiledSupports(34, 2, 128));  // 17 per kv head: the warp kernel runs
  EXPECT_FALSE(PagedDecodeAttentionTiledSupports(8, 2, 256));
  // Returns the output in `got` (ASSERT_* need a void function).
  const auto run = [&](const std::vector<int>& lens, int hd, int heads, int kvh, int bs, uint32_t seed,
                       const AttentionLaunchOptions& launch, std::vector<float>* got_out = nullptr) {
    const int num_seqs = static_cast<int>(lens.size());
    const int max_ctx = *std::max_element(lens.begin(), lens.end());
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    PagedFixture f(lens, bs, kvh, hd, /*bf16=*/true, seed);
    const auto q = RoundBf16(RandomFloats(static_cast<size_t>(num_seqs) * heads * hd, seed + 7, -2.f, 2.f));
    std::vector<float> want(q.size(), 0.f);  // context 0: zeros
    auto kvc = f.Cpu();
    const int64_t row = int64_t{heads} * hd;
    for (int s = 0; s < num_seqs; ++s) {
      if (lens[s] == 0) continue;
      cpu::PagedAttention(q.data() + s * row, 1, heads, lens[s] - 1, f.tables.data() + s * f.max_blocks, kvc,
                          scale, want.data() + s * row, ThreadPool::Default());
    }
    DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, launch)));
    DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
    STATUS_ASSERT(PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, heads, max_ctx,
                                       scale, Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()), ws.get(),
                                       out.bf16(), nullptr, launch));
    const auto got = FromBf16(out.Download());
    const std::string what = "tiled decode hd " + std::to_string(hd) + " heads " + std::to_string(heads) +
                             " / kv " + std::to_string(kvh) + " block " + std::to_string(bs);
    EXPECT_CLOSE(got, want, kTolBf16, what.c_str());
    if (lens[0] == 0) {
      for (int i = 0; i < heads * hd; ++i) ASSERT_EQ(got[i], 0.f) << what << ": context 0 gives zeros";
    }
    if (got_out != nullptr) *got_out = got;
  };
  for (int hd : {64, 128}) {
    for (auto [heads, kvh] : {std::pair{8, 8}, std::pair{9, 3}, std::pair{32, 8}, std::pair{14, 2},
                              std::pair{16, 2}, std::pair{32, 2}}) {
      for (int bs : {16, 5}) run({0, 1, 63, 64, 65, 700, 4100}, hd, heads, kvh, bs, 900 + heads + bs, tiled);
    }
  }
  // Batch 1, the 8B shape: the occupancy rule splits 512 positions into pieces of at least 64 with the tiled
  // kernel (8 splits) against the warp kernel's pieces of 16 (32 splits); at 4100 both take 64 splits.
  EXPECT_EQ(DecodeWorkspaceBytes(1, 32, 128, 512, tiled) * 4, DecodeWorkspaceBytes(1, 32, 128, 512, warp));
  EXPECT_EQ(DecodeWorkspaceBytes(1, 32, 128, 4100, tiled), DecodeWorkspaceBytes(1, 32, 128, 4100, warp));
  std::vector<float> t, w;
  run({4100}, 128, 32, 8, 16, 950, tiled, &t);
  // The option really switches kernels: P is rounded to bf16 before P·V on tensor cores, so the outputs
  // differ in rounding (both match the CPU above).
  run({4100}, 128, 32, 8, 16, 950, warp, &w);
  ASSERT_EQ(t.size(), w.size());
  EXPECT_NE(t, w);
}

// AttentionLaunchOptions (the --decode-min-partition / --decode-pipeline flags) change how the work is split
// and loaded, not the answer; the PagedKvBatch overload is the positional call. Batch 1 so that the minimum
// partition decides the split count.
TEST(CudaDecode, LaunchOptionsKeepMatchingCpu) {
  SKIP_WITHOUT_GPU();
  const int hd = 128, heads = 8, kvh = 2;
  const std::vector<int> lens = {2000};
  const int max_ctx = 2000, num_seqs = 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  PagedFixture f(lens, 16, kvh, hd, /*bf16=*/true, 700);
  const auto q = RoundBf16(RandomFloats(static_cast<size_t>(num_seqs) * heads * hd, 701, -2.f, 2.f));
  const std::vector<float> want = CpuDecode(f, q, heads, scale);
  DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
  DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
  const PagedKvBatch<__nv_bfloat16> batch{.kv = Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()),
                                          .block_tables = dt.get(),
                                          .max_blocks_per_seq = f.max_blocks,
                                          .num_seqs = num_seqs,
                                          .context_lens = dl.get(),
                                          .max_context_len = max_ctx};
  // The warp kernel: with the tiled one (the default) a split holds at least 64 positions whatever the minimum.
  AttentionLaunchOptions min8, min32, min512, no_pipeline, tiled_min512;
  for (AttentionLaunchOptions* o : {&min8, &min32, &min512, &no_pipeline}) o->decode_tiled = false;
  tiled_min512.decode_min_partition = 512;
  min8.decode_min_partition = 8;
  min32.decode_min_partition = 32;
  min512.decode_min_partition = 512;
  no_pipeline.decode_pipeline = false;
  // Smaller pieces, more splits, more workspace.
  EXPECT_GT(DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, min8),
            DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, min32));
  EXPECT_GT(DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, min32),
            DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, min512));
  EXPECT_EQ(DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx),
            DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, AttentionLaunchOptions{}));
  for (const auto& [name, launch] :
       {std::pair{"default", AttentionLaunchOptions{}}, std::pair{"tiled min 512", tiled_min512},
        std::pair{"min 8", min8}, std::pair{"min 32", min32},
        std::pair{"min 512", min512}, std::pair{"no pipeline", no_pipeline}}) {
    DeviceBuffer<uint8_t> ws(std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, launch)));
    STATUS_ASSERT(
        PagedDecodeAttention(dq.bf16(), batch, heads, scale, ws.get(), out.bf16(), nullptr, launch));
    EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, (std::string("decode launch ") + name).c_str());
  }
}

// --prefill-attention warp (AttentionLaunchOptions::prefill_force_warp) runs exactly PrefillAttentionWarp.
TEST(CudaPrefill, ForceWarpIsTheWarpKernel) {
  SKIP_WITHOUT_GPU();
  const int hd = 64, heads = 8, kvh = 2, bs = 16;
  const std::vector<int> start = {20, 0}, chunk = {150, 33};
  std::vector<int> lens;
  std::vector<int32_t> cu = {0};
  for (int s = 0; s < 2; ++s) lens.push_back(start[s] + chunk[s]), cu.push_back(cu.back() + chunk[s]);
  const int total = cu.back();
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  PagedFixture f(lens, bs, kvh, hd, true, 800);
  const auto q = RoundBf16(RandomFloats(static_cast<size_t>(total) * heads * hd, 801, -2.f, 2.f));
  DeviceBuffer<int32_t> dt(f.tables), dcu(cu), dsp(std::vector<int32_t>(start.begin(), start.end()));
  DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out_f(q.size()), out_w(q.size());
  const PagedKvBatch<__nv_bfloat16> batch{.kv = Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()),
                                          .block_tables = dt.get(),
                                          .max_blocks_per_seq = f.max_blocks,
                                          .num_seqs = 2,
                                          .cu_seqlens = dcu.get(),
                                          .start_pos = dsp.get(),
                                          .total_tokens = total};
  AttentionLaunchOptions warp;
  warp.prefill_force_warp = true;
  STATUS_ASSERT(PrefillAttention(dq.bf16(), batch, heads, scale, out_f.bf16(), nullptr, warp));
  STATUS_ASSERT(PrefillAttentionWarp(dq.bf16(), dcu.get(), dsp.get(), 2, total, dt.get(), f.max_blocks, heads,
                                     scale, batch.kv, out_w.bf16(), nullptr));
  EXPECT_EQ(out_f.Download(), out_w.Download());
}

// Three sequences in one batch: a fresh prompt, a chunk after a 37-token cached prefix, and a chunk after
// 100.
TEST(CudaPrefill, MatchesCpuPagedAttentionWithCachedPrefix) {
  SKIP_WITHOUT_GPU();
  const int hd = 64, heads = 9, kvh = 3;
  const std::vector<int> start = {0, 37, 100}, chunk = {5, 20, 64};
  std::vector<int> lens(3);
  std::vector<int32_t> cu = {0};
  for (int s = 0; s < 3; ++s) lens[s] = start[s] + chunk[s], cu.push_back(cu.back() + chunk[s]);
  const int total = cu.back();
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (bool bf16 : {false, true}) {
    PagedFixture f(lens, 16, kvh, hd, bf16, 7);
    auto q = RandomFloats(static_cast<size_t>(total) * heads * hd, 8, -2.f, 2.f);
    if (bf16) q = RoundBf16(q);
    std::vector<float> want(q.size());
    auto kvc = f.Cpu();
    for (int s = 0; s < 3; ++s) {
      cpu::PagedAttention(q.data() + cu[s] * heads * hd, chunk[s], heads, start[s],
                          f.tables.data() + s * f.max_blocks, kvc, scale, want.data() + cu[s] * heads * hd,
                          ThreadPool::Default());
    }
    DeviceBuffer<int32_t> dt(f.tables), dcu(cu), dsp(std::vector<int32_t>(start.begin(), start.end()));
    if (!bf16) {
      DeviceBuffer<float> dq(q), dk(f.k), dv(f.v), out(q.size());
      STATUS_ASSERT(PrefillAttention(dq.get(), dcu.get(), dsp.get(), 3, total, dt.get(), f.max_blocks, heads,
                                     scale, Gpu<float>(f, dk.get(), dv.get()), out.get(), nullptr));
      EXPECT_CLOSE(out.Download(), want, kTolF32, "prefill f32");
    } else {
      DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
      STATUS_ASSERT(PrefillAttention(dq.bf16(), dcu.get(), dsp.get(), 3, total, dt.get(), f.max_blocks, heads,
                                     scale, Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16()), out.bf16(),
                                     nullptr));
      EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, "prefill bf16");
    }
  }
}

// Tensor-core prefill (PrefillAttentionTiled, and PrefillAttention's bf16 dispatch to it) against the fp32
// CPU reference. Param: (head_dim, GQA ratio, block_size). Six sequences of 1, 15, 64, 127, 300 and 1000 new
// tokens, four of them after a cached prefix of random length (never a multiple of the block size), in a
// cache with shuffled physical blocks.
class CudaPrefillTiled : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

struct PrefillCase {
  std::vector<int> start, chunk, lens;
  std::vector<int32_t> cu = {0};
  int total = 0;
};

PrefillCase MakePrefillCase(int bs, uint32_t seed) {
  PrefillCase c;
  c.chunk = {1, 15, 64, 127, 300, 1000};
  std::mt19937 rng(seed);
  for (size_t s = 0; s < c.chunk.size(); ++s) {
    int start = 0;
    if (s % 3 != 0) {  // sequences 1, 2, 4, 5: a cached prefix
      start = std::uniform_int_distribution<int>(1, 200)(rng);
      if (start % bs == 0) ++start;
    }
    c.start.push_back(start);
    c.lens.push_back(start + c.chunk[s]);
    c.cu.push_back(c.cu.back() + c.chunk[s]);
  }
  c.total = c.cu.back();
  return c;
}

TEST_P(CudaPrefillTiled, MatchesCpuPagedAttention) {
  SKIP_WITHOUT_GPU();
  const auto [hd, ratio, bs] = GetParam();
  const int kvh = ratio == 8 ? 1 : ratio == 4 ? 2 : 3, heads = kvh * ratio;
  const PrefillCase c = MakePrefillCase(bs, 11 * hd + ratio + bs);
  const int num_seqs = static_cast<int>(c.chunk.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  PagedFixture f(c.lens, bs, kvh, hd, /*bf16=*/true, 300 + hd + ratio + bs);
  const auto q = RoundBf16(RandomFloats(static_cast<size_t>(c.total) * heads * hd, 301 + hd, -2.f, 2.f));
  std::vector<float> want(q.size());
  auto kvc = f.Cpu();
  for (int s = 0; s < num_seqs; ++s) {
    cpu::PagedAttention(q.data() + static_cast<size_t>(c.cu[s]) * heads * hd, c.chunk[s], heads, c.start[s],
                        f.tables.data() + s * f.max_blocks, kvc, scale,
                        want.data() + static_cast<size_t>(c.cu[s]) * heads * hd, ThreadPool::Default());
  }
  DeviceBuffer<int32_t> dt(f.tables), dcu(c.cu), dsp(std::vector<int32_t>(c.start.begin(), c.start.end()));
  DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out(q.size());
  const auto kv = Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16());
  const std::string what = "prefill tiled hd=" + std::to_string(hd) + " gqa=" + std::to_string(ratio) +
                           " bs=" + std::to_string(bs);
  STATUS_ASSERT(PrefillAttentionTiled(dq.bf16(), dcu.get(), dsp.get(), num_seqs, c.total, dt.get(),
                                      f.max_blocks, heads, scale, kv, out.bf16(), nullptr));
  const auto tiled = out.Download();
  EXPECT_CLOSE(FromBf16(tiled), want, kTolBf16, what.c_str());
  // 128-row tiles (8 warps) on a fresh poisoned buffer.
  DeviceBuffer<uint16_t> out128(q.size());
  STATUS_ASSERT(PrefillAttentionTiled(dq.bf16(), dcu.get(), dsp.get(), num_seqs, c.total, dt.get(),
                                      f.max_blocks, heads, scale, kv, out128.bf16(), nullptr, 128));
  EXPECT_CLOSE(FromBf16(out128.Download()), want, kTolBf16, (what + " rows=128").c_str());
  // The public entry point takes the tiled path for bf16 at these head dims: the same bits.
  CUDA_ASSERT(cudaMemset(out.get(), 0xFF, out.size() * sizeof(uint16_t)));  // poison again
  STATUS_ASSERT(PrefillAttention(dq.bf16(), dcu.get(), dsp.get(), num_seqs, c.total, dt.get(), f.max_blocks,
                                 heads, scale, kv, out.bf16(), nullptr));
  EXPECT_EQ(out.Download(), tiled) << what << ": PrefillAttention did not dispatch to the tiled kernel";
  CUDA_ASSERT(cudaGetLastError());
}
INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillTiled,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(1, 4, 8),
                                            ::testing::Values(16, 32)));

// The tiled kernel and the warp-per-(token, head) kernel agree (bf16 outputs of both), here with block size
// 8 and a long single sequence after a cached prefix, plus a short one.
TEST(CudaPrefillTiledVsWarp, KernelsAgree) {
  SKIP_WITHOUT_GPU();
  for (int hd : {64, 128}) {
    const int heads = 8, kvh = 2, bs = 8;
    const std::vector<int> start = {45, 3}, chunk = {777, 2};
    std::vector<int> lens;
    std::vector<int32_t> cu = {0};
    for (int s = 0; s < 2; ++s) lens.push_back(start[s] + chunk[s]), cu.push_back(cu.back() + chunk[s]);
    const int total = cu.back();
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    PagedFixture f(lens, bs, kvh, hd, true, 500 + hd);
    const auto q = RoundBf16(RandomFloats(static_cast<size_t>(total) * heads * hd, 501 + hd, -2.f, 2.f));
    DeviceBuffer<int32_t> dt(f.tables), dcu(cu), dsp(std::vector<int32_t>(start.begin(), start.end()));
    DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(f.k)), dv(ToBf16(f.v)), out_t(q.size()), out_w(q.size());
    const auto kv = Gpu<__nv_bfloat16>(f, dk.bf16(), dv.bf16());
    STATUS_ASSERT(PrefillAttentionTiled(dq.bf16(), dcu.get(), dsp.get(), 2, total, dt.get(), f.max_blocks,
                                        heads, scale, kv, out_t.bf16(), nullptr));
    STATUS_ASSERT(PrefillAttentionWarp(dq.bf16(), dcu.get(), dsp.get(), 2, total, dt.get(), f.max_blocks,
                                       heads, scale, kv, out_w.bf16(), nullptr));
    const auto warp = FromBf16(out_w.Download());
    EXPECT_CLOSE(FromBf16(out_t.Download()), warp, kTolBf16,
                 ("tiled vs warp hd=" + std::to_string(hd)).c_str());
    CUDA_ASSERT(cudaMemset(out_t.get(), 0xFF, out_t.size() * sizeof(uint16_t)));  // poison again
    STATUS_ASSERT(PrefillAttentionTiled(dq.bf16(), dcu.get(), dsp.get(), 2, total, dt.get(), f.max_blocks,
                                        heads, scale, kv, out_t.bf16(), nullptr, 128));
    EXPECT_CLOSE(FromBf16(out_t.Download()), warp, kTolBf16,
                 ("tiled rows=128 vs warp hd=" + std::to_string(hd)).c_str());
  }
}

TEST(CudaPrefillTiled, RejectsUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<uint16_t> buf(64);
  DevicePagedKv<__nv_bfloat16> kv{buf.bf16(), buf.bf16(), 1, 16, 1, 256};
  EXPECT_EQ(
      PrefillAttentionTiled(buf.bf16(), nullptr, nullptr, 1, 1, nullptr, 1, 1, 1.f, kv, buf.bf16(), nullptr)
          .code(),
      StatusCode::kInvalidArgument);
  kv.head_dim = 128;
  EXPECT_EQ(PrefillAttentionTiled(buf.bf16() + 1, nullptr, nullptr, 1, 1, nullptr, 1, 1, 1.f, kv, buf.bf16(),
                                  nullptr)
                .code(),
            StatusCode::kInvalidArgument);  // misaligned q
  EXPECT_EQ(PrefillAttentionTiled(buf.bf16(), nullptr, nullptr, 1, 1, nullptr, 1, 1, 1.f, kv, buf.bf16(),
                                  nullptr, 96)
                .code(),
            StatusCode::kInvalidArgument);  // tile rows
  EXPECT_FALSE(PrefillAttentionTiledSupports(96));
  EXPECT_TRUE(PrefillAttentionTiledSupports(128));
}

TEST(CudaRope, RopeWriteKvMatchesCpuRopeThenWriteKv) {
  SKIP_WITHOUT_GPU();
  const int hd = 128, heads = 8, kvh = 2, bs = 16, num_blocks = 8, tokens = 21;
  std::vector<int32_t> pos(tokens), slots(tokens);
  for (int t = 0; t < tokens; ++t) pos[t] = 3 + 97 * t, slots[t] = (t * 5) % (num_blocks * bs);
  slots[4] = -1;  // padding: rotated q, no cache write
  const auto inv = InvFreq(hd, 500000.f);
  const size_t cache_n = static_cast<size_t>(num_blocks) * bs * kvh * hd;
  for (bool bf16 : {false, true}) {
    auto q = RandomFloats(tokens * heads * hd, 30), k = RandomFloats(tokens * kvh * hd, 31),
         v = RandomFloats(tokens * kvh * hd, 32);
    if (bf16) q = RoundBf16(q), k = RoundBf16(k), v = RoundBf16(v);
    std::vector<float> wq = q, wk = k;
    cpu::RopeNeox(wq.data(), pos.data(), tokens, heads, hd, inv.data());
    cpu::RopeNeox(wk.data(), pos.data(), tokens, kvh, hd, inv.data());
    std::vector<float> ck(cache_n, 0.f), cv(cache_n, 0.f);
    cpu::PagedKvLayer kvc{ck.data(), cv.data(), num_blocks, bs, kvh, hd};
    cpu::WriteKv(kvc, wk.data(), v.data(), slots.data(), tokens);
    DeviceBuffer<int32_t> dpos(pos), dslots(slots);
    DeviceBuffer<float> dinv(inv);
    if (!bf16) {
      DeviceBuffer<float> dq(q), dk(k), dv(v), kc(std::vector<float>(cache_n, 0.f)),
          vc(std::vector<float>(cache_n, 0.f));
      STATUS_ASSERT(RopeWriteKv(dq.get(), dk.get(), dv.get(), dpos.get(), dslots.get(), tokens, heads,
                                dinv.get(), DevicePagedKv<float>{kc.get(), vc.get(), num_blocks, bs, kvh, hd},
                                nullptr));
      EXPECT_CLOSE(dq.Download(), wq, kTolF32, "rope q f32");
      EXPECT_CLOSE(kc.Download(), ck, kTolF32, "rope k cache f32");
      EXPECT_CLOSE(vc.Download(), cv, 1e-12, "v cache f32");
    } else {
      const std::vector<uint16_t> zeros(cache_n, 0);
      DeviceBuffer<uint16_t> dq(ToBf16(q)), dk(ToBf16(k)), dv(ToBf16(v)), kc(zeros), vc(zeros);
      STATUS_ASSERT(
          RopeWriteKv(dq.bf16(), dk.bf16(), dv.bf16(), dpos.get(), dslots.get(), tokens, heads, dinv.get(),
                      DevicePagedKv<__nv_bfloat16>{kc.bf16(), vc.bf16(), num_blocks, bs, kvh, hd}, nullptr));
      EXPECT_CLOSE(FromBf16(dq.Download()), wq, kTolBf16, "rope q bf16");
      EXPECT_CLOSE(FromBf16(kc.Download()), ck, kTolBf16, "rope k cache bf16");
      EXPECT_CLOSE(FromBf16(vc.Download()), cv, 1e-12, "v cache bf16");
    }
  }
}

// The fused split + RoPE + cache write gives exactly what SplitQkv then RopeWriteKv give (q, k cache, v
// cache), with and without the Qwen2 bias, and a padding token (slot -1) that must not write the cache.
TEST(CudaRope, FusedQkvRopeWriteKvIsBitIdenticalToSplitThenRope) {
  SKIP_WITHOUT_GPU();
  const int hd = 128, heads = 8, kvh = 2, bs = 16, num_blocks = 8, tokens = 13;
  const int qd = heads * hd, kvd = kvh * hd, width = qd + 2 * kvd;
  std::vector<int32_t> pos(tokens), slots(tokens);
  for (int t = 0; t < tokens; ++t) pos[t] = 7 + 131 * t, slots[t] = (t * 9) % (num_blocks * bs);
  slots[5] = -1;
  const auto inv = InvFreq(hd, 500000.f);
  const size_t cache_n = static_cast<size_t>(num_blocks) * bs * kvh * hd;
  const std::vector<uint16_t> zeros(cache_n, 0);
  DeviceBuffer<uint16_t> qkv(ToBf16(RandomFloats(static_cast<size_t>(tokens) * width, 40, -3.f, 3.f)));
  DeviceBuffer<float> bias(RandomFloats(width, 41)), dinv(inv);
  DeviceBuffer<int32_t> dpos(pos), dslots(slots);
  for (bool with_bias : {false, true}) {
    const float* b = with_bias ? bias.get() : nullptr;
    DeviceBuffer<uint16_t> q1(tokens * qd), k1(tokens * kvd), v1(tokens * kvd), kc1(zeros), vc1(zeros);
    STATUS_ASSERT(SplitQkv(qkv.bf16(), b, tokens, qd, kvd, q1.bf16(), k1.bf16(), v1.bf16(), nullptr));
    STATUS_ASSERT(
        RopeWriteKv(q1.bf16(), k1.bf16(), v1.bf16(), dpos.get(), dslots.get(), tokens, heads, dinv.get(),
                    DevicePagedKv<__nv_bfloat16>{kc1.bf16(), vc1.bf16(), num_blocks, bs, kvh, hd}, nullptr));
    DeviceBuffer<uint16_t> q2(tokens * qd), kc2(zeros), vc2(zeros);
    STATUS_ASSERT(QkvRopeWriteKv(
        qkv.bf16(), b, dpos.get(), dslots.get(), tokens, heads, dinv.get(),
        DevicePagedKv<__nv_bfloat16>{kc2.bf16(), vc2.bf16(), num_blocks, bs, kvh, hd}, q2.bf16(), nullptr));
    const char* what = with_bias ? "with bias" : "without bias";
    EXPECT_EQ(q1.Download(), q2.Download()) << "rotated q differs, " << what;
    EXPECT_EQ(kc1.Download(), kc2.Download()) << "k cache differs, " << what;
    EXPECT_EQ(vc1.Download(), vc2.Download()) << "v cache differs, " << what;
    // One warp per head (--vector-elementwise): the same bytes again.
    DeviceBuffer<uint16_t> q3(tokens * qd), kc3(zeros), vc3(zeros);
    STATUS_ASSERT(QkvRopeWriteKv(
        qkv.bf16(), b, dpos.get(), dslots.get(), tokens, heads, dinv.get(),
        DevicePagedKv<__nv_bfloat16>{kc3.bf16(), vc3.bf16(), num_blocks, bs, kvh, hd}, q3.bf16(), nullptr,
        /*warp_heads=*/true));
    EXPECT_EQ(q3.Download(), q2.Download()) << "warp per head: q, " << what;
    EXPECT_EQ(kc3.Download(), kc2.Download()) << "warp per head: k cache, " << what;
    EXPECT_EQ(vc3.Download(), vc2.Download()) << "warp per head: v cache, " << what;
    size_t written = 0;
    for (uint16_t x : vc2.Download()) written += x != 0;
    EXPECT_EQ(written, static_cast<size_t>(tokens - 1) * kvd) << "the slot -1 token wrote the cache?";
  }
}

int32_t HostArgmax(const float* x, int n) {
  int32_t best = -1;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

TEST(CudaSampling, ArgmaxMatchesHostWithTiesAndNaN) {
  SKIP_WITHOUT_GPU();
  const int rows = 6, vocab = 49152;
  auto logits = RandomFloats(static_cast<size_t>(rows) * vocab, 40, -10.f, 10.f);
  logits[1 * vocab + 777] = 50.f, logits[1 * vocab + 30000] = 50.f;  // tie: the lower id wins
  logits[2 * vocab + 5] = NAN, logits[2 * vocab + 6] = 99.f;
  for (int i = 0; i < vocab; ++i) logits[3 * vocab + i] = NAN;  // all NaN: 0
  std::vector<int32_t> want(rows);
  for (int r = 0; r < rows; ++r) want[r] = HostArgmax(logits.data() + r * vocab, vocab);
  EXPECT_EQ(want[1], 777);
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<int32_t> out(rows);
  STATUS_ASSERT(ArgmaxRows(dl.get(), rows, vocab, out.get(), nullptr));
  EXPECT_EQ(out.Download(), want);
}

// Rows that start off a 16-byte boundary (odd vocab): the maximum in a row's scalar head, in its float4 body,
// in its scalar tail, and a tie between the head and the body (the lower id wins), through ArgmaxRows and
// through SampleRows' greedy path.
TEST(CudaSampling, ArgmaxOnUnalignedRowsHeadsBodiesAndTails) {
  SKIP_WITHOUT_GPU();
  const int rows = 8, vocab = 1027;
  auto logits = RandomFloats(static_cast<size_t>(rows) * vocab, 41, -10.f, 10.f);
  logits[1 * vocab + 0] = 60.f;                                  // row 1 starts 4 bytes past a boundary: head
  logits[2 * vocab + vocab - 1] = 60.f;                          // the last element: a tail
  logits[3 * vocab + 1] = 60.f, logits[3 * vocab + 500] = 60.f;  // a tie, head vs body: 1
  logits[5 * vocab + 2] = NAN, logits[5 * vocab + 3] = 70.f;
  std::vector<int32_t> want(rows);
  for (int r = 0; r < rows; ++r) want[r] = HostArgmax(logits.data() + r * vocab, vocab);
  EXPECT_EQ(want[3], 1);
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<int32_t> out(rows);
  STATUS_ASSERT(ArgmaxRows(dl.get(), rows, vocab, out.get(), nullptr));
  EXPECT_EQ(out.Download(), want);
  std::vector<RowSampling> greedy(rows);  // temperature 0
  DeviceBuffer<RowSampling> dp(greedy);
  STATUS_ASSERT(SampleRows(dl.get(), rows, vocab, dp.get(), out.get(), nullptr));
  EXPECT_EQ(out.Download(), want);
}

// Many draws of one row: every draw lies in the top-k / top-p set and the frequencies follow the renormalised
// softmax (within 5 sigma); greedy settings give the argmax; the same (seed, step) gives the same token.
TEST(CudaSampling, SamplerFollowsTopKTopPDistribution) {
  SKIP_WITHOUT_GPU();
  const int vocab = 10, draws = 20000;
  const std::vector<float> row = {1.0f, 2.5f, 0.3f, 2.5f, -1.f, 1.7f, NAN, 0.9f, 2.0f, -3.f};
  const float temp = 0.8f, top_p = 0.8f;
  const int top_k = 5;
  // Reference: best first (ties lower id), keep 5, then the smallest prefix with mass >= 0.8 of them.
  std::vector<int> order;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(row[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  order.resize(top_k);
  double z = 0;
  for (int i : order) z += std::exp((row[i] - 2.5) / temp);
  std::vector<int> kept;
  double mass = 0;
  for (int i : order) {
    kept.push_back(i);
    mass += std::exp((row[i] - 2.5) / temp);
    if (mass >= top_p * z) break;
  }
  std::map<int, double> p;
  for (int i : kept) p[i] = std::exp((row[i] - 2.5) / temp) / mass;

  std::vector<float> logits;
  std::vector<RowSampling> params(draws);
  for (int d = 0; d < draws; ++d) {
    logits.insert(logits.end(), row.begin(), row.end());
    params[d] = RowSampling{temp, top_k, top_p, 1234, static_cast<uint64_t>(d)};
  }
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<RowSampling> dp(params);
  DeviceBuffer<int32_t> out(draws);
  STATUS_ASSERT(SampleRows(dl.get(), draws, vocab, dp.get(), out.get(), nullptr));
  const auto got = out.Download();
  std::map<int, int> count;
  for (int32_t id : got) ++count[id];
  for (const auto& [id, c] : count) {
    std::printf("  [sampler] id %d: %d draws (expected %.1f)\n", id, c, p.count(id) ? p[id] * draws : 0.0);
    EXPECT_TRUE(p.count(id)) << "id " << id << " is outside the top-k/top-p set";
  }
  for (const auto& [id, prob] : p) {
    const double mean = prob * draws, sigma = std::sqrt(draws * prob * (1 - prob));
    EXPECT_NEAR(count[id], mean, 5 * sigma + 1) << "id " << id;
  }
  // Determinism: the same rows again give the same tokens.
  DeviceBuffer<int32_t> out2(draws);
  STATUS_ASSERT(SampleRows(dl.get(), draws, vocab, dp.get(), out2.get(), nullptr));
  EXPECT_EQ(out2.Download(), got);
  // Greedy settings: argmax (ties to the lower id: 1).
  for (auto& q : params) q.temperature = 0.f;
  dp.Upload(params);
  STATUS_ASSERT(SampleRows(dl.get(), 4, vocab, dp.get(), out.get(), nullptr));
  const auto greedy = out.Download();
  for (int d = 0; d < 4; ++d) EXPECT_EQ(greedy[d], 1);
}

// A realistic vocabulary with bf16-like ties: top-k = 40 never leaves the 40 best.
TEST(CudaSampling, TopKOnLargeVocabStaysInTopK) {
  SKIP_WITHOUT_GPU();
  const int vocab = 128256, rows = 64, k = 40;
  auto logits = RoundBf16(RandomFloats(static_cast<size_t>(rows) * vocab, 50, -8.f, 8.f));
  std::vector<RowSampling> params(rows);
  for (int r = 0; r < rows; ++r) params[r] = RowSampling{1.5f, k, 1.f, 99, static_cast<uint64_t>(r)};
  DeviceBuffer<float> dl(logits);
  DeviceBuffer<RowSampling> dp(params);
  DeviceBuffer<int32_t> out(rows);
  STATUS_ASSERT(SampleRows(dl.get(), rows, vocab, dp.get(), out.get(), nullptr));
  const auto got = out.Download();
  for (int r = 0; r < rows; ++r) {
    const float* x = logits.data() + static_cast<size_t>(r) * vocab;
    ASSERT_GE(got[r], 0);
    ASSERT_LT(got[r], vocab);
    int better = 0;  // ids strictly ahead in best-first order
    for (int i = 0; i < vocab; ++i) better += x[i] > x[got[r]] || (x[i] == x[got[r]] && i < got[r]);
    EXPECT_LT(better, k) << "row " << r << " sampled id " << got[r];
  }
}

}  // namespace
}  // namespace stoke::cuda
