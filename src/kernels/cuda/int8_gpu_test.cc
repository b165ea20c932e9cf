// INT8 encoder GEMMs on the GPU (--quantization int8; int8.h, BlasLtGemm::RunInt8) against the CPU reference
// (kernels/cpu/int8_gemm.h): the per-token and static quantisers bit for bit on the same (bf16-exact) values,
// the int8 GEMM exactly (int32 sums), the dequantisation to the reference's fp32 rounding. Skipped when no GPU
// is present.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/int8.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

// Rows of very different ranges, a constant row (3), an all-zero row (4) and a row with an infinity (5), as
// bf16-exact floats: the values both quantisers see.
std::vector<float> Rows(int64_t rows, int64_t cols, uint32_t seed, bool with_inf) {
  auto v = RandomFloats(rows * cols, seed, -1.f, 1.f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      float& x = v[i * cols + j];
      if (i == 3) x = 0.75f;
      if (i == 4) x = 0.f;
      if (i % 7 == 1) x = x * 100.f + 20.f;  // one-sided, as a GELU output shifted
      if (i % 7 == 2) x *= 0.01f;
    }
  }
  if (with_inf && rows > 5) v[5 * cols + cols / 2] = std::numeric_limits<float>::infinity();
  return RoundBf16(v);
}

TEST(CudaInt8, PerTokenQuantiserIsBitExactWithTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 29, cols = 1536;
  const auto x = Rows(rows, cols, 7, /*with_inf=*/true);
  auto col_inv = RandomFloats(cols, 8, 0.25f, 4.f);
  for (bool centred : {false, true}) {
    for (bool smoothed : {false, true}) {
      for (float multiplier : {1.f, 0.1f}) {
        const float* ci = smoothed ? col_inv.data() : nullptr;
        std::vector<int8_t> wq(rows * cols);
        std::vector<float> ws(rows), wm(rows);
        cpu::QuantizeInt8PerToken(x.data(), rows, cols, ci, multiplier, centred, wq.data(), ws.data(), wm.data());
        DeviceBuffer<uint16_t> dx(ToBf16(x));
        DeviceBuffer<float> dci(col_inv), ds(rows), dm(rows);
        DeviceBuffer<int8_t> dq(rows * cols);
        STATUS_ASSERT(QuantizeInt8PerToken(dx.bf16(), rows, cols, smoothed ? dci.get() : nullptr, multiplier,
                                           centred, dq.get(), ds.get(), dm.get(), nullptr));
        const auto q = dq.Download();
        const auto s = ds.Download();
        const auto m = dm.Download();
        const std::string what = std::string(centred ? "centred" : "symmetric") + (smoothed ? ", smoothed" : "") +
                                 ", x" + std::to_string(multiplier);
        int64_t mismatched = 0;
        for (int64_t i = 0; i < rows; ++i) {
          EXPECT_EQ(s[i], ws[i]) << what << " row " << i << " scale";
          EXPECT_EQ(m[i], wm[i]) << what << " row " << i << " centre";
          for (int64_t j = 0; j < cols; ++j) mismatched += q[i * cols + j] != wq[i * cols + j];
        }
        EXPECT_EQ(mismatched, 0) << what;
        EXPECT_EQ(s[5], 0.f) << "a row holding an infinity gets scale 0";
        std::printf("  [int8 per-token %s] %lld of %lld codes differ\n", what.c_str(),
                    static_cast<long long>(mismatched), static_cast<long long>(rows * cols));
      }
    }
  }
}

TEST(CudaInt8, StaticQuantiserIsBitExactWithTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 33, cols = 384;
  const auto x = Rows(rows, cols, 9, /*with_inf=*/false);
  const auto col_inv = RandomFloats(cols, 10, 0.5f, 8.f);
  const float inv = 127.f / 40.f;  // values beyond 40 clip
  std::vector<int8_t> want_scalar(rows * cols), want_cols(rows * cols);
  cpu::QuantizeInt8Static(x.data(), rows * cols, inv, want_scalar.data());
  cpu::QuantizeInt8Columns(x.data(), rows, cols, col_inv.data(), want_cols.data());
  DeviceBuffer<uint16_t> dx(ToBf16(x));
  DeviceBuffer<float> dci(col_inv);
  DeviceBuffer<int8_t> q1(rows * cols), q2(rows * cols);
  STATUS_ASSERT(QuantizeInt8Static(dx.bf16(), rows, cols, inv, nullptr, q1.get(), nullptr));
  STATUS_ASSERT(QuantizeInt8Static(dx.bf16(), rows, cols, 0.f, dci.get(), q2.get(), nullptr));
  EXPECT_EQ(q1.Download(), want_scalar);
  EXPECT_EQ(q2.Download(), want_cols);
}

std::vector<int8_t> RandomInt8(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> v(n);
  for (int8_t& x : v) x = static_cast<int8_t>(d(rng));
  return v;
}

TEST(CudaInt8, GemmIsExact) {
  SKIP_WITHOUT_GPU();
  auto gemm = BlasLtGemm::Create({.candidates = 4});
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  ThreadPool pool(2);
  struct Shape {
    int64_t m, n, k;
  };
  // MiniLM's and BERT-large's GEMMs at a few token counts (m = 1, odd, large).
  for (const Shape sh : {Shape{1, 1152, 384}, Shape{7, 384, 1536}, Shape{300, 3072, 1024}, Shape{513, 1024, 4096},
                         Shape{64, 8, 16}}) {
    const auto x = RandomInt8(sh.m * sh.k, 11);
    const auto w = RandomInt8(sh.n * sh.k, 12);
    std::vector<int32_t> want(sh.m * sh.n);
    ASSERT_TRUE(cpu::MatMulInt8(x.data(), sh.m, sh.k, w.data(), sh.n, want.data(), pool).ok());
    DeviceBuffer<int8_t> dx(x), dw(w);
    DeviceBuffer<int32_t> acc(sh.m * sh.n);
    STATUS_ASSERT((*gemm)->RunInt8(dx.get(), dw.get(), acc.get(), sh.m, sh.n, sh.k, nullptr));
    const auto got = acc.Download();
    int64_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) wrong += got[i] != want[i];
    std::printf("  [int8 gemm %lldx%lldx%lld] %lld of %zu sums differ\n", static_cast<long long>(sh.m),
                static_cast<long long>(sh.n), static_cast<long long>(sh.k), static_cast<long long>(wrong),
                want.size());
    EXPECT_EQ(wrong, 0);
  }
  // Shapes the int8 kernels cannot take are refused, not run.
  DeviceBuffer<int8_t> b(64);
  DeviceBuffer<int32_t> a(64);
  EXPECT_FALSE((*gemm)->RunInt8(b.get(), b.get(), a.get(), 2, 4, 6, nullptr).ok());
}

TEST(CudaInt8, DequantizeMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 37, n = 1024;
  std::mt19937 rng(13);
  std::uniform_int_distribution<int32_t> d(-2000000, 2000000);
  std::vector<int32_t> acc(m * n);
  for (int32_t& a : acc) a = d(rng);
  const auto xs = RandomFloats(m, 14, 1e-3f, 1e-2f), xm = RandomFloats(m, 15, -0.5f, 0.5f);
  const auto ws = RandomFloats(n, 16, 1e-4f, 1e-3f), wsum = RandomFloats(n, 17, -3.f, 3.f);
  std::vector<float> want_tok(m * n), want_static(m * n);
  cpu::DequantizeInt8GemmPerToken(acc.data(), m, n, xs.data(), xm.data(), ws.data(), wsum.data(), nullptr,
                                  want_tok.data());
  cpu::DequantizeInt8Gemm(acc.data(), m, n, 0.02f, ws.data(), nullptr, want_static.data());
  DeviceBuffer<int32_t> dacc(acc);
  DeviceBuffer<float> dxs(xs), dxm(xm), dws(ws), dwsum(wsum), y1(m * n), y2(m * n);
  DeviceBuffer<uint16_t> yb(m * n);
  STATUS_ASSERT(DequantizeInt8Gemm(dacc.get(), m, n, dxs.get(), dxm.get(), 0.f, dws.get(), dwsum.get(), y1.get(),
                                   DType::kF32, nullptr));
  STATUS_ASSERT(DequantizeInt8Gemm(dacc.get(), m, n, nullptr, nullptr, 0.02f, dws.get(), nullptr, y2.get(),
                                   DType::kF32, nullptr));
  STATUS_ASSERT(DequantizeInt8Gemm(dacc.get(), m, n, dxs.get(), dxm.get(), 0.f, dws.get(), dwsum.get(),
                                   yb.get(), DType::kBF16, nullptr));
  // The CPU's compiler may fuse the centre's multiply-add: a rounding apart at most.
  EXPECT_CLOSE(y1.Download(), want_tok, 1e-6, "int8 dequantise per-token -> f32");
  EXPECT_CLOSE(y2.Download(), want_static, 1e-6, "int8 dequantise static -> f32");
  EXPECT_CLOSE(FromBf16(yb.Download()), want_tok, testing::kTolBf16, "int8 dequantise per-token -> bf16");
}

}  // namespace
}  // namespace stoke::cuda
