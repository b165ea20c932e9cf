// The reference KV quantiser: fp8 E4M3 encoding against its definition, per-row int8 / fp8 error bounds, and
// the quantised paged attention against the fp32 kernel over the dequantised values (bit-exact) and over the
// original values (within the quantisation error).
#include "kernels/cpu/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"

namespace stoke::cpu {
namespace {

TEST(Fp8E4M3Test, EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t code = static_cast<uint8_t>(b);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(code)));
      continue;
    }
    EXPECT_EQ(Fp8E4M3FromFloat(Fp8E4M3ToFloat(code)), code) << "code " << b;
  }
}

TEST(Fp8E4M3Test, KnownValuesRoundingAndSaturation) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3FromFloat(1.0625f), 0x38);  // halfway between 1 and 1.125: ties to even (1)
  EXPECT_EQ(Fp8E4M3FromFloat(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: ties to even (1.25)
  EXPECT_EQ(Fp8E4M3FromFloat(1.07f), 0x39);
  EXPECT_EQ(Fp8E4M3FromFloat(-2.0f), 0xc0);
  EXPECT_EQ(Fp8E4M3FromFloat(460.0f), 0x7e);  // saturates, never NaN
  EXPECT_EQ(Fp8E4M3FromFloat(1e9f), 0x7e);
  EXPECT_EQ(Fp8E4M3FromFloat(-1e9f), 0xfe);
  EXPECT_EQ(Fp8E4M3FromFloat(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(Fp8E4M3FromFloat(NAN), 0x7f);
}

// The nearest code by exhaustive search equals the encoder on random values.
TEST(Fp8E4M3Test, EncoderPicksTheNearestCode) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 9.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    const float got = Fp8E4M3ToFloat(Fp8E4M3FromFloat(x));
    float best = 0.0f;
    for (int b = 0; b < 256; ++b) {
      const float c = Fp8E4M3ToFloat(static_cast<uint8_t>(b));
      if (!std::isnan(c) && std::fabs(c - x) < std::fabs(best - x)) best = c;
    }
    EXPECT_EQ(std::fabs(got - x), std::fabs(best - x)) << x;
  }
}

TEST(KvQuantTest, RowErrorWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(128), y(128);
  std::vector<uint8_t> q(256);
  for (int trial = 0; trial < 50; ++trial) {
    for (float& f : x) f = dist(rng);
    float amax = 0;
    for (float f : x) amax = std::max(amax, std::fabs(f));
    const float s8 = QuantizeKvRow(x.data(), 128, KvCacheDtype::kInt8, q.data());
    EXPECT_FLOAT_EQ(s8, amax / 127.0f);
    DequantizeKvRow(q.data(), 128, s8, KvCacheDtype::kInt8, y.data());
    for (int i = 0; i < 128; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * s8 * 1.0001f);
    const float sf = QuantizeKvRow(x.data(), 128, KvCacheDtype::kFp8, q.data());
    DequantizeKvRow(q.data(), 128, sf, KvCacheDtype::kFp8, y.data());
    // E4M3 has 3 mantissa bits: relative error <= 2^-4 for normals, absolute <= 2^-10 · scale below.
    for (int i = 0; i < 128; ++i)
      EXPECT_LE(std::fabs(y[i] - x[i]), std::max(std::fabs(x[i]) / 16.0f, sf / 1024.0f) * 1.0001f);
    QuantizeKvRow(x.data(), 128, KvCacheDtype::kBf16, q.data());
    DequantizeKvRow(q.data(), 128, 1.0f, KvCacheDtype::kBf16, y.data());
    for (int i = 0; i < 128; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 256.0f);
  }
  std::vector<float> zeros(64, 0.0f);
  EXPECT_EQ(QuantizeKvRow(zeros.data(), 64, KvCacheDtype::kInt8, q.data()), 0.0f);
  DequantizeKvRow(q.data(), 64, 0.0f, KvCacheDtype::kInt8, y.data());
  EXPECT_EQ(y[0], 0.0f);
}

// A quantised cache with a shuffled block table, GQA and a chunked prompt.
struct QuantFixture {
  int nkv = 2, hd = 64, heads = 8, bs = 16, blocks = 12;
  int64_t len = 150;
  KvCacheDtype dtype;
  std::vector<uint8_t> k, v;
  std::vector<float> ks, vs;
  std::vector<int32_t> table;
  std::vector<float> keys, values, q;  // [len, nkv, hd] originals, [len, heads, hd] queries

  explicit QuantFixture(KvCacheDtype d) : dtype(d) {
    const int eb = KvElementBytes(d);
    const size_t elems = size_t{1} * blocks * bs * nkv * hd;
    k.assign(elems * eb, 0);
    v.assign(elems * eb, 0);
    ks.assign(size_t{1} * blocks * bs * nkv, 0.0f);
    vs = ks;
    table.resize(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 rng(11);
    std::shuffle(table.begin(), table.end(), rng);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    keys.resize(len * nkv * hd);
    values.resize(len * nkv * hd);
    q.resize(len * heads * hd);
    for (float& f : keys) f = dist(rng);
    for (float& f : values) f = dist(rng);
    for (float& f : q) f = dist(rng);
  }
  QuantPagedKvLayer Layer(float multiplier = 1.0f) {
    const bool scaled = KvCacheDtypeIsQuantized(dtype);
    return QuantPagedKvLayer{
        dtype, k.data(), v.data(),  scaled ? ks.data() : nullptr, scaled ? vs.data() : nullptr, blocks, bs,
        nkv,   hd,       multiplier};
  }
  std::vector<int32_t> Slots() const {
    std::vector<int32_t> slots(len);
    for (int64_t p = 0; p < len; ++p) slots[p] = table[p / bs] * bs + static_cast<int32_t>(p % bs);
    return slots;
  }
  // Attention of every position, the prompt run in two chunks [0, 100) and [100, len).
  std::vector<float> Attend(float multiplier = 1.0f) {
    const QuantPagedKvLayer layer = Layer(multiplier);
    const std::vector<int32_t> slots = Slots();
    WriteKv(layer, keys.data(), values.data(), slots.data(), len);
    std::vector<float> out(len * heads * hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    PagedAttention(q.data(), 100, heads, 0, table.data(), layer, scale, out.data(), ThreadPool::Default());
    PagedAttention(q.data() + 100 * heads * hd, len - 100, heads, 100, table.data(), layer, scale,
                   out.data() + 100 * heads * hd, ThreadPool::Default());
    return out;
  }
  // The fp32 kernel over `k_vals` / `v_vals` (dense [len, nkv, hd]) placed through the same table.
  std::vector<float> AttendFp32(const std::vector<float>& k_vals, const std::vector<float>& v_vals) {
    std::vector<float> kc(size_t{1} * blocks * bs * nkv * hd), vc(kc.size());
    const PagedKvLayer layer{kc.data(), vc.data(), blocks, bs, nkv, hd};
    const std::vector<int32_t> slots = Slots();
    cpu::WriteKv(layer, k_vals.data(), v_vals.data(), slots.data(), len);
    std::vector<float> out(len * heads * hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    cpu::PagedAttention(q.data(), len, heads, 0, table.data(), layer, scale, out.data(),
                        ThreadPool::Default());
    return out;
  }
  std::vector<float> RoundTrip(const std::vector<float>& x) const {
    std::vector<float> y(x.size());
    std::vector<uint8_t> buf(hd * 2);
    for (size_t r = 0; r < x.size() / hd; ++r) {
      const float s = QuantizeKvRow(x.data() + r * hd, hd, dtype, buf.data());
      DequantizeKvRow(buf.data(), hd, s, dtype, y.data() + r * hd);
    }
    return y;
  }
};

class QuantAttentionTest : public ::testing::TestWithParam<KvCacheDtype> {};

TEST_P(QuantAttentionTest, EqualsFp32KernelOverDequantisedValues) {
  QuantFixture f(GetParam());
  const std::vector<float> got = f.Attend();
  const std::vector<float> want = f.AttendFp32(f.RoundTrip(f.keys), f.RoundTrip(f.values));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

TEST_P(QuantAttentionTest, CloseToFp32OverOriginals) {
  QuantFixture f(GetParam());
  const std::vector<float> got = f.Attend();
  const std::vector<float> want = f.AttendFp32(f.keys, f.values);
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_LT(rel, GetParam() == KvCacheDtype::kFp8 ? 0.06 : 0.02) << KvCacheDtypeName(GetParam());
  EXPECT_GT(rel, 0.0);
}

// The test-only broken quantiser really is broken: what the gate's failure test relies on.
TEST_P(QuantAttentionTest, WrongScaleMovesTheOutput) {
  if (!KvCacheDtypeIsQuantized(GetParam())) GTEST_SKIP() << "bf16 has no scale";
  QuantFixture f(GetParam());
  const std::vector<float> want = f.AttendFp32(f.keys, f.values);
  const std::vector<float> got = f.Attend(2.0f);
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_GT(std::sqrt(num / den), 0.2);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantAttentionTest,
                         ::testing::Values(KvCacheDtype::kBf16, KvCacheDtype::kInt8, KvCacheDtype::kFp8),
                         [](const auto& info) { return std::string(KvCacheDtypeName(info.param)); });

}  // namespace
}  // namespace stoke::cpu
