// Each op against a double-precision reference on random inputs, outputs poisoned with NaN before the call.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

double RelL2(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);  // NaN if an output was left unwritten
}

constexpr double kTol = 1e-5;
const int64_t kDims[] = {1, 7, 64, 576, 1000};

TEST(OpsTest, Dot) {
  for (int64_t n : kDims) {
    const auto a = RandomFloats(n, 1), b = RandomFloats(n, 2);
    double want = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      want += double{a[i]} * b[i];
      mag += std::fabs(double{a[i]} * b[i]);
    }
    EXPECT_LE(std::fabs(Dot(a.data(), b.data(), n) - want), 1e-6 * mag) << n;
  }
}

TEST(OpsTest, RmsNormOutOfPlaceAndInPlace) {
  for (int64_t dim : kDims) {
    const int64_t rows = 3;
    const auto x = RandomFloats(rows * dim, 3, 2.0f), w = RandomFloats(dim, 4);
    std::vector<double> want(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] * inv * w[i];
    }
    std::vector<float> out(rows * dim, kNaN);
    RmsNorm(x.data(), w.data(), rows, dim, 1e-5f, out.data());
    EXPECT_LT(RelL2(out.data(), want), kTol) << dim;
    std::vector<float> inplace = x;
    RmsNorm(inplace.data(), w.data(), rows, dim, 1e-5f, inplace.data());
    EXPECT_EQ(inplace, out);
  }
}

TEST(OpsTest, LayerNormWithLargeMean) {
  for (int64_t dim : kDims) {
    if (dim == 1) continue;  // variance 0: only beta survives, checked below
    const int64_t rows = 4;
    // A mean far from zero relative to the spread: a one-pass variance would cancel badly.
    const auto x = RandomFloats(rows * dim, 5, 0.5f, 30.0f);
    const auto g = RandomFloats(dim, 6), b = RandomFloats(dim, 7);
    std::vector<double> want(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
      mean /= dim;
      for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
      var /= dim;
      for (int64_t i = 0; i < dim; ++i)
        want[r * dim + i] = (x[r * dim + i] - mean) / std::sqrt(var + 1e-12) * g[i] + b[i];
    }
    std::vector<float> out(rows * dim, kNaN);
    LayerNorm(x.data(), g.data(), b.data(), rows, dim, 1e-12f, out.data());
    EXPECT_LT(RelL2(out.data(), want), 1e-4) << dim;  // input values carry ~1e-6 relative rounding × 60 / 0.5
    std::vector<float> inplace = x;
    LayerNorm(inplace.data(), g.data(), b.data(), rows, dim, 1e-12f, inplace.data());
    EXPECT_EQ(inplace, out);
  }
  const float one = 3.0f, gamma = 2.0f, beta = 0.25f;
  float out = kNaN;
  LayerNorm(&one, &gamma, &beta, 1, 1, 1e-5f, &out);
  EXPECT_FLOAT_EQ(out, 0.25f);
}

TEST(OpsTest, LayerNormCenteredInput) {
  const int64_t dim = 384, rows = 5;
  const auto x = RandomFloats(rows * dim, 8), g = RandomFloats(dim, 9), b = RandomFloats(dim, 10);
  std::vector<double> want(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < dim; ++i) mean += x[r * dim + i];
    mean /= dim;
    for (int64_t i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
    var /= dim;
    for (int64_t i = 0; i < dim; ++i)
      want[r * dim + i] = (x[r * dim + i] - mean) / std::sqrt(var + 1e-12) * g[i] + b[i];
  }
  std::vector<float> out(rows * dim, kNaN);
  LayerNorm(x.data(), g.data(), b.data(), rows, dim, 1e-12f, out.data());
  EXPECT_LT(RelL2(out.data(), want), kTol);
}

TEST(OpsTest, AddAndAddBias) {
  const int64_t rows = 3, dim = 37;
  const auto a = RandomFloats(rows * dim, 11), b = RandomFloats(rows * dim, 12), bias = RandomFloats(dim, 13);
  std::vector<float> out(rows * dim, kNaN);
  Add(a.data(), b.data(), rows * dim, out.data());
  std::vector<float> x = a;
  Add(x.data(), b.data(), rows * dim, x.data());  // aliasing a
  std::vector<float> y = a;
  AddBias(y.data(), bias.data(), rows, dim);
  for (int64_t i = 0; i < rows * dim; ++i) {
    EXPECT_EQ(out[i], a[i] + b[i]);
    EXPECT_EQ(x[i], a[i] + b[i]);
    EXPECT_EQ(y[i], a[i] + bias[i % dim]);
  }
}

TEST(OpsTest, SiluMul) {
  const int64_t n = 1536;
  const auto g = RandomFloats(n, 14, 4.0f), u = RandomFloats(n, 15);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
  std::vector<float> out(n, kNaN);
  SiluMul(g.data(), u.data(), n, out.data());
  EXPECT_LT(RelL2(out.data(), want), kTol);
  std::vector<float> inplace = g;
  SiluMul(inplace.data(), u.data(), n, inplace.data());
  EXPECT_EQ(inplace, out);
  // Saturation: exp(-g) overflows to inf for g << 0; the result must be -0, not NaN. 9 values: the vector
  // path and the scalar tail.
  const float big[9] = {-1000.0f, -100.0f, 100.0f, 1000.0f, -88.5f, 88.5f, 0.0f, -1000.0f, -100.0f};
  const std::vector<float> ones(9, 1.0f);
  float o[9];
  std::fill(o, o + 9, kNaN);
  SiluMul(big, ones.data(), 9, o);
  for (int i : {0, 7}) EXPECT_EQ(o[i], 0.0f) << i;
  for (int i : {1, 4, 8}) EXPECT_NEAR(o[i], 0.0f, 1e-30f) << i;
  EXPECT_EQ(o[2], 100.0f);
  EXPECT_EQ(o[3], 1000.0f);
  EXPECT_EQ(o[5], 88.5f);
  EXPECT_EQ(o[6], 0.0f);
}

TEST(OpsTest, GeluErf) {
  const int64_t n = 1536;
  const auto x = RandomFloats(n, 16, 3.0f);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  std::vector<float> y = x;
  GeluErf(y.data(), n);
  EXPECT_LT(RelL2(y.data(), want), kTol);
  // The negative tail, element by element: 1 + erf(x/√2) is computed as erfc, so no cancellation.
  std::vector<float> tail(64);
  for (int i = 0; i < 64; ++i) tail[i] = -0.1f - 0.125f * i;  // -0.1 .. -7.975
  std::vector<float> g = tail;
  GeluErf(g.data(), 64);
  for (int i = 0; i < 64; ++i) {
    const double ref = 0.5 * tail[i] * std::erfc(-tail[i] / std::sqrt(2.0));
    EXPECT_NEAR(g[i], ref, 1e-5 * std::fabs(ref)) << tail[i];
  }
}

TEST(OpsTest, SoftmaxAndLogSoftmax) {
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{13}, int64_t{49152}}) {
    // Large logits: a naive exp would overflow.
    const auto x = RandomFloats(n, 17, 8.0f, 100.0f);
    double mx = -1e300;
    for (float v : x) mx = std::max(mx, double{v});
    double sum = 0;
    for (float v : x) sum += std::exp(v - mx);
    std::vector<double> p(n), lp(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = std::exp(x[i] - mx) / sum;
      lp[i] = x[i] - mx - std::log(sum);
    }
    std::vector<float> y = x;
    SoftmaxInPlace(y.data(), n);
    EXPECT_LT(RelL2(y.data(), p), kTol) << n;
    std::vector<float> out(n, kNaN);
    LogSoftmax(x.data(), n, out.data());
    if (n == 1) {
      EXPECT_EQ(out[0], 0.0f);
    } else {
      EXPECT_LT(RelL2(out.data(), lp), kTol) << n;
    }
    std::vector<float> inplace = x;
    LogSoftmax(inplace.data(), n, inplace.data());
    EXPECT_EQ(inplace, out);
  }
}

TEST(OpsTest, SoftmaxOfMaskedScores) {
  // -inf scores (masked positions) get probability 0, the rest share 1.
  std::vector<float> x(20, -std::numeric_limits<float>::infinity());
  x[3] = 1.0f;
  x[17] = 1.0f;
  SoftmaxInPlace(x.data(), 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(x[i], (i == 3 || i == 17) ? 0.5f : 0.0f) << i;
}

TEST(OpsTest, RopeNeoxRotatesHalfPairs) {
  const int64_t tokens = 5;
  const int heads = 3, hd = 64;
  const auto x = RandomFloats(tokens * heads * hd, 18);
  const int32_t pos[tokens] = {0, 1, 7, 300, 8191};
  std::vector<float> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = static_cast<float>(std::pow(100000.0, -2.0 * i / hd));
  std::vector<double> want(x.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* a = x.data() + (t * heads + h) * hd;
      double* o = want.data() + (t * heads + h) * hd;
      for (int i = 0; i < hd / 2; ++i) {
        // The angle is rounded to fp32 as HF computes it (positions × inv_freq in fp32); cos/sin in double.
        const double ang = static_cast<float>(pos[t]) * inv[i];
        o[i] = a[i] * std::cos(ang) - a[i + hd / 2] * std::sin(ang);
        o[i + hd / 2] = a[i + hd / 2] * std::cos(ang) + a[i] * std::sin(ang);
      }
    }
  }
  std::vector<float> y = x;
  RopeNeox(y.data(), pos, tokens, heads, hd, inv.data());
  EXPECT_LT(RelL2(y.data(), want), kTol);
  // Position 0 is the identity.
  for (int i = 0; i < heads * hd; ++i) EXPECT_EQ(y[i], x[i]);
}

TEST(OpsTest, EmbeddingLookupAllTypes) {
  const int64_t vocab = 10, dim = 64;
  const auto table = RandomFloats(vocab * dim, 19);
  const int32_t ids[4] = {3, 0, 9, 3};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_1}) {
    std::vector<uint8_t> bytes(RowBytes(t, dim).value() * vocab);
    switch (t) {
      case DType::kF32:
        std::memcpy(bytes.data(), table.data(), bytes.size());
        break;
      case DType::kF16:
      case DType::kBF16:
        for (size_t i = 0; i < table.size(); ++i) {
          const uint16_t h = t == DType::kF16 ? Fp32ToFp16(table[i]) : Fp32ToBf16(table[i]);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
        break;
      case DType::kQ8_0:
        QuantizeRowQ8_0(table.data(), bytes.data(), vocab * dim);
        break;
      default:
        QuantizeRowQ4_1(table.data(), bytes.data(), vocab * dim);
        break;
    }
    std::vector<float> full(vocab * dim);
    ASSERT_TRUE(DequantizeRow(t, bytes.data(), full.data(), vocab * dim).ok());
    std::vector<float> out(4 * dim, kNaN);
    ASSERT_TRUE(EmbeddingLookup(bytes.data(), t, vocab, dim, ids, 4, out.data()).ok());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(0, std::memcmp(out.data() + i * dim, full.data() + ids[i] * dim, dim * 4)) << DTypeName(t);
    }
  }
  std::vector<float> out(dim);
  const int32_t bad[2] = {1, 10};
  const Status st = EmbeddingLookup(table.data(), DType::kF32, vocab, dim, bad, 2, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("10"), std::string::npos) << st.message();
  const int32_t neg = -1;
  EXPECT_FALSE(EmbeddingLookup(table.data(), DType::kF32, vocab, dim, &neg, 1, out.data()).ok());
  EXPECT_FALSE(EmbeddingLookup(table.data(), DType::kQ8_0, vocab, 48, ids, 1, out.data()).ok());  // 48 % 32
}

}  // namespace
}  // namespace stoke::cpu
