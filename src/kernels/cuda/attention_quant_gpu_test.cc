// The 8-bit KV cache on the GPU (int8, fp8 E4M3): the quantising cache write against the CPU reference
// quantiser applied to the bf16 write's rows, and decode / prefill attention against cpu::PagedAttention over
// the same quantised cache and against the bf16 kernels over the unquantised one. Skipped without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "base/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gpu_test_util.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::kTolBf16;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

std::string Name(KvCacheDtype d) {
  return std::string(KvCacheDtypeName(d));
}

// Shuffled physical blocks, one table row per sequence; K/V random (bf16-exact) for every slot, held as fp32
// and as the CPU reference quantiser's bytes and scales.
struct QuantFixture {
  int bs = 16, kvh = 2, hd = 64, num_blocks = 0, max_blocks = 0;
  KvCacheDtype dtype;
  std::vector<int> lens;
  std::vector<int32_t> tables;
  std::vector<float> k, v;              // [num_blocks, bs, kvh, hd]
  std::vector<uint8_t> kq, vq;          // the same, quantised
  std::vector<float> k_scale, v_scale;  // [num_blocks, bs, kvh]

  QuantFixture(std::vector<int> seq_lens, int kv_heads, int head_dim, KvCacheDtype d, uint32_t seed,
               int block_size = 16)
      : bs(block_size), kvh(kv_heads), hd(head_dim), dtype(d), lens(std::move(seq_lens)) {
    for (int l : lens) max_blocks = std::max(max_blocks, (l + bs - 1) / bs);
    num_blocks = max_blocks * static_cast<int>(lens.size()) + 3;
    std::vector<int32_t> phys(num_blocks);
    std::iota(phys.begin(), phys.end(), 0);
    std::shuffle(phys.begin(), phys.end(), std::mt19937(seed));
    tables.assign(lens.size() * max_blocks, 0);
    for (size_t s = 0, next = 0; s < lens.size(); ++s) {
      for (int b = 0; b < (lens[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = phys[next++];
    }
    const size_t rows = static_cast<size_t>(num_blocks) * bs * kvh, n = rows * hd;
    k = RoundBf16(RandomFloats(n, seed + 1, -2.f, 2.f));
    v = RoundBf16(RandomFloats(n, seed + 2, -2.f, 2.f));
    kq.resize(n);
    vq.resize(n);
    k_scale.resize(rows);
    v_scale.resize(rows);
    for (size_t r = 0; r < rows; ++r) {
      k_scale[r] = cpu::QuantizeKvRow(k.data() + r * hd, hd, dtype, kq.data() + r * hd);
      v_scale[r] = cpu::QuantizeKvRow(v.data() + r * hd, hd, dtype, vq.data() + r * hd);
    }
  }
  cpu::QuantPagedKvLayer CpuQuant() {
    return {dtype, kq.data(), vq.data(), k_scale.data(), v_scale.data(), num_blocks, bs, kvh, hd};
  }
  cpu::PagedKvLayer CpuFp32() { return {k.data(), v.data(), num_blocks, bs, kvh, hd}; }
};

// Device copies of a fixture's quantised cache.
struct DeviceQuant {
  DeviceBuffer<uint8_t> k, v;
  DeviceBuffer<float> ks, vs;
  explicit DeviceQuant(const QuantFixture& f) : k(f.kq), v(f.vq), ks(f.k_scale), vs(f.v_scale) {}
  DevicePagedKvQuant Kv(const QuantFixture& f) const {
    return {k.get(), v.get(), ks.get(), vs.get(), f.dtype, f.num_blocks, f.bs, f.kvh, f.hd};
  }
};

struct DecodeCase {
  KvCacheDtype dtype;
  int head_dim;
  int heads;
  int kv_heads;
};

class CudaQuantDecode : public ::testing::TestWithParam<DecodeCase> {};

// Contexts of 1, 17, 513, 1500 and 4100 positions (one split and many); GQA groups of 4, 3, 16 and 7; the
// tensor-core kernel in both forms (the default: each warp's codes straight into fp16 fragments; tiled-smem:
// codes widened to bf16 in shared memory, scales on S and P) and the warp kernel (K/V dequantised in
// registers), with and without its load pipelining.
TEST_P(CudaQuantDecode, MatchesCpuReferenceAndBf16Kernel) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c = GetParam();
  const std::vector<int> lens = {1, 17, 513, 1500, 4100};
  const int num_seqs = static_cast<int>(lens.size()), max_ctx = 4100;
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  QuantFixture f(lens, c.kv_heads, c.head_dim, c.dtype, 300 + c.head_dim + c.heads);
  const auto q = RoundBf16(RandomFloats(static_cast<size_t>(num_seqs) * c.heads * c.head_dim, 77, -2.f, 2.f));
  const int64_t row = int64_t{c.heads} * c.head_dim;
  std::vector<float> want_quant(q.size()), want_fp(q.size());
  auto cq = f.CpuQuant();
  auto cf = f.CpuFp32();
  for (int s = 0; s < num_seqs; ++s) {
    cpu::PagedAttention(q.data() + s * row, 1, c.heads, lens[s] - 1, f.tables.data() + s * f.max_blocks, cq,
                        scale, want_quant.data() + s * row, ThreadPool::Default());
    cpu::PagedAttention(q.data() + s * row, 1, c.heads, lens[s] - 1, f.tables.data() + s * f.max_blocks, cf,
                        scale, want_fp.data() + s * row, ThreadPool::Default());
  }
  DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
  DeviceBuffer<uint16_t> dq(ToBf16(q)), out(q.size()), out_bf16(q.size());
  DeviceQuant dk(f);
  std::vector<float> tiled_out, frag_out;
  // tiled-smem (codes widened in shared memory), warp, warp without pipelining, tiled (the fragment form, the
  // default), and the fragment form with 3 and 4 cp.async stages (decode_stages): the same values bit for bit
  for (int variant = 0; variant < 6; ++variant) {
    AttentionLaunchOptions launch;
    launch.decode_tiled = variant == 0 || variant >= 3;
    launch.decode_tiled_fragments = variant >= 3;
    launch.decode_pipeline = variant != 2;
    launch.decode_stages = variant == 4 ? 3 : variant == 5 ? 4 : 2;
    DeviceBuffer<uint8_t> ws(
        std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, c.heads, c.head_dim, max_ctx, launch)));
    STATUS_ASSERT(PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, c.heads,
                                       max_ctx, scale, dk.Kv(f), ws.get(), out.bf16(), nullptr, launch));
    const std::string what =
        "decode " + Name(c.dtype) + " hd=" + std::to_string(c.head_dim) +
        " heads=" + std::to_string(c.heads) +
        (variant == 0   ? " tiled-smem"
         : variant == 1 ? " warp"
         : variant == 2 ? " warp no-pipeline"
                        : " tiled (fragments, " + std::to_string(launch.decode_stages) + " stages)");
    const auto got = FromBf16(out.Download());
    EXPECT_CLOSE(got, want_quant, kTolBf16, (what + " vs cpu quant").c_str());
    if (variant == 0) tiled_out = got;
    if (variant == 1) {
      EXPECT_NE(got, tiled_out) << "decode_tiled did not switch kernels";
    }
    if (variant == 3) {
      EXPECT_NE(got, tiled_out) << "decode_tiled_fragments did not switch kernels";
      frag_out = got;
    }
    if (variant >= 4) {
      EXPECT_EQ(got, frag_out) << what << ": the pipeline depth changed the values";
    }
  }
  {  // Stages outside 2..4 are refused, not run.
    AttentionLaunchOptions launch;
    launch.decode_stages = 5;
    DeviceBuffer<uint8_t> ws(
        std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, c.heads, c.head_dim, max_ctx, launch)));
    const Status st = PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, c.heads,
                                           max_ctx, scale, dk.Kv(f), ws.get(), out.bf16(), nullptr, launch);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  }
  DeviceBuffer<uint8_t> ws(std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, c.heads, c.head_dim, max_ctx)));
  // Against the bf16 kernel over the unquantised cache: the quantisation error itself.
  DeviceBuffer<uint16_t> bk(ToBf16(f.k)), bv(ToBf16(f.v));
  STATUS_ASSERT(PagedDecodeAttention(
      dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, c.heads, max_ctx, scale,
      DevicePagedKv<__nv_bfloat16>{bk.bf16(), bv.bf16(), f.num_blocks, f.bs, f.kvh, f.hd}, ws.get(),
      out_bf16.bf16(), nullptr));
  const double tol = c.dtype == KvCacheDtype::kFp8 ? 0.08 : 0.03;
  EXPECT_CLOSE(FromBf16(out.Download()), FromBf16(out_bf16.Download()), tol,
               ("decode " + Name(c.dtype) + " vs bf16 kernel").c_str());
  EXPECT_CLOSE(want_quant, want_fp, tol, ("cpu " + Name(c.dtype) + " vs cpu fp32").c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaQuantDecode,
    ::testing::Values(DecodeCase{KvCacheDtype::kInt8, 64, 8, 2}, DecodeCase{KvCacheDtype::kInt8, 128, 8, 2},
                      DecodeCase{KvCacheDtype::kInt8, 64, 9, 3}, DecodeCase{KvCacheDtype::kFp8, 64, 8, 2},
                      DecodeCase{KvCacheDtype::kFp8, 128, 32, 8}, DecodeCase{KvCacheDtype::kFp8, 64, 9, 3},
                      DecodeCase{KvCacheDtype::kFp8, 128, 32, 2}, DecodeCase{KvCacheDtype::kInt8, 128, 14, 2}),
    [](const auto& info) {
      return Name(info.param.dtype) + "_hd" + std::to_string(info.param.head_dim) + "_h" +
             std::to_string(info.param.heads) + "_kv" + std::to_string(info.param.kv_heads);
    });

// The fragment kernel (the default) on the 8B attention shape (32 heads, 8 kv heads, head_dim 128) with block
// sizes 16 (slots by shift) and 5 (by division), decode_partition 2048 (the default: one split up to context
// 2048) and 512, and peaked scores (q in [-8, 8]) so that the lazily kept running max has to move in some
// tiles and not in others.
TEST(CudaQuantDecodeFragments, BlockSizesPartitionsAndMovingMax) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> lens = {1, 64, 65, 700, 2000};
  const int num_seqs = static_cast<int>(lens.size()), max_ctx = 2000, heads = 32, kvh = 8, hd = 128;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (const KvCacheDtype dtype : {KvCacheDtype::kFp8, KvCacheDtype::kInt8}) {
    for (const int bs : {16, 5}) {
      QuantFixture f(lens, kvh, hd, dtype, 900 + bs, bs);
      const auto q = RoundBf16(RandomFloats(static_cast<size_t>(num_seqs) * heads * hd, 91, -8.f, 8.f));
      const int64_t row = int64_t{heads} * hd;
      std::vector<float> want(q.size());
      auto cq = f.CpuQuant();
      for (int s = 0; s < num_seqs; ++s) {
        cpu::PagedAttention(q.data() + s * row, 1, heads, lens[s] - 1, f.tables.data() + s * f.max_blocks, cq,
                            scale, want.data() + s * row, ThreadPool::Default());
      }
      DeviceBuffer<int32_t> dt(f.tables), dl(std::vector<int32_t>(lens.begin(), lens.end()));
      DeviceBuffer<uint16_t> dq(ToBf16(q)), out(q.size());
      DeviceQuant dk(f);
      for (const int partition : {kDecodePartition, 512}) {
        AttentionLaunchOptions launch;
        launch.decode_partition = partition;
        DeviceBuffer<uint8_t> ws(
            std::max<size_t>(1, DecodeWorkspaceBytes(num_seqs, heads, hd, max_ctx, launch)));
        STATUS_ASSERT(PagedDecodeAttention(dq.bf16(), dt.get(), f.max_blocks, dl.get(), num_seqs, heads,
                                           max_ctx, scale, dk.Kv(f), ws.get(), out.bf16(), nullptr, launch));
        EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16,
                     ("fragments " + Name(dtype) + " bs=" + std::to_string(bs) +
                      " partition=" + std::to_string(partition))
                         .c_str());
      }
    }
  }
}

class CudaQuantPrefill : public ::testing::TestWithParam<KvCacheDtype> {};

// Two sequences: a 70-token chunk after a 40-token cached prefix, and a fresh 33-token prompt; head_dim 128
// and 64, through the tiled tensor-core kernel (PrefillAttention's default, and PrefillAttentionTiled with
// 128-row tiles) and the warp kernel (launch.prefill_force_warp).
TEST_P(CudaQuantPrefill, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  for (const int hd : {128, 64}) {
    const int heads = 8, kvh = 2;
    const std::vector<int> starts = {40, 0}, chunk = {70, 33};
    QuantFixture f({110, 33}, kvh, hd, GetParam(), 500 + hd);
    const int64_t total = 103, row = int64_t{heads} * hd;
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    const auto q = RoundBf16(RandomFloats(total * row, 91, -2.f, 2.f));
    std::vector<float> want(q.size());
    auto cq = f.CpuQuant();
    int64_t off = 0;
    for (int s = 0; s < 2; ++s) {
      cpu::PagedAttention(q.data() + off * row, chunk[s], heads, starts[s],
                          f.tables.data() + s * f.max_blocks, cq, scale, want.data() + off * row,
                          ThreadPool::Default());
      off += chunk[s];
    }
    DeviceBuffer<int32_t> dt(f.tables), cu(std::vector<int32_t>{0, 70, 103}), sp(std::vector<int32_t>{40, 0});
    DeviceBuffer<uint16_t> dq(ToBf16(q));
    DeviceQuant dk(f);
    for (const char* form : {"tiled", "tiled128", "warp"}) {
      DeviceBuffer<uint16_t> out(q.size());
      const std::string what = "prefill " + Name(GetParam()) + " hd" + std::to_string(hd) + " " + form;
      if (std::string(form) == "tiled128") {
        STATUS_ASSERT(PrefillAttentionTiled(dq.bf16(), cu.get(), sp.get(), 2, total, dt.get(), f.max_blocks,
                                            heads, scale, dk.Kv(f), out.bf16(), nullptr, /*tile_rows=*/128));
      } else {
        AttentionLaunchOptions launch;
        launch.prefill_force_warp = std::string(form) == "warp";
        STATUS_ASSERT(PrefillAttention(dq.bf16(), cu.get(), sp.get(), 2, total, dt.get(), f.max_blocks, heads,
                                       scale, dk.Kv(f), out.bf16(), nullptr, launch));
      }
      EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, what.c_str());
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaQuantPrefill, ::testing::Values(KvCacheDtype::kInt8, KvCacheDtype::kFp8),
                         [](const auto& info) { return Name(info.param); });

class CudaQuantWrite : public ::testing::TestWithParam<KvCacheDtype> {};

// QkvRopeWriteKvQuant = QkvRopeWriteKv (bf16 cache) followed by cpu::QuantizeKvRow on each written row: the
// same q, the same scales, the same bytes (a byte may differ by one code only where x · (qmax / amax) lands
// on a rounding tie differently: counted and bounded), and the slot -1 token writes nothing.
TEST_P(CudaQuantWrite, MatchesCpuQuantiserOnTheBf16Rows) {
  SKIP_WITHOUT_GPU();
  const KvCacheDtype dtype = GetParam();
  const int hd = 128, heads = 8, kvh = 2, bs = 16, num_blocks = 8, tokens = 13;
  const int qd = heads * hd, kvd = kvh * hd, width = qd + 2 * kvd;
  std::vector<int32_t> pos(tokens), slots(tokens);
  for (int t = 0; t < tokens; ++t) pos[t] = 7 + 131 * t, slots[t] = (t * 9) % (num_blocks * bs);
  slots[5] = -1;
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(500000.f, -2.f * i / hd);
  const size_t rows = static_cast<size_t>(num_blocks) * bs * kvh, cache_n = rows * hd;
  DeviceBuffer<uint16_t> qkv(ToBf16(RandomFloats(static_cast<size_t>(tokens) * width, 40, -3.f, 3.f)));
  DeviceBuffer<float> bias(RandomFloats(width, 41)), dinv(inv);
  DeviceBuffer<int32_t> dpos(pos), dslots(slots);
  for (bool with_bias : {false, true}) {
    const float* b = with_bias ? bias.get() : nullptr;
    DeviceBuffer<uint16_t> q1(tokens * qd), kc(std::vector<uint16_t>(cache_n, 0)),
        vc(std::vector<uint16_t>(cache_n, 0));
    STATUS_ASSERT(QkvRopeWriteKv(qkv.bf16(), b, dpos.get(), dslots.get(), tokens, heads, dinv.get(),
                                 DevicePagedKv<__nv_bfloat16>{kc.bf16(), vc.bf16(), num_blocks, bs, kvh, hd},
                                 q1.bf16(), nullptr));
    DeviceBuffer<uint16_t> q2(tokens * qd);
    DeviceBuffer<uint8_t> k8(std::vector<uint8_t>(cache_n, 0)), v8(std::vector<uint8_t>(cache_n, 0));
    DeviceBuffer<float> ks(std::vector<float>(rows, -1.f)), vs(std::vector<float>(rows, -1.f));
    STATUS_ASSERT(QkvRopeWriteKvQuant(
        qkv.bf16(), b, dpos.get(), dslots.get(), tokens, heads, dinv.get(),
        DevicePagedKvQuant{k8.get(), v8.get(), ks.get(), vs.get(), dtype, num_blocks, bs, kvh, hd}, q2.bf16(),
        nullptr));
    EXPECT_EQ(q1.Download(), q2.Download()) << "rotated q differs";
    // One warp per head (--vector-elementwise): the same q, bytes and scales as the block per head.
    {
      DeviceBuffer<uint16_t> q3(tokens * qd);
      DeviceBuffer<uint8_t> k3(std::vector<uint8_t>(cache_n, 0)), v3(std::vector<uint8_t>(cache_n, 0));
      DeviceBuffer<float> ks3(std::vector<float>(rows, -1.f)), vs3(std::vector<float>(rows, -1.f));
      STATUS_ASSERT(QkvRopeWriteKvQuant(
          qkv.bf16(), b, dpos.get(), dslots.get(), tokens, heads, dinv.get(),
          DevicePagedKvQuant{k3.get(), v3.get(), ks3.get(), vs3.get(), dtype, num_blocks, bs, kvh, hd},
          q3.bf16(), nullptr, /*warp_heads=*/true));
      EXPECT_EQ(q3.Download(), q2.Download()) << "warp per head: q";
      EXPECT_EQ(k3.Download(), k8.Download()) << "warp per head: K bytes";
      EXPECT_EQ(v3.Download(), v8.Download()) << "warp per head: V bytes";
      EXPECT_EQ(ks3.Download(), ks.Download()) << "warp per head: K scales";
      EXPECT_EQ(vs3.Download(), vs.Download()) << "warp per head: V scales";
    }
    const std::vector<float> kf = FromBf16(kc.Download()), vf = FromBf16(vc.Download());
    const std::vector<uint8_t> kg = k8.Download(), vg = v8.Download();
    const std::vector<float> ksg = ks.Download(), vsg = vs.Download();
    size_t exact = 0, off_by_one = 0, worse = 0, written_rows = 0;
    std::vector<uint8_t> ref(hd);
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int h = 0; h < kvh; ++h) {
        const size_t r = static_cast<size_t>(slots[t]) * kvh + h;
        ++written_rows;
        for (int which = 0; which < 2; ++which) {
          const float* x = (which == 0 ? kf : vf).data() + r * hd;
          const uint8_t* got = (which == 0 ? kg : vg).data() + r * hd;
          const float s = cpu::QuantizeKvRow(x, hd, dtype, ref.data());
          EXPECT_EQ((which == 0 ? ksg : vsg)[r], s) << "scale of row " << r;
          for (int i = 0; i < hd; ++i) {
            const int d = std::abs(static_cast<int>(got[i]) - static_cast<int>(ref[i]));
            (d == 0 ? exact : d == 1 ? off_by_one : worse) += 1;
          }
        }
      }
    }
    std::printf("  [write %s%s] %zu bytes exact, %zu off by one code, %zu worse\n", Name(dtype).c_str(),
                with_bias ? " bias" : "", exact, off_by_one, worse);
    EXPECT_EQ(worse, 0u);
    EXPECT_LE(off_by_one, exact / 1000);
    size_t untouched = 0;
    for (float x : ksg) untouched += x == -1.f;
    EXPECT_EQ(untouched, rows - written_rows) << "the slot -1 token wrote a scale?";
  }
}
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaQuantWrite, ::testing::Values(KvCacheDtype::kInt8, KvCacheDtype::kFp8),
                         [](const auto& info) { return Name(info.param); });

}  // namespace
}  // namespace stoke::cuda
