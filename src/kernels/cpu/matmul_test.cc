// MatMul against a double-precision reference over dequantised weights, for every weight type, on ragged
// shapes; plus bit-exact agreement between the m = 1 path, the tiled path and different thread counts.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/qdot.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

void PutHalf(uint8_t* p, float f) {
  const uint16_t h = Fp32ToFp16(f);
  std::memcpy(p, &h, 2);
}

// A random [n, k] weight of type t. Quantised blocks are random bytes (every bit pattern of the
// quantised values, including Q8_0's -128) with sane fp16 scales/offsets written over them.
std::vector<uint8_t> RandomWeight(DType t, int64_t n, int64_t k, std::mt19937& rng) {
  const size_t row_bytes = RowBytes(t, k).value();
  std::vector<uint8_t> w(row_bytes * n);
  if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) {
    const std::vector<float> f = RandomFloats(n * k, rng, 0.5f);
    for (size_t i = 0; i < f.size(); ++i) {
      if (t == DType::kF32) {
        std::memcpy(w.data() + 4 * i, &f[i], 4);
      } else {
        const uint16_t h = t == DType::kF16 ? Fp32ToFp16(f[i]) : Fp32ToBf16(f[i]);
        std::memcpy(w.data() + 2 * i, &h, 2);
      }
    }
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.005f, 0.05f);
  const DTypeInfo& info = GetDTypeInfo(t);
  for (size_t off = 0; off < w.size(); off += info.block_bytes) {
    uint8_t* blk = w.data() + off;
    switch (t) {
      case DType::kQ4_1:
      case DType::kQ5_1:
        PutHalf(blk, scale(rng));
        PutHalf(blk + 2, -8.0f * scale(rng));  // m: the block minimum
        break;
      case DType::kQ4_K:
        PutHalf(blk + offsetof(BlockQ4_K, d), scale(rng) * 0.1f);
        PutHalf(blk + offsetof(BlockQ4_K, dmin), scale(rng) * 0.1f);
        break;
      case DType::kQ6_K:
        PutHalf(blk + offsetof(BlockQ6_K, d), scale(rng) * 0.1f);
        break;
      default:  // Q4_0, Q5_0, Q8_0: d first
        PutHalf(blk, t == DType::kQ8_0 ? scale(rng) * 0.1f : scale(rng));
        break;
    }
  }
  return w;
}

// Y = X · W^T in double over the dequantised W.
std::vector<double> Reference(const std::vector<float>& x, int64_t m, int64_t k,
                              const std::vector<uint8_t>& w, DType t, int64_t n) {
  std::vector<float> wf(n * k);
  EXPECT_TRUE(DequantizeRow(t, w.data(), wf.data(), n * k).ok());
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += static_cast<double>(x[i * k + c]) * wf[j * k + c];
      y[i * n + j] = s;
    }
  }
  return y;
}

double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);  // NaN (fails every bound) if any output was left unwritten
}

// X after the 8-bit activation quantisation the integer paths apply (x' = d · q per 32-block).
std::vector<float> ActsAsQuantized(const std::vector<float>& x, int64_t m, int64_t k) {
  std::vector<float> out(x.size());
  std::vector<int8_t> qs(k);
  std::vector<float> d(k / 32), s(k / 32);
  for (int64_t r = 0; r < m; ++r) {
    QuantizeActsRow(x.data() + r * k, k, qs.data(), d.data(), s.data());
    for (int64_t i = 0; i < k; ++i) out[r * k + i] = d[i / 32] * qs[i];
  }
  return out;
}

std::vector<float> RunMatMul(const std::vector<float>& x, int64_t m, int64_t k, const std::vector<uint8_t>& w,
                             DType t, int64_t n, ThreadPool& pool) {
  std::vector<float> y(m * n, std::numeric_limits<float>::quiet_NaN());
  const Status st = MatMul(x.data(), m, k, w.data(), t, n, y.data(), pool);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return y;
}

struct Shape {
  int64_t m, k, n;
};

class MatMulTypeTest : public ::testing::TestWithParam<DType> {};

// fp32/F16/BF16 and the dequantising paths (K-quants): within fp32 accumulation error of W · X in double.
// Integer paths (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): within fp32 accumulation error of W · X' where X' is X after
// the 8-bit activation quantisation (this checks every bit of the kernel's arithmetic), and within the
// quantisation error of W · X itself. That error is set by the activations, not by W: a Gaussian block's
// 8-bit step is amax/127 ~ 2.5σ/127, a uniform rounding error of 0.0057σ, so ~0.6% relative L2 for every
// weight type, Q8_0 included (llama.cpp's scheme has the same floor).
TEST_P(MatMulTypeTest, MatchesDoubleReference) {
  const DType t = GetParam();
  const bool k_quant = GetDTypeInfo(t).block_elems == 256;
  const std::vector<Shape> shapes =
      k_quant ? std::vector<Shape>{{1, 256, 1}, {1, 512, 37}, {3, 256, 17}, {17, 768, 70}, {128, 256, 33}}
              : std::vector<Shape>{{1, 32, 1}, {1, 576, 192},  {3, 96, 7},   {17, 128, 33},
                                   {5, 64, 2}, {128, 256, 65}, {130, 64, 3}, {1, 1536, 77}};
  std::mt19937 rng(1234);
  ThreadPool pool(2);
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomFloats(s.m * s.k, rng);
    const std::vector<uint8_t> w = RandomWeight(t, s.n, s.k, rng);
    const std::vector<float> y = RunMatMul(x, s.m, s.k, w, t, s.n, pool);
    const std::vector<double> exact = Reference(x, s.m, s.k, w, t, s.n);
    const double err = RelL2(y, exact);
    if (!HasQDot(t)) {
      EXPECT_LT(err, 1e-5) << DTypeName(t) << " m=" << s.m << " k=" << s.k << " n=" << s.n;
      continue;
    }
    const double err_q = RelL2(y, Reference(ActsAsQuantized(x, s.m, s.k), s.m, s.k, w, t, s.n));
    EXPECT_LT(err_q, 1e-5) << DTypeName(t) << " vs quantised X, m=" << s.m << " k=" << s.k << " n=" << s.n;
    // One or two outputs are single noisy samples of the error; judge the bound on larger outputs.
    if (s.m * s.n >= 32) {
      EXPECT_LT(err, 1e-2) << DTypeName(t) << " m=" << s.m << " k=" << s.k << " n=" << s.n;
    }
    EXPECT_LT(err, 3e-2) << DTypeName(t) << " m=" << s.m << " k=" << s.k << " n=" << s.n;
  }
}

// A row's result does not depend on how many rows are computed with it, which tile it lands in, or how
// many threads share the work: the quantised paths (our own kernels) bit for bit. The fp paths (F32, F16,
// BF16) give each thread's columns to one OpenBLAS sgemm call, and OpenBLAS's result for an element depends
// on the width of the call on some CPUs (its Zen kernels: measured on an AMD EPYC, 0.3.21, a 45-column call
// and three of 16 or fewer differ in the last bits of 24 % of the outputs; its Haswell ones do not): there the
// bound is a rounding, not bits.
TEST_P(MatMulTypeTest, TilingAndThreadsDoNotChangeBits) {
  const DType t = GetParam();
  const int64_t k = GetDTypeInfo(t).block_elems == 256 ? 512 : 160;
  const int64_t m = 17, n = 45;
  std::mt19937 rng(99);
  const std::vector<float> x = RandomFloats(m * k, rng);
  const std::vector<uint8_t> w = RandomWeight(t, n, k, rng);
  ThreadPool pool1(1), pool3(3);
  const std::vector<float> y1 = RunMatMul(x, m, k, w, t, n, pool1);
  const std::vector<float> y3 = RunMatMul(x, m, k, w, t, n, pool3);
  if (!HasQDot(t)) {
    // fp paths use BLAS for m > 1, whose summation order differs from the m = 1 dot (and across widths).
    EXPECT_LT(RelL2(y3, std::vector<double>(y1.begin(), y1.end())), 1e-6) << DTypeName(t);
    return;
  }
  EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float))) << DTypeName(t);
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
    const std::vector<float> yi = RunMatMul(row, 1, k, w, t, n, pool3);
    EXPECT_EQ(0, std::memcmp(yi.data(), y1.data() + i * n, n * sizeof(float)))
        << DTypeName(t) << " row " << i;
  }
}

// GGUF tensors need not be aligned (general.alignment can be 1): an odd address gives the same bits.
TEST_P(MatMulTypeTest, UnalignedWeightsAndLongRows) {
  const DType t = GetParam();
  // A short k that leaves scalar tails in the fp16/bf16 conversions (291 = 18 · 16 + 3).
  const int block = GetDTypeInfo(t).block_elems;
  const int64_t short_k = block == 1 ? 291 : block == 32 ? 288 : 256;
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (const Shape& s : {Shape{1, 4096, 9}, Shape{7, 4096, 9}, Shape{3, short_k, 5}}) {
    const std::vector<float> x = RandomFloats(s.m * s.k, rng);
    const std::vector<uint8_t> w = RandomWeight(t, s.n, s.k, rng);
    std::vector<uint8_t> shifted(w.size() + 1);
    std::memcpy(shifted.data() + 1, w.data(), w.size());
    std::vector<float> y(s.m * s.n, std::numeric_limits<float>::quiet_NaN()), ys = y;
    ASSERT_TRUE(MatMul(x.data(), s.m, s.k, w.data(), t, s.n, y.data(), pool).ok());
    ASSERT_TRUE(MatMul(x.data(), s.m, s.k, shifted.data() + 1, t, s.n, ys.data(), pool).ok());
    EXPECT_EQ(0, std::memcmp(y.data(), ys.data(), y.size() * sizeof(float))) << DTypeName(t) << " m=" << s.m;
    const std::vector<float> xq = HasQDot(t) ? ActsAsQuantized(x, s.m, s.k) : x;
    EXPECT_LT(RelL2(y, Reference(xq, s.m, s.k, w, t, s.n)), 1e-5) << DTypeName(t) << " m=" << s.m;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                                           DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K,
                                           DType::kQ6_K),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(MatMulTest, RejectsBadShapesAndTypes) {
  std::vector<float> x(64, 1.0f), y(4);
  std::vector<uint8_t> w(1024);
  ThreadPool pool(1);
  Status st = MatMul(x.data(), 1, 48, w.data(), DType::kQ4_1, 1, y.data(), pool);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block size"), std::string::npos) << st.message();
  st = MatMul(x.data(), 1, 32, w.data(), DType::kI32, 1, y.data(), pool);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MatMul(x.data(), -1, 32, w.data(), DType::kF32, 1, y.data(), pool).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(MatMul(x.data(), 0, 32, w.data(), DType::kF32, 1, y.data(), pool).ok());
}

TEST(MatMulTest, EmptyReductionGivesZeros) {
  std::vector<float> x(1), y(6, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint8_t> w(1);
  ThreadPool pool(1);
  ASSERT_TRUE(MatMul(x.data(), 2, 0, w.data(), DType::kF32, 3, y.data(), pool).ok());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// The activation quantiser: d = amax / 127, q = round-half-even(x / d), s = d · Σ q (ggml's
// quantize_row_q8_1).
TEST(QDotTest, QuantizeActsRowMatchesScalarDefinition) {
  std::mt19937 rng(5);
  const int64_t k = 128;
  std::vector<float> x = RandomFloats(k, rng, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
  x[70] = -50.0f;                                   // a block whose amax is negative
  std::vector<int8_t> qs(k);
  std::vector<float> d(k / 32), s(k / 32);
  QuantizeActsRow(x.data(), k, qs.data(), d.data(), s.data());
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    EXPECT_EQ(d[b], amax / 127.0f);
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::nearbyint(x[b * 32 + i] * id));
      EXPECT_EQ(qs[b * 32 + i], q) << "block " << b << " i " << i;
      sum += q;
    }
    EXPECT_FLOAT_EQ(s[b], d[b] * sum);
  }
  EXPECT_EQ(qs[70], -127);
}

}  // namespace
}  // namespace stoke::cpu
