// The int8 reference arithmetic (int8_gemm.h): the quantisers' rounding, saturation and round trip, and the
// integer GEMM against a naive double-precision product of the same integers.
#include "kernels/cpu/int8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace stoke::cpu {
namespace {

TEST(Int8QuantTest, StaticScaleRoundsHalfToEvenAndSaturates) {
  // scale 0.5 (inv 2): 0.25 -> 0.5 -> 0 (half to even), 0.75 -> 1.5 -> 2, -0.75 -> -2, 63.4 -> 126.8 -> 127,
  // 100 -> 200 -> saturates at 127, -1e9 -> -127 (never -128), NaN -> 0, inf -> 127.
  const float x[] = {0.25f,  0.75f, -0.75f,        63.4f,
                     100.0f, -1e9f, std::nanf(""), std::numeric_limits<float>::infinity()};
  int8_t q[8];
  QuantizeInt8Static(x, 8, 2.0f, q);
  const int8_t want[] = {0, 2, -2, 127, 127, -127, 0, 127};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], want[i]) << i;
  QuantizeInt8Static(x, 3, 0.0f, q);  // a tensor calibrated as all zeros
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 0);
}

TEST(Int8QuantTest, RowRoundTripIsWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 0.3f);
  std::vector<float> w(384);
  for (float& v : w) v = dist(rng);
  w[17] = -2.5f;  // the row's amax: exactly -127 after quantisation
  std::vector<int8_t> q(w.size());
  const float scale = QuantizeInt8Row(w.data(), static_cast<int64_t>(w.size()), q.data());
  EXPECT_FLOAT_EQ(scale, 2.5f / 127.0f);
  EXPECT_EQ(q[17], -127);
  for (size_t i = 0; i < w.size(); ++i)
    EXPECT_LE(std::fabs(q[i] * scale - w[i]), 0.5f * scale * 1.0001f) << i;
  // An all-zero row: scale 0, every q 0 (no division by zero).
  std::vector<float> zeros(16, 0.f);
  EXPECT_EQ(QuantizeInt8Row(zeros.data(), 16, q.data()), 0.0f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(q[i], 0);
}

TEST(Int8GemmTest, MatchesTheIntegerProductAndDequantises) {
  // Shapes not multiples of the 4 x 64 tiles, k = MiniLM's FFN width.
  const int64_t m = 7, n = 70, k = 1536;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> x(m * k), w(n * k);
  for (auto& v : x) v = static_cast<int8_t>(d(rng));
  for (auto& v : w) v = static_cast<int8_t>(d(rng));
  x[0] = w[0] = -127;  // the extremes multiply exactly
  std::vector<int32_t> acc(m * n, -1);
  ThreadPool pool(2);
  ASSERT_TRUE(MatMulInt8(x.data(), m, k, w.data(), n, acc.data(), pool).ok());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int64_t want = 0;
      for (int64_t p = 0; p < k; ++p) want += int64_t{x[i * k + p]} * w[j * k + p];
      ASSERT_EQ(acc[i * n + j], want) << i << "," << j;
    }
  }
  std::vector<float> w_scale(n), bias(n), y(m * n);
  for (int64_t j = 0; j < n; ++j) {
    w_scale[j] = 0.001f * static_cast<float>(j + 1);
    bias[j] = static_cast<float>(j) - 3.f;
  }
  DequantizeInt8Gemm(acc.data(), m, n, 0.02f, w_scale.data(), bias.data(), y.data());
  EXPECT_FLOAT_EQ(y[1 * n + 5], static_cast<float>(acc[1 * n + 5]) * (0.02f * w_scale[5]) + bias[5]);
}

// Every edge of the tiled kernel: rows not a multiple of its 4, an odd column count (a lone last column), k
// not a multiple of 16 (the scalar tail) or below it, blocks of 32 x 64 crossed, one row, one column, k = 0.
TEST(Int8GemmTest, EveryTileEdgeIsTheExactIntegerProduct) {
  struct Shape {
    int64_t m, n, k;
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> d(-127, 127);
  ThreadPool pool(2);
  for (const Shape sh : {Shape{1, 1, 5}, Shape{1, 3, 16}, Shape{4, 2, 16}, Shape{5, 7, 17}, Shape{33, 129, 384},
                         Shape{70, 65, 1551}, Shape{3, 1, 0}, Shape{64, 128, 31}}) {
    std::vector<int8_t> x(sh.m * sh.k), w(sh.n * sh.k);
    for (auto& v : x) v = static_cast<int8_t>(d(rng));
    for (auto& v : w) v = static_cast<int8_t>(d(rng));
    if (sh.k > 0) x.back() = w.back() = -127;
    std::vector<int32_t> acc(sh.m * sh.n, -1);
    ASSERT_TRUE(MatMulInt8(x.data(), sh.m, sh.k, w.data(), sh.n, acc.data(), pool).ok());
    for (int64_t i = 0; i < sh.m; ++i) {
      for (int64_t j = 0; j < sh.n; ++j) {
        int64_t want = 0;
        for (int64_t p = 0; p < sh.k; ++p) want += int64_t{x[i * sh.k + p]} * w[j * sh.k + p];
        ASSERT_EQ(acc[i * sh.n + j], want) << sh.m << "x" << sh.n << "x" << sh.k << " at " << i << "," << j;
      }
    }
  }
}

TEST(Int8GemmTest, RejectsAnOverflowingDepth) {
  int8_t one = 1;
  int32_t acc = 0;
  ThreadPool pool(1);
  EXPECT_EQ(MatMulInt8(&one, 1, 200000, &one, 1, &acc, pool).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke::cpu
