#include "kernels/cpu/quants.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"

namespace stoke::cpu {
namespace {

// Expected values below are computed from the layouts in shared/reference/model-formats.md §2, independently
// of quants.cc's loops, with power-of-two scales so every product is exact in any evaluation order.

std::vector<float> Dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(n, std::nanf(""));  // poisoned: unwritten values show up
  Status st = DequantizeRow(t, src, out.data(), n);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

template <typename Block>
std::vector<uint8_t> Bytes(const std::vector<Block>& blocks) {
  std::vector<uint8_t> b(blocks.size() * sizeof(Block));
  std::memcpy(b.data(), blocks.data(), b.size());
  return b;
}

TEST(Quants, Q8_0) {
  BlockQ8_0 b[2];
  b[0].d = Fp32ToFp16(0.5f);
  b[1].d = Fp32ToFp16(-2.0f);
  for (int j = 0; j < 32; ++j)
    b[0].qs[j] = static_cast<int8_t>(j * 8 - 128), b[1].qs[j] = static_cast<int8_t>(j);
  const auto y = Dequant(DType::kQ8_0, b, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], (j * 8 - 128) * 0.5f) << j;
    EXPECT_EQ(y[32 + j], j * -2.0f) << j;
  }
}

TEST(Quants, Q4_0LowNibblesAreTheFirstHalf) {
  BlockQ4_0 b;
  b.d = Fp32ToFp16(0.25f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = Dequant(DType::kQ4_0, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.25f) << j;
    EXPECT_EQ(y[16 + j], (7 - j) * 0.25f) << j;
  }
}

TEST(Quants, Q4_1) {
  BlockQ4_1 b;
  b.d = Fp32ToFp16(0.5f);
  b.m = Fp32ToFp16(-3.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = Dequant(DType::kQ4_1, &b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 3.0f) << j;
    EXPECT_EQ(y[16 + j], (15 - j) * 0.5f - 3.0f) << j;
  }
}

// Q5: the 5th bit of value j is bit j of qh (value j+16: bit j+16).
TEST(Quants, Q5_0And5_1HighBits) {
  std::mt19937 rng(7);
  uint8_t q[32];
  for (uint8_t& v : q) v = static_cast<uint8_t>(rng() % 32);
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  BlockQ5_0 b0;
  BlockQ5_1 b1;
  b0.d = Fp32ToFp16(0.125f);
  b1.d = Fp32ToFp16(0.125f);
  b1.m = Fp32ToFp16(1.0f);
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b1.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) {
    b0.qs[j] = b1.qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  }
  const auto y0 = Dequant(DType::kQ5_0, &b0, 32);
  const auto y1 = Dequant(DType::kQ5_1, &b1, 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y0[j], (q[j] - 16) * 0.125f) << j;
    EXPECT_EQ(y1[j], q[j] * 0.125f + 1.0f) << j;
  }
}

// Inverse of the 6-bit scale/min unpacking in model-formats.md §2.
void PackScalesK4(const int sc[8], const int mn[8], uint8_t s[12]) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(Quants, Q4_K) {
  std::mt19937 rng(11);
  std::vector<BlockQ4_K> blocks(2);
  std::vector<float> want;
  for (BlockQ4_K& b : blocks) {
    const float d = 1.0f / 16, dmin = 1.0f / 8;
    b.d = Fp32ToFp16(d);
    b.dmin = Fp32ToFp16(dmin);
    int sc[8], mn[8];
    for (int s = 0; s < 8; ++s) sc[s] = rng() % 64, mn[s] = rng() % 64;
    PackScalesK4(sc, mn, b.scales);
    for (uint8_t& v : b.qs) v = static_cast<uint8_t>(rng());
    for (int c = 0; c < 4; ++c) {  // chunk c: low nibbles -> sub-block 2c, high nibbles -> 2c + 1
      for (int l = 0; l < 32; ++l) want.push_back(d * sc[2 * c] * (b.qs[32 * c + l] & 15) - dmin * mn[2 * c]);
      for (int l = 0; l < 32; ++l)
        want.push_back(d * sc[2 * c + 1] * (b.qs[32 * c + l] >> 4) - dmin * mn[2 * c + 1]);
    }
  }
  EXPECT_EQ(Dequant(DType::kQ4_K, blocks.data(), 512), want);
}

TEST(Quants, Q6_K) {
  std::mt19937 rng(13);
  std::vector<BlockQ6_K> blocks(2);
  std::vector<float> want(512);
  for (int bi = 0; bi < 2; ++bi) {
    BlockQ6_K& b = blocks[bi];
    const float d = 1.0f / 64;
    b.d = Fp32ToFp16(d);
    for (int8_t& s : b.scales) s = static_cast<int8_t>(rng());
    for (uint8_t& v : b.ql) v = static_cast<uint8_t>(rng());
    for (uint8_t& v : b.qh) v = static_cast<uint8_t>(rng());
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      const int8_t* sc = b.scales + 8 * h;
      float* out = want.data() + 256 * bi + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int t = l / 16;
        out[l] = d * sc[t] * ((ql[l] & 15) + 16 * ((qh[l] >> 0) & 3) - 32);
        out[l + 32] = d * sc[t + 2] * ((ql[l + 32] & 15) + 16 * ((qh[l] >> 2) & 3) - 32);
        out[l + 64] = d * sc[t + 4] * ((ql[l] >> 4) + 16 * ((qh[l] >> 4) & 3) - 32);
        out[l + 96] = d * sc[t + 6] * ((ql[l + 32] >> 4) + 16 * ((qh[l] >> 6) & 3) - 32);
      }
    }
  }
  EXPECT_EQ(Dequant(DType::kQ6_K, blocks.data(), 512), want);
}

TEST(Quants, FloatTypesKeepSpecialValues) {
  const uint16_t h[] = {0x0000, 0x8000, 0x3c00, 0x0001, 0x7c00, 0xfc00, 0x7e00, 0x7bff};
  const auto y = Dequant(DType::kF16, h, 8);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_TRUE(std::signbit(y[1]));
  EXPECT_EQ(y[2], 1.0f);
  EXPECT_EQ(y[3], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(y[4], INFINITY);
  EXPECT_EQ(y[5], -INFINITY);
  EXPECT_TRUE(std::isnan(y[6]));
  EXPECT_EQ(y[7], 65504.0f);
  const uint16_t bf[] = {0x3f80, 0xc000, 0x7f80};
  EXPECT_THAT(Dequant(DType::kBF16, bf, 3), ::testing::ElementsAre(1.0f, -2.0f, INFINITY));
  const float f[] = {1.5f, -0.0f};
  EXPECT_THAT(Dequant(DType::kF32, f, 2), ::testing::ElementsAre(1.5f, -0.0f));
  const double dd[] = {0.1, -3.0};
  EXPECT_THAT(Dequant(DType::kF64, dd, 2), ::testing::ElementsAre(0.1f, -3.0f));
}

TEST(Quants, UnalignedSourceGivesSameResult) {
  std::mt19937 rng(3);
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                  DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
    const DTypeInfo& info = GetDTypeInfo(t);
    const int64_t n = 2 * 256;
    std::vector<uint8_t> buf(n / info.block_elems * info.block_bytes + 1);
    for (uint8_t& v : buf) v = static_cast<uint8_t>(rng() & 0x3b);  // keeps fp16 scales finite
    const auto aligned = Dequant(t, buf.data(), n);
    std::vector<uint8_t> shifted(buf.size() + 1);
    std::memcpy(shifted.data() + 1, buf.data(), buf.size());
    const auto unaligned = Dequant(t, shifted.data() + 1, n);
    EXPECT_EQ(std::memcmp(aligned.data(), unaligned.data(), n * 4), 0) << info.name;
  }
}

TEST(Quants, DequantizeRowRejectsBadInput) {
  float out[64];
  uint8_t in[256] = {};
  EXPECT_EQ(DequantizeRow(DType::kQ8_0, in, out, 33).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(DType::kQ4_K, in, out, 32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(DType::kI32, in, out, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(DType::kF32, in, out, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeRow(DType::kQ8_0, in, out, 0).ok());
}

// Inputs chosen so ggml's reference quantisers hit exact grid points; expected bytes worked out by hand.
TEST(Quants, QuantizeQ4_0ExactGrid) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = ((j % 16) - 8) * 0.5f;  // max magnitude -4 -> d = 0.5
  BlockQ4_0 b;
  QuantizeRowQ4_0(x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(0.5f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4)) << j;
  EXPECT_EQ(Dequant(DType::kQ4_0, &b, 32), std::vector<float>(x, x + 32));
}

TEST(Quants, QuantizeQ4_1ExactGrid) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = -1.0f + (j % 16) * 0.25f;  // d = 3.75 / 15 = 0.25, m = -1
  BlockQ4_1 b;
  QuantizeRowQ4_1(x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(0.25f));
  EXPECT_EQ(b.m, Fp32ToFp16(-1.0f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], j | (j << 4)) << j;
  EXPECT_EQ(Dequant(DType::kQ4_1, &b, 32), std::vector<float>(x, x + 32));
}

TEST(Quants, QuantizeQ5ExactGrid) {
  float x0[32], x1[32];
  for (int j = 0; j < 32; ++j) x0[j] = (j - 16) * 0.5f, x1[j] = -2.0f + j * 0.125f;
  BlockQ5_0 b0;
  BlockQ5_1 b1;
  QuantizeRowQ5_0(x0, &b0, 32);  // max magnitude -8 -> d = 0.5, q = j
  QuantizeRowQ5_1(x1, &b1, 32);  // d = 3.875 / 31 = 0.125, m = -2, q = j
  uint32_t qh0, qh1;
  std::memcpy(&qh0, b0.qh, 4);
  std::memcpy(&qh1, b1.qh, 4);
  EXPECT_EQ(b0.d, Fp32ToFp16(0.5f));
  EXPECT_EQ(qh0, 0xFFFF0000u);  // values 16..31 have the 5th bit set
  EXPECT_EQ(qh1, 0xFFFF0000u);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b0.qs[j], j | (j << 4)) << j;
  EXPECT_EQ(Dequant(DType::kQ5_0, &b0, 32), std::vector<float>(x0, x0 + 32));
  EXPECT_EQ(Dequant(DType::kQ5_1, &b1, 32), std::vector<float>(x1, x1 + 32));
}

TEST(Quants, QuantizeQ8_0RoundsHalfAwayFromZero) {
  float x[32] = {};
  x[0] = 127.0f;  // d = 1, id = 1
  x[1] = 2.5f;    // roundf: 3 (not banker's 2)
  x[2] = -2.5f;
  x[3] = 0.49f;
  BlockQ8_0 b;
  QuantizeRowQ8_0(x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(1.0f));
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
  EXPECT_EQ(b.qs[3], 0);
}

TEST(Quants, AllZeroBlocksQuantiseToZero) {
  const float x[32] = {};
  uint8_t buf[64];
  for (auto [t, fn] : std::vector<std::pair<DType, void (*)(const float*, void*, int64_t)>>{
           {DType::kQ8_0, QuantizeRowQ8_0},
           {DType::kQ4_0, QuantizeRowQ4_0},
           {DType::kQ4_1, QuantizeRowQ4_1},
           {DType::kQ5_0, QuantizeRowQ5_0},
           {DType::kQ5_1, QuantizeRowQ5_1}}) {
    fn(x, buf, 32);
    EXPECT_EQ(Dequant(t, buf, 32), std::vector<float>(32, 0.0f)) << DTypeName(t);
  }
}

// Random data: each quantiser's round-trip error stays within its step (half a step when rounding to nearest,
// a full step where ggml clamps the top level: Q4_0/Q5_0 on the side opposite the largest magnitude), plus
// the fp16 rounding of the stored min.
TEST(Quants, QuantiseRoundTripError) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 32 * 64;
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  struct Case {
    DType t;
    void (*fn)(const float*, void*, int64_t);
    bool affine;   // d and min (Q4_1/Q5_1) or symmetric around 0
    float levels;  // affine: steps across [min, max]; symmetric: steps per amax
    float factor;  // allowed error in steps
  };
  for (const Case& c : {Case{DType::kQ8_0, QuantizeRowQ8_0, false, 127, 0.6f},
                        Case{DType::kQ4_0, QuantizeRowQ4_0, false, 8, 1.01f},
                        Case{DType::kQ5_0, QuantizeRowQ5_0, false, 16, 1.01f},
                        Case{DType::kQ4_1, QuantizeRowQ4_1, true, 15, 0.55f},
                        Case{DType::kQ5_1, QuantizeRowQ5_1, true, 31, 0.55f}}) {
    std::vector<uint8_t> q(n / 32 * GetDTypeInfo(c.t).block_bytes);
    c.fn(x.data(), q.data(), n);
    const auto y = Dequant(c.t, q.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = lo;
      for (int j = 0; j < 32; ++j) lo = std::min(lo, x[b * 32 + j]), hi = std::max(hi, x[b * 32 + j]);
      const float amax = std::max(std::fabs(lo), std::fabs(hi));
      const float step = c.affine ? (hi - lo) / c.levels : amax / c.levels;
      const float tol = c.factor * step + (c.affine ? std::fabs(lo) / 1024 : 0.0f);
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), tol)
            << DTypeName(c.t) << " block " << b << " j " << j;
      }
    }
  }
}

// The simple K encoders on exact grids: every sub-block's scale (and min) is a different 6-bit multiple (the
// high bits of Q4_K's packed scales are used) and every code appears, so any packing error changes a value.
TEST(Quants, QuantizeQ4_KSimpleExactGrid) {
  std::vector<float> x(256);
  for (int s = 0; s < 8; ++s) {
    const int sc = 63 - s, mn = 63 - 2 * s;  // d = dmin = 2^-6 (set by sub-block 0)
    for (int l = 0; l < 32; ++l) {
      const int q = (l * 7 + s) % 16;
      x[32 * s + l] = std::ldexp(static_cast<float>(q * sc - mn), -6);
    }
  }
  BlockQ4_K b;
  QuantizeRowQ4_KSimple(x.data(), &b, 256);
  EXPECT_EQ(b.d, Fp32ToFp16(1.f / 64));
  EXPECT_EQ(b.dmin, Fp32ToFp16(1.f / 64));
  EXPECT_EQ(Dequant(DType::kQ4_K, &b, 256), x);
}

TEST(Quants, QuantizeQ6_KSimpleExactGrid) {
  std::vector<float> x(256);
  for (int s = 0; s < 16; ++s) {
    const int sc = 127 - 3 * s;  // d = 2^-10 (set by sub-block 0)
    for (int l = 0; l < 16; ++l) {
      const int q = l == 0 ? (s % 2 ? 31 : -31) : (l * 5 + s) % 63 - 31;
      x[16 * s + l] = std::ldexp(static_cast<float>(q * sc), -10);
    }
  }
  BlockQ6_K b;
  QuantizeRowQ6_KSimple(x.data(), &b, 256);
  EXPECT_EQ(b.d, Fp32ToFp16(1.f / 1024));
  EXPECT_EQ(Dequant(DType::kQ6_K, &b, 256), x);
}

// On random values they stay within a few percent (RMS) of the input.
TEST(Quants, QuantizeKSimpleRoundTripsRandomRows) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(4096);
  for (float& v : x) v = nd(rng);
  for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
    std::vector<uint8_t> q(x.size() / 256 * (t == DType::kQ4_K ? sizeof(BlockQ4_K) : sizeof(BlockQ6_K)));
    if (t == DType::kQ4_K) {
      QuantizeRowQ4_KSimple(x.data(), q.data(), static_cast<int64_t>(x.size()));
    } else {
      QuantizeRowQ6_KSimple(x.data(), q.data(), static_cast<int64_t>(x.size()));
    }
    const std::vector<float> y = Dequant(t, q.data(), static_cast<int64_t>(x.size()));
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (y[i] - x[i]) * (y[i] - x[i]), ref += x[i] * x[i];
    EXPECT_LT(std::sqrt(err / ref), t == DType::kQ4_K ? 0.12 : 0.04) << (t == DType::kQ4_K ? "Q4_K" : "Q6_K");
  }
}

}  // namespace
}  // namespace stoke::cpu
