// GPU element-wise, normalisation, quantisation and GEMM kernels against the CPU references, on fresh random
// inputs with outputs poisoned (NaN) beforehand. Skipped when no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/decoder_ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/rms_norm.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectGemvMatchesProduct;
using testing::FromBf16;
using testing::kTolBf16;
using testing::kTolF32;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

TEST(CudaEmbedding, MatchesCpuForF32AndBf16Tables) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 1000, dim = 576, n = 33;
  const auto table = RandomFloats(vocab * dim, 1);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919) % vocab);
  std::vector<float> want(n * dim);
  ASSERT_TRUE(cpu::EmbeddingLookup(table.data(), DType::kF32, vocab, dim, ids.data(), n, want.data()).ok());
  DeviceBuffer<float> dt(table), out(n * dim);
  DeviceBuffer<int32_t> did(ids);
  STATUS_ASSERT(EmbeddingGather(dt.get(), vocab, dim, did.get(), n, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), want, 1e-12, "embedding f32");

  const auto tb = ToBf16(table);
  ASSERT_TRUE(cpu::EmbeddingLookup(tb.data(), DType::kBF16, vocab, dim, ids.data(), n, want.data()).ok());
  DeviceBuffer<uint16_t> dtb(tb), outb(n * dim);
  DeviceBuffer<float> out2(n * dim);
  STATUS_ASSERT(EmbeddingGather(dtb.bf16(), vocab, dim, did.get(), n, out2.get(), nullptr));
  EXPECT_CLOSE(out2.Download(), want, 1e-12, "embedding bf16->f32");
  STATUS_ASSERT(EmbeddingGather(dtb.bf16(), vocab, dim, did.get(), n, outb.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(outb.Download()), want, 1e-12, "embedding bf16->bf16");

  // An out-of-range id gives a zero row rather than reading outside the table.
  DeviceBuffer<int32_t> bad(std::vector<int32_t>{-1, static_cast<int32_t>(vocab)});
  DeviceBuffer<float> out3(2 * dim);
  STATUS_ASSERT(EmbeddingGather(dt.get(), vocab, dim, bad.get(), 2, out3.get(), nullptr));
  for (float v : out3.Download()) ASSERT_EQ(v, 0.f);
}

TEST(CudaNorm, RmsNormResidualMatchesAddThenRmsNorm) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 19, dim = 4096;
  const float eps = 1e-5f;
  const auto x = RandomFloats(rows * dim, 2), res = RandomFloats(rows * dim, 3),
             w = RandomFloats(dim, 4, 0.5f, 1.5f);
  std::vector<float> sum(rows * dim), want(rows * dim);
  cpu::Add(x.data(), res.data(), rows * dim, sum.data());
  cpu::RmsNorm(sum.data(), w.data(), rows, dim, eps, want.data());
  DeviceBuffer<float> dx(x), dres(res), dw(w), out(rows * dim);
  STATUS_ASSERT(RmsNormResidual(dx.get(), dres.get(), dw.get(), rows, dim, eps, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), want, kTolF32, "rmsnorm+residual f32 out");
  EXPECT_CLOSE(dres.Download(), sum, kTolF32, "rmsnorm+residual f32 residual");

  // bf16: the reference sees the bf16-rounded inputs and the bf16-rounded sum, as the kernel does.
  const auto xb = RoundBf16(x), rb = RoundBf16(res);
  cpu::Add(xb.data(), rb.data(), rows * dim, sum.data());
  sum = RoundBf16(sum);
  cpu::RmsNorm(sum.data(), w.data(), rows, dim, eps, want.data());
  DeviceBuffer<uint16_t> bx(ToBf16(x)), bres(ToBf16(res)), bout(rows * dim);
  STATUS_ASSERT(RmsNormResidual(bx.bf16(), bres.bf16(), dw.get(), rows, dim, eps, bout.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(bout.Download()), want, kTolBf16, "rmsnorm+residual bf16 out");
  EXPECT_CLOSE(FromBf16(bres.Download()), sum, kTolBf16, "rmsnorm+residual bf16 residual");

  // Plain RMSNorm, fp32 (rms_norm.h) and bf16 (norm.h).
  cpu::RmsNorm(x.data(), w.data(), rows, dim, eps, want.data());
  STATUS_ASSERT(RmsNorm(dx.get(), dw.get(), rows, dim, eps, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), want, kTolF32, "rmsnorm f32");
  STATUS_ASSERT(RmsNorm(bx.bf16(), dw.get(), rows, dim, eps, bout.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(bout.Download()), want, kTolBf16, "rmsnorm bf16");
}

// The decoder's residual add + RMSNorm in every launch form: one row of 1024 threads with 1, 2, 4 or 8 values
// a thread in registers (dims 576, 2048, 4096, 8192), the loop form past that (9000) and for many rows (40
// rows: 256 threads, 3 or 16 values a thread), with and without PDL; residual written back exactly, out
// within bf16 rounding of a host reference; the gathered form leaves the residual alone.
TEST(CudaNorm, AddRmsNormMatchesHostInEveryForm) {
  SKIP_WITHOUT_GPU();
  const float eps = 1e-5f;
  for (const auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 576},
                                 {1, 2048},
                                 {1, 4096},
                                 {2, 8192},
                                 {1, 9000},
                                 {40, 576},
                                 {40, 4096}}) {
    for (bool pdl : {false, true}) {
      const auto res = RandomFloats(rows * dim, 11 + dim), w = RandomFloats(dim, 12, 0.5f, 1.5f);
      const auto delta = RoundBf16(RandomFloats(rows * dim, 13 + dim));
      std::vector<float> sum(rows * dim), want(rows * dim);
      for (int64_t i = 0; i < rows * dim; ++i) sum[i] = res[i] + delta[i];
      cpu::RmsNorm(sum.data(), w.data(), rows, dim, eps, want.data());
      DeviceBuffer<float> dres(res), dw(w);
      DeviceBuffer<uint16_t> ddelta(ToBf16(delta)), out(rows * dim);
      STATUS_ASSERT(
          AddRmsNorm(ddelta.bf16(), dres.get(), dw.get(), rows, dim, eps, out.bf16(), nullptr, pdl));
      const std::string what = std::to_string(rows) + " x " + std::to_string(dim) + (pdl ? " pdl" : "");
      EXPECT_EQ(dres.Download(), sum) << what << ": residual + delta written back";
      EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, ("add+rmsnorm " + what).c_str());
      // Gathered rows (the final norm): the last row, then the first; the residual untouched.
      DeviceBuffer<float> gres(res);
      DeviceBuffer<int32_t> idx(std::vector<int32_t>{static_cast<int32_t>(rows - 1), 0});
      DeviceBuffer<uint16_t> gout(2 * dim);
      STATUS_ASSERT(GatherAddRmsNorm(gres.get(), ddelta.bf16(), idx.get(), 2, dim, dw.get(), eps, gout.bf16(),
                                     nullptr, pdl));
      std::vector<float> gwant(want.begin() + (rows - 1) * dim, want.begin() + rows * dim);
      gwant.insert(gwant.end(), want.begin(), want.begin() + dim);
      EXPECT_CLOSE(FromBf16(gout.Download()), gwant, kTolBf16, ("gather add+rmsnorm " + what).c_str());
      EXPECT_EQ(gres.Download(), res) << what << ": the gathered norm wrote the residual";
    }
  }
}

TEST(CudaNorm, LayerNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 23, dim = 384;
  const float eps = 1e-12f;
  auto x = RandomFloats(rows * dim, 5, 2.f, 4.f);  // a large mean checks the two-pass variance
  const auto g = RandomFloats(dim, 6, 0.5f, 1.5f), b = RandomFloats(dim, 7);
  std::vector<float> want(rows * dim);
  cpu::LayerNorm(x.data(), g.data(), b.data(), rows, dim, eps, want.data());
  DeviceBuffer<float> dx(x), dg(g), db(b), out(rows * dim);
  STATUS_ASSERT(LayerNorm(dx.get(), dg.get(), db.get(), rows, dim, eps, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), want, kTolF32, "layernorm f32");
  const auto xb = RoundBf16(x);
  cpu::LayerNorm(xb.data(), g.data(), b.data(), rows, dim, eps, want.data());
  DeviceBuffer<uint16_t> bx(ToBf16(x)), bout(rows * dim);
  STATUS_ASSERT(LayerNorm(bx.bf16(), dg.get(), db.get(), rows, dim, eps, bout.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(bout.Download()), want, kTolBf16, "layernorm bf16");
}

TEST(CudaActivation, SiluMulAndGeluBiasMatchCpu) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 7, inter = 1536;
  const auto gu = RandomFloats(rows * 2 * inter, 8, -6.f, 6.f);
  std::vector<float> gate(rows * inter), up(rows * inter), want(rows * inter);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < inter; ++c) {
      gate[r * inter + c] = gu[r * 2 * inter + c];
      up[r * inter + c] = gu[r * 2 * inter + inter + c];
    }
  }
  cpu::SiluMul(gate.data(), up.data(), rows * inter, want.data());
  DeviceBuffer<float> dgu(gu), dg(gate), du(up), out(rows * inter), out2(rows * inter);
  STATUS_ASSERT(SiluMulFused(dgu.get(), rows, inter, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), want, kTolF32, "silu*up fused f32");
  STATUS_ASSERT(SiluMul(dg.get(), du.get(), rows * inter, out2.get(), nullptr));
  EXPECT_CLOSE(out2.Download(), want, kTolF32, "silu*up f32");
  const auto gb = RoundBf16(gate), ub = RoundBf16(up);
  cpu::SiluMul(gb.data(), ub.data(), rows * inter, want.data());
  DeviceBuffer<uint16_t> bgu(ToBf16(gu)), bout(rows * inter);
  STATUS_ASSERT(SiluMulFused(bgu.bf16(), rows, inter, bout.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(bout.Download()), want, kTolBf16, "silu*up fused bf16");
  // 8 columns per thread access (--vector-elementwise): the same bits; where inter % 8 != 0 or a row is not
  // 16-byte aligned it falls back to the one-value kernel, the same bits again.
  for (const int64_t w : {int64_t{1536}, int64_t{1531}, int64_t{14336}}) {
    const int64_t r = w == 14336 ? 5 : rows;
    DeviceBuffer<uint16_t> g2(ToBf16(RandomFloats(r * 2 * w + 8, 11, -6.f, 6.f))), one(r * w),
        eight(r * w + 8);
    STATUS_ASSERT(SiluMulFused(g2.bf16(), r, w, one.bf16(), nullptr));
    STATUS_ASSERT(SiluMulFused(g2.bf16(), r, w, eight.bf16(), nullptr, /*vec8=*/true));
    auto a = one.Download(), b = eight.Download();
    b.resize(a.size());
    EXPECT_EQ(a, b) << "vec8 silu*up, inter " << w;
    // Misaligned by one value (2 bytes): the fallback.
    STATUS_ASSERT(SiluMulFused(g2.bf16() + 1, r, w, eight.bf16() + 1, nullptr, /*vec8=*/true));
    STATUS_ASSERT(SiluMulFused(g2.bf16() + 1, r, w, one.bf16(), nullptr));
    a = one.Download();
    b = eight.Download();
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin() + 1)) << "misaligned vec8 silu*up, inter " << w;
  }

  const int64_t dim = 1536;
  auto x = RandomFloats(rows * dim, 9, -4.f, 4.f);
  const auto bias = RandomFloats(dim, 10);
  std::vector<float> ref = x;
  cpu::AddBias(ref.data(), bias.data(), rows, dim);
  cpu::GeluErf(ref.data(), rows * dim);
  DeviceBuffer<float> dx(x), dbias(bias);
  STATUS_ASSERT(GeluBias(dx.get(), dbias.get(), rows, dim, nullptr));
  EXPECT_CLOSE(dx.Download(), ref, kTolF32, "gelu+bias f32");
  ref = RoundBf16(x);
  cpu::AddBias(ref.data(), bias.data(), rows, dim);
  cpu::GeluErf(ref.data(), rows * dim);
  DeviceBuffer<uint16_t> bx(ToBf16(x));
  STATUS_ASSERT(GeluBias(bx.bf16(), dbias.get(), rows, dim, nullptr));
  EXPECT_CLOSE(FromBf16(bx.Download()), ref, kTolBf16, "gelu+bias bf16");
}

// Rows of `t` from fp32 values: ggml's reference quantisers for Q4_1 / Q8_0, the simple K encoders for Q4_K /
// Q6_K.
std::vector<uint8_t> QuantizeRows(DType t, const std::vector<float>& x, int64_t rows, int64_t k) {
  const DTypeInfo& info = GetDTypeInfo(t);
  const size_t row_bytes = static_cast<size_t>(k / info.block_elems) * info.block_bytes;
  std::vector<uint8_t> q(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x.data() + r * k;
    uint8_t* dst = q.data() + r * row_bytes;
    switch (t) {
      case DType::kQ4_1:
        cpu::QuantizeRowQ4_1(src, dst, k);
        break;
      case DType::kQ8_0:
        cpu::QuantizeRowQ8_0(src, dst, k);
        break;
      case DType::kQ4_K:
        cpu::QuantizeRowQ4_KSimple(src, dst, k);
        break;
      default:
        cpu::QuantizeRowQ6_KSimple(src, dst, k);
        break;
    }
  }
  return q;
}

constexpr DType kGemvTypes[] = {DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};

// Random rows quantised on the CPU: the GPU's bf16 must equal bf16(cpu dequant) bit for bit.
TEST(CudaQuant, DequantizeToBf16IsBitExact) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 64 * 1024;
  const auto x = RandomFloats(n, 11, -3.f, 3.f);
  for (DType t : kGemvTypes) {
    const std::vector<uint8_t> q = QuantizeRows(t, x, 1, n);
    std::vector<float> ref(n);
    ASSERT_TRUE(cpu::DequantizeRow(t, q.data(), ref.data(), n).ok());
    const auto want = ToBf16(ref);
    DeviceBuffer<uint8_t> dq(q);
    DeviceBuffer<uint16_t> out(n);
    STATUS_ASSERT(DequantizeToBf16(t, dq.get(), n, out.bf16(), nullptr));
    const auto got = out.Download();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) mismatches += got[i] != want[i];
    const std::string name(DTypeName(t));
    std::printf("  [dequant %s] %lld of %lld values differ\n", name.c_str(),
                static_cast<long long>(mismatches), static_cast<long long>(n));
    EXPECT_EQ(mismatches, 0) << name;
  }
}

// n = 1000 rows (not a multiple of the 8 warps of a CTA), k = 2304: nine K super-blocks per row, so the last
// iteration of a warp's four-super-block stride is partial. The K formats: each rows-per-warp choice, and with
// int8 activations against the CPU engine's integer dot.
TEST(CudaQuant, GemvMatchesDequantisedMatMul) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1000, k = 2304;
  const auto wf = RandomFloats(n * k, 12), x = RandomFloats(k, 13);
  for (DType t : kGemvTypes) {
    const std::string name(DTypeName(t));
    const std::vector<uint8_t> q = QuantizeRows(t, wf, n, k);
    std::vector<float> wd(n * k), want(n);
    ASSERT_TRUE(cpu::DequantizeRow(t, q.data(), wd.data(), n * k).ok());
    ASSERT_TRUE(cpu::MatMul(x.data(), 1, k, wd.data(), DType::kF32, n, want.data()).ok());
    DeviceBuffer<uint8_t> dq(q);
    DeviceBuffer<float> dx(x), y(n);
    const auto xb = RoundBf16(x);
    std::vector<float> want_b(n);
    ASSERT_TRUE(cpu::MatMul(xb.data(), 1, k, wd.data(), DType::kF32, n, want_b.data()).ok());
    DeviceBuffer<uint16_t> bx(ToBf16(x)), by(n);
    // The K formats' rows per warp: each choice, with 1000 rows a partial last warp for 2 and 4.
    const std::vector<int> rows_choices =
        (t == DType::kQ4_K || t == DType::kQ6_K) ? std::vector<int>{0, 1, 2, 4} : std::vector<int>{0};
    for (const int rows : rows_choices) {
      const std::string what = "gemv " + name + " rows_per_warp " + std::to_string(rows);
      const KGemvMath m = KGemvMath::kFp32;  // the dequantised matrix's product (Q4_1 / Q8_0 ignore it)
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, dx.get(), y.get(), nullptr, rows, m));
      EXPECT_CLOSE(y.Download(), want, kTolF32, (what + " f32").c_str());
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, bx.bf16(), by.bf16(), nullptr, rows, m));
      EXPECT_CLOSE(FromBf16(by.Download()), want_b, kTolBf16, (what + " bf16").c_str());
      // bf16 in, fp32 out (the lm_head's logits): the bf16-input reference at fp32 tolerance.
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, bx.bf16(), y.get(), nullptr, rows, m));
      EXPECT_CLOSE(y.Download(), want_b, kTolF32, (what + " bf16 -> f32").c_str());
    }
    if (rows_choices.size() == 1) continue;
    // The defaults (kAuto, rows 0) are exactly the explicit choice KGemvAuto / KGemvRowsPerWarp name.
    {
      const KGemvMath m = KGemvAuto(t, n);
      DeviceBuffer<uint16_t> by2(n);
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, bx.bf16(), by.bf16(), nullptr));
      STATUS_ASSERT(
          QuantGemv(t, dq.get(), n, k, bx.bf16(), by2.bf16(), nullptr, KGemvRowsPerWarp(t, n, m), m));
      EXPECT_EQ(by.Download(), by2.Download()) << name << ": auto is not its named choice";
    }
    // Int8 activations: the CPU engine's integer dot over the same blocks (cpu::MatMul quantises x the same
    // way) is the reference, at fp32 tolerance; the dequantised product above is ~1e-3 away.
    std::vector<float> want_q(n), want_qb(n);
    ASSERT_TRUE(cpu::MatMul(x.data(), 1, k, q.data(), t, n, want_q.data()).ok());
    ASSERT_TRUE(cpu::MatMul(xb.data(), 1, k, q.data(), t, n, want_qb.data()).ok());
    for (const int rows : rows_choices) {
      const std::string what = "gemv " + name + " int8 activations, rows_per_warp " + std::to_string(rows);
      const KGemvMath m = KGemvMath::kInt8Activations;
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, dx.get(), y.get(), nullptr, rows, m));
      EXPECT_CLOSE(y.Download(), want_q, kTolF32, (what + " f32").c_str());
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, bx.bf16(), by.bf16(), nullptr, rows, m));
      EXPECT_CLOSE(FromBf16(by.Download()), want_qb, kTolBf16, (what + " bf16").c_str());
      STATUS_ASSERT(QuantGemv(t, dq.get(), n, k, bx.bf16(), y.get(), nullptr, rows, m));
      EXPECT_CLOSE(y.Download(), want_qb, kTolF32, (what + " bf16 -> f32").c_str());
    }
  }
  DeviceBuffer<uint8_t> dummy(std::vector<uint8_t>(144));
  DeviceBuffer<float> dx(x), y(n);
  EXPECT_FALSE(QuantGemv(DType::kQ4_K, dummy.get(), 1, 128, dx.get(), y.get(), nullptr).ok())
      << "k % 256 != 0 must be refused for the K formats";
  EXPECT_FALSE(QuantGemv(DType::kQ4_K, dummy.get(), 1, 256, dx.get(), y.get(), nullptr, 3).ok())
      << "rows_per_warp 3 must be refused";
}

// SwiGLU straight from K-quant blocks: bit for bit QuantGemv of gate and up (bf16 out) followed by SiluMul,
// for each rows-per-warp choice and both maths, and near silu(g)·u of the CPU's dequantised products.
TEST(CudaQuant, GemvSiluMulIsTheTwoGemvsThenSiluMul) {
  SKIP_WITHOUT_GPU();
  const int64_t inter = 1000, k = 2304;
  const auto gf = RandomFloats(inter * k, 21), uf = RandomFloats(inter * k, 22), x = RandomFloats(k, 23);
  const auto xb = RoundBf16(x);
  for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
    const std::string name(DTypeName(t));
    const std::vector<uint8_t> qg = QuantizeRows(t, gf, inter, k), qu = QuantizeRows(t, uf, inter, k);
    std::vector<float> gd(inter * k), ud(inter * k), g(inter), u(inter), want(inter);
    ASSERT_TRUE(cpu::DequantizeRow(t, qg.data(), gd.data(), inter * k).ok());
    ASSERT_TRUE(cpu::DequantizeRow(t, qu.data(), ud.data(), inter * k).ok());
    ASSERT_TRUE(cpu::MatMul(xb.data(), 1, k, gd.data(), DType::kF32, inter, g.data()).ok());
    ASSERT_TRUE(cpu::MatMul(xb.data(), 1, k, ud.data(), DType::kF32, inter, u.data()).ok());
    const auto gb = RoundBf16(g), ub = RoundBf16(u);
    for (int64_t i = 0; i < inter; ++i) want[i] = gb[i] / (1.f + std::exp(-gb[i])) * ub[i];
    DeviceBuffer<uint8_t> dg(qg), du(qu);
    DeviceBuffer<uint16_t> bx(ToBf16(x)), y(inter), yg(inter), yu(inter), y2(inter);
    for (const KGemvMath m : {KGemvMath::kFp32, KGemvMath::kInt8Activations}) {
      for (const int rows : {0, 1, 2, 4}) {
        const std::string what = "silu-mul " + name + (m == KGemvMath::kFp32 ? " fp32" : " int8") +
                                 " rows_per_warp " + std::to_string(rows);
        STATUS_ASSERT(
            QuantGemvSiluMul(t, dg.get(), du.get(), inter, k, bx.bf16(), y.bf16(), nullptr, rows, m));
        STATUS_ASSERT(QuantGemv(t, dg.get(), inter, k, bx.bf16(), yg.bf16(), nullptr, rows, m));
        STATUS_ASSERT(QuantGemv(t, du.get(), inter, k, bx.bf16(), yu.bf16(), nullptr, rows, m));
        STATUS_ASSERT(SiluMul(yg.bf16(), yu.bf16(), inter, y2.bf16(), nullptr));
        EXPECT_EQ(y.Download(), y2.Download()) << what << ": not bit-identical to the unfused path";
        if (m == KGemvMath::kFp32) EXPECT_CLOSE(FromBf16(y.Download()), want, kTolBf16, what.c_str());
      }
    }
  }
  DeviceBuffer<uint8_t> dummy(std::vector<uint8_t>(144));
  DeviceBuffer<uint16_t> bx(std::vector<uint16_t>(256)), y(1);
  EXPECT_FALSE(
      QuantGemvSiluMul(DType::kQ8_0, dummy.get(), dummy.get(), 1, 256, bx.bf16(), y.bf16(), nullptr).ok())
      << "only the K formats";
}

// GGUF Q8_0 repacked for the 8-bit GEMV: the values and scales are bit copies of the file's blocks (padding
// rows zero), and the GEMV (1..8 rows, every split, f32 and bf16 out, the SwiGLU form) matches the product of
// the dequantised weights. Rows scaled x100 .. x0.01 so each block's own d matters.
TEST(CudaQuant, Q8GemvOverRepackedBlocksMatchesDequantisedProduct) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1003, k = 4128, ldy = 1011, alloc = 1024;
  auto wf = RandomFloats(n * k, 21);
  for (int64_t i = 0; i < n * k; ++i) wf[i] *= ((i / 32) % 3 == 0) ? 100.f : ((i / 32) % 3 == 1 ? 0.01f : 1.f);
  const size_t row_bytes = (k / 32) * sizeof(cpu::BlockQ8_0);
  std::vector<uint8_t> blocks(n * row_bytes);
  for (int64_t r = 0; r < n; ++r) cpu::QuantizeRowQ8_0(wf.data() + r * k, blocks.data() + r * row_bytes, k);
  std::vector<float> wd(n * k);
  ASSERT_TRUE(cpu::DequantizeRow(DType::kQ8_0, blocks.data(), wd.data(), n * k).ok());

  DeviceBuffer<uint8_t> raw(blocks), q(alloc * k);
  DeviceBuffer<uint16_t> d(alloc * (k / 32));
  CUDA_ASSERT(cudaMemset(q.get(), 0x5a, alloc * k));  // the padding rows must be overwritten with zeros
  CUDA_ASSERT(cudaMemset(d.get(), 0x5a, alloc * (k / 32) * 2));
  auto* qp = reinterpret_cast<int8_t*>(q.get());
  auto* dp = reinterpret_cast<__half*>(d.get());
  STATUS_ASSERT(RepackQ8_0(raw.get(), n, k, alloc, qp, dp, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  const auto gq = q.Download();
  const auto gd = d.Download();
  int64_t bad = 0;
  for (int64_t b = 0; b < n * (k / 32); ++b) {
    const uint8_t* blk = blocks.data() + b * sizeof(cpu::BlockQ8_0);
    bad += gd[b] != static_cast<uint16_t>(blk[0] | (blk[1] << 8));
    for (int j = 0; j < 32; ++j) bad += gq[b * 32 + j] != blk[2 + j];
  }
  for (int64_t i = n * k; i < alloc * k; ++i) bad += gq[i] != 0;
  for (int64_t i = n * (k / 32); i < alloc * (k / 32); ++i) bad += gd[i] != 0;
  EXPECT_EQ(bad, 0) << "repacked values / scales differ from the file's blocks (or padding not zero)";
  EXPECT_FALSE(RepackQ8_0(raw.get(), n, k - 16, n, qp, dp, nullptr).ok()) << "cols % 32 != 0 must be refused";

  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  ExpectGemvMatchesProduct(wd, n, k, ldy, 22, /*pdl_split=*/2, "q8 gemv", stream,
                           [&](const __nv_bfloat16* x, int64_t m, float* yf, __nv_bfloat16* yb, bool pdl, int split) {
                             Status st = Q8Gemv(qp, dp, n, k, x, m, yf, ldy, pdl, stream, split);
                             if (!st.ok()) return st;
                             return Q8Gemv(qp, dp, n, k, x, m, yb, ldy, false, stream, split);
                           });
  EXPECT_FALSE(Q8Gemv(qp, dp, n, k - 16, nullptr, 1, static_cast<float*>(nullptr), n, false, stream).ok())
      << "k % 32 != 0 must be refused";
  EXPECT_FALSE(Q8Gemv(qp, nullptr, n, k, nullptr, 1, static_cast<float*>(nullptr), n, false, stream).ok())
      << "missing scales must be refused";

  // The SwiGLU form over [2 inter, k]: gate rows then up rows, each with its own block scales.
  const int64_t inter = n / 2;
  for (int64_t m : {1, 3}) {
    const auto x = RoundBf16(RandomFloats(m * k, 29));
    std::vector<float> gu(m * 2 * inter), want(m * inter);
    ASSERT_TRUE(cpu::MatMul(x.data(), m, k, wd.data(), DType::kF32, 2 * inter, gu.data()).ok());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < inter; ++c) {
        const float g = Bf16ToFp32(Fp32ToBf16(gu[r * 2 * inter + c]));
        const float u = Bf16ToFp32(Fp32ToBf16(gu[r * 2 * inter + inter + c]));
        want[r * inter + c] = g / (1.f + std::exp(-g)) * u;
      }
    }
    DeviceBuffer<uint16_t> dx(ToBf16(x)), dy(m * inter);
    STATUS_ASSERT(Q8GemvSiluMul(qp, dp, inter, k, dx.bf16(), m, dy.bf16(), false, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    EXPECT_CLOSE(FromBf16(dy.Download()), want, kTolBf16, ("q8 gemv silu*up m=" + std::to_string(m)).c_str());
  }
  cudaStreamDestroy(stream);
}

// The decode GEMV at every row count it takes, with k not a multiple of the 256-value stride a warp reads per
// load round, n not a multiple of the 8 rows a block covers, and y wider than n (ldy) so stray writes show as
// changed padding. Launched with PDL on a real stream.
TEST(CudaGemv, Bf16GemvMatchesCpuForOneToEightRows) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1003, k = 4104, ldy = 1011;
  const auto w = RoundBf16(RandomFloats(n * k, 31));
  DeviceBuffer<uint16_t> dw(ToBf16(w));
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  for (int64_t m : {1, 2, 3, 5, 8}) {
    const auto x = RoundBf16(RandomFloats(m * k, 32 + static_cast<uint32_t>(m)));
    std::vector<float> want(m * n);
    ASSERT_TRUE(cpu::MatMul(x.data(), m, k, w.data(), DType::kF32, n, want.data()).ok());
    DeviceBuffer<uint16_t> dx(ToBf16(x)), yb(m * ldy);
    DeviceBuffer<float> yf(m * ldy);
    STATUS_ASSERT(Bf16Gemv(dw.bf16(), n, k, dx.bf16(), m, yf.get(), ldy, /*pdl=*/true, stream));
    STATUS_ASSERT(Bf16Gemv(dw.bf16(), n, k, dx.bf16(), m, yb.bf16(), ldy, /*pdl=*/false, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    const auto gf = yf.Download();
    const auto gb = FromBf16(yb.Download());
    std::vector<float> got_f(m * n), got_b(m * n);
    size_t pad_written = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < ldy; ++c) {
        if (c < n) {
          got_f[r * n + c] = gf[r * ldy + c];
          got_b[r * n + c] = gb[r * ldy + c];
        } else {
          pad_written += !std::isnan(gf[r * ldy + c]) + !std::isnan(gb[r * ldy + c]);
        }
      }
    }
    const std::string what = "gemv bf16 m=" + std::to_string(m);
    EXPECT_CLOSE(got_f, want, kTolF32, (what + " -> f32").c_str());
    EXPECT_CLOSE(got_b, want, kTolBf16, (what + " -> bf16").c_str());
    EXPECT_EQ(pad_written, 0u) << what << " wrote past n in a row of width ldy";
  }
  EXPECT_FALSE(Bf16Gemv(dw.bf16(), n, k, dw.bf16(), 9, static_cast<float*>(nullptr), n, false, stream).ok());
  EXPECT_FALSE(
      Bf16Gemv(dw.bf16(), n, 4100, dw.bf16(), 1, static_cast<float*>(nullptr), n, false, stream).ok());
  cudaStreamDestroy(stream);
}

// gate|up GEMV with SwiGLU, fed by SiluMulFused on the same stream (which lets the GEMV launch early under
// PDL): the GEMV must still see the complete output of the kernel before it.
TEST(CudaGemv, SiluMulGemvMatchesUnfusedPathAfterAnEarlyTriggeringKernel) {
  SKIP_WITHOUT_GPU();
  const int64_t inter = 1500, k = 2048, rows0 = 4;
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  // Kernel 1: x = silu(a) * b from a fused [rows0, 2k] input; kernel 2: y = swiglu(x · [Wg; Wu]^T).
  const auto gu_in = RandomFloats(rows0 * 2 * k, 41, -3.f, 3.f);
  const auto w = RoundBf16(RandomFloats(2 * inter * k, 42, -0.05f, 0.05f));
  DeviceBuffer<uint16_t> dgu(ToBf16(gu_in)), dx(rows0 * k), dw(ToBf16(w));
  for (int64_t m : {1, 4}) {
    DeviceBuffer<uint16_t> dy(m * inter);
    STATUS_ASSERT(SiluMulFused(dgu.bf16(), m, k, dx.bf16(), stream));
    STATUS_ASSERT(Bf16GemvSiluMul(dw.bf16(), inter, k, dx.bf16(), m, dy.bf16(), /*pdl=*/true, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    // CPU: the same chain from the bf16 input, rounding where the GPU stores bf16.
    const auto gub = RoundBf16(gu_in);
    std::vector<float> x(m * k);
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> g(gub.begin() + r * 2 * k, gub.begin() + r * 2 * k + k),
          u(gub.begin() + r * 2 * k + k, gub.begin() + (r + 1) * 2 * k);
      cpu::SiluMul(g.data(), u.data(), k, x.data() + r * k);
    }
    x = RoundBf16(x);
    std::vector<float> gate_up(m * 2 * inter), want(m * inter);
    ASSERT_TRUE(cpu::MatMul(x.data(), m, k, w.data(), DType::kF32, 2 * inter, gate_up.data()).ok());
    const auto gr = RoundBf16(gate_up);
    for (int64_t r = 0; r < m; ++r) {
      cpu::SiluMul(gr.data() + r * 2 * inter, gr.data() + r * 2 * inter + inter, inter,
                   want.data() + r * inter);
    }
    EXPECT_CLOSE(FromBf16(dy.Download()), want, kTolBf16, m == 1 ? "gemv swiglu m=1" : "gemv swiglu m=4");
  }
  cudaStreamDestroy(stream);
}

// Several warps per row (split-K inside the block): every split, and the automatic choice, against the CPU,
// over depths whose slices end mid-round, are shorter than a round, or are empty (k = 64, split 8).
TEST(CudaGemv, SplitRowsMatchCpu) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{1003, 14344}, {517, 4096}, {77, 64}}) {
    const auto w = RoundBf16(RandomFloats(2 * n * k, 61, -0.05f, 0.05f));
    const auto x = RoundBf16(RandomFloats(k, 62));
    std::vector<float> want(n), gate_up(2 * n), want_swiglu(n);
    ASSERT_TRUE(cpu::MatMul(x.data(), 1, k, w.data(), DType::kF32, n, want.data()).ok());
    ASSERT_TRUE(cpu::MatMul(x.data(), 1, k, w.data(), DType::kF32, 2 * n, gate_up.data()).ok());
    const auto gr = RoundBf16(gate_up);
    cpu::SiluMul(gr.data(), gr.data() + n, n, want_swiglu.data());
    DeviceBuffer<uint16_t> dw(ToBf16(w)), dx(ToBf16(x)), dact(n);
    DeviceBuffer<float> dy(n);
    for (int split : {0, 1, 2, 4, 8}) {
      STATUS_ASSERT(Bf16Gemv(dw.bf16(), n, k, dx.bf16(), 1, dy.get(), n, /*pdl=*/split == 4, stream, split));
      STATUS_ASSERT(Bf16GemvSiluMul(dw.bf16(), n, k, dx.bf16(), 1, dact.bf16(), false, stream, split));
      CUDA_ASSERT(cudaStreamSynchronize(stream));
      const std::string what =
          "gemv n=" + std::to_string(n) + " k=" + std::to_string(k) + " split " +
          (split == 0 ? "auto=" + std::to_string(GemvSplitFor(1, k, 0)) : std::to_string(split));
      EXPECT_CLOSE(dy.Download(), want, kTolF32, what.c_str());
      EXPECT_CLOSE(FromBf16(dact.Download()), want_swiglu, kTolBf16, (what + " swiglu").c_str());
    }
  }
  // The automatic choice for the 8B depths (4096: QKV, O, gate|up, lm_head; 14336: down), and rows > 1 never
  // split.
  std::printf("  auto split: k=4096 %d, k=14336 %d; m=2: %d\n", GemvSplitFor(1, 4096, 0),
              GemvSplitFor(1, 14336, 0), GemvSplitFor(2, 14336, 0));
  EXPECT_EQ(GemvSplitFor(2, 14336, 0), 1);
  EXPECT_EQ(GemvSplitFor(1, 14336, 4), 4);
  EXPECT_EQ(GemvSplitFor(1, 4096, 0), 2);
  EXPECT_EQ(GemvSplitFor(1, 14336, 0), 2);
  EXPECT_EQ(GemvSplitFor(1, 2048, 0), 1) << "halves shorter than a round of loads";
  cudaStreamDestroy(stream);
}

TEST(CudaGemm, Bf16GemmMatchesCpuAndCachesChoices) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 37, n = 256, k = 512;
  const auto x = RoundBf16(RandomFloats(m * k, 14)), w = RoundBf16(RandomFloats(n * k, 15));
  std::vector<float> want(m * n);
  ASSERT_TRUE(cpu::MatMul(x.data(), m, k, w.data(), DType::kF32, n, want.data()).ok());
  const std::string cache = ::testing::TempDir() + "/stoke_gemm_cache.json";
  std::filesystem::remove(cache);
  GemmOptions opt;
  opt.cache_path = cache;
  auto gemm = BlasLtGemm::Create(opt);
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  std::printf("  [gemm] cache key: %s\n", (*gemm)->cache_key().c_str());
  DeviceBuffer<uint16_t> dx(ToBf16(x)), dw(ToBf16(w)), yb(m * n);
  DeviceBuffer<float> yf(m * n);
  STATUS_ASSERT((*gemm)->Run(dx.bf16(), dw.bf16(), yf.get(), DType::kF32, m, n, k, nullptr));
  EXPECT_CLOSE(yf.Download(), want, kTolF32, "gemm bf16 -> f32");
  STATUS_ASSERT((*gemm)->Run(dx.bf16(), dw.bf16(), yb.get(), DType::kBF16, m, n, k, nullptr));
  EXPECT_CLOSE(FromBf16(yb.Download()), want, kTolBf16, "gemm bf16 -> bf16");
  EXPECT_EQ((*gemm)->entries().size(), 2u);
  STATUS_ASSERT((*gemm)->Save());

  // A second instance reuses the two choices; a file from another machine is refused and rebuilt.
  auto again = BlasLtGemm::Create(opt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->load_status(), "loaded 2");
  STATUS_ASSERT((*again)->Run(dx.bf16(), dw.bf16(), yf.get(), DType::kF32, m, n, k, nullptr));
  EXPECT_CLOSE(yf.Download(), want, kTolF32, "gemm bf16 -> f32 (cached algorithm)");
  {
    std::ofstream f(cache, std::ios::trunc);
    f << SerializeGemmCache("Some Other GPU|sm_80|cudart=12000|cublasLt=120000", (*again)->entries());
  }
  auto other = BlasLtGemm::Create(opt);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->load_status().rfind("refused", 0), 0u) << (*other)->load_status();
  EXPECT_TRUE((*other)->entries().empty());
  std::filesystem::remove(cache);
}

// cuBLASLt's BIAS and GELU_BIAS epilogues against the product plus bias (and tanh-approximated GELU) on the
// host; each epilogue gets its own cached algorithm.
TEST(CudaGemm, BiasAndGeluBiasEpilogues) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 37, n = 256, k = 512;
  const auto x = RoundBf16(RandomFloats(m * k, 31)), w = RoundBf16(RandomFloats(n * k, 32));
  const auto bias = RoundBf16(RandomFloats(n, 33, -2.f, 2.f));
  std::vector<float> prod(m * n), want_bias(m * n), want_gelu(m * n);
  ASSERT_TRUE(cpu::MatMul(x.data(), m, k, w.data(), DType::kF32, n, prod.data()).ok());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float v = prod[i * n + j] + bias[j];
      want_bias[i * n + j] = v;
      want_gelu[i * n + j] = 0.5f * v * (1.f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
  }
  auto gemm = BlasLtGemm::Create(GemmOptions{});
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  DeviceBuffer<uint16_t> dx(ToBf16(x)), dw(ToBf16(w)), db(ToBf16(bias)), y(m * n);
  STATUS_ASSERT((*gemm)->Run(dx.bf16(), dw.bf16(), y.get(), DType::kBF16, m, n, k, nullptr, GemmEpilogue::kBias,
                             db.bf16()));
  EXPECT_CLOSE(FromBf16(y.Download()), want_bias, kTolBf16, "gemm + bias epilogue");
  STATUS_ASSERT((*gemm)->Run(dx.bf16(), dw.bf16(), y.get(), DType::kBF16, m, n, k, nullptr,
                             GemmEpilogue::kGeluBias, db.bf16()));
  EXPECT_CLOSE(FromBf16(y.Download()), want_gelu, kTolBf16, "gemm + gelu(bias) epilogue");
  EXPECT_EQ((*gemm)->entries().size(), 2u);
  EXPECT_FALSE((*gemm)->Run(dx.bf16(), dw.bf16(), y.get(), DType::kBF16, m, n, k, nullptr, GemmEpilogue::kBias,
                            nullptr).ok());
}

// The cache file format needs no GPU.
TEST(GemmCache, RoundTripsAndRefusesAnotherKey) {
  GemmCacheMap m;
  GemmCacheEntry e;
  for (int i = 0; i < 8; ++i) e.algo[i] = 0x0123456789abcdefull * (i + 1);
  e.micros = 12.5f;
  m[GemmShapeKey(1, 4096, 4096, DType::kBF16)] = e;
  const std::string key = GemmCacheKey("NVIDIA H200", 9, 0, 13000, 130000);
  EXPECT_EQ(key, "NVIDIA H200|sm_90|cudart=13000|cublasLt=130000");
  const std::string text = SerializeGemmCache(key, m);
  auto back = ParseGemmCache(text, key);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->begin()->first, "m=1,n=4096,k=4096,out=BF16");
  EXPECT_EQ(back->begin()->second.algo, e.algo);
  EXPECT_FLOAT_EQ(back->begin()->second.micros, 12.5f);
  auto other = ParseGemmCache(text, GemmCacheKey("NVIDIA A100-SXM4-80GB", 8, 0, 13000, 130000));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("sm_80"), std::string::npos);
  EXPECT_EQ(ParseGemmCache("{not json", key).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseGemmCache(R"({"format":"stoke-gemm-cache-v1","key":"k","shapes":{"a":{"algo":[1]}}})", "k")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke::cuda
