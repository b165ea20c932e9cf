// The GPU's K-quant block code (kernels/cuda/kquant_blocks.h: what quant.cu's dequantiser and fused-dequant
// GEMV run per value and per lane) compiled for the CPU and checked here against the CPU reference: every
// value bit for bit against cpu::DequantizeRow, each lane's part of the GEMV against a double-precision dot
// product, the parts' activation offsets covering each super-block exactly once, and the int8-activation parts
// (quantiser and integer dots) against cpu::QuantizeActsRow and cpu::MatMul's integer path. Built with
// -ffp-contract=off, as quants.cc.
#include "kernels/cuda/kquant_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/qdot.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

void PutHalf(uint8_t* p, uint16_t h) {
  std::memcpy(p, &h, 2);
}

// `nb` random super-blocks of t: random bytes, then sane scales; the first blocks get a subnormal, a zero and
// a negative d so the fp16 decoding is exercised beyond the normal range.
std::vector<uint8_t> RandomBlocks(DType t, int nb, uint32_t seed) {
  const int bytes = t == DType::kQ4_K ? kquant::kQ4KBytes : kquant::kQ6KBytes;
  std::vector<uint8_t> w(static_cast<size_t>(nb) * bytes);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.0005f, 0.005f);
  for (int b = 0; b < nb; ++b) {
    uint8_t* blk = w.data() + static_cast<size_t>(b) * bytes;
    uint16_t d = Fp32ToFp16(scale(rng));
    if (b == 0) d = 0x0003;  // subnormal
    if (b == 1) d = 0x0000;
    if (b == 2) d = Fp32ToFp16(-scale(rng));
    if (t == DType::kQ4_K) {
      PutHalf(blk, d);
      PutHalf(blk + 2, Fp32ToFp16(scale(rng)));  // dmin
    } else {
      PutHalf(blk + kquant::kQ6KD, d);
    }
  }
  return w;
}

// The GEMV's integer-free code conversion: every code a nibble, a Q6_K value or a shifted high nibble can
// take comes out exact, with and without Q6_K's offset of 32.
TEST(KQuantCodeToFloat, IsExactForEveryCode) {
  for (uint32_t c = 0; c < 4096; ++c) {
    ASSERT_EQ(kquant::CodeToFloat(c), static_cast<float>(c)) << c;
    ASSERT_EQ(kquant::CodeToFloat(c, kquant::kMagic + 32.f), static_cast<float>(c) - 32.f) << c;
  }
}

class KQuantBlocks : public testing::TestWithParam<DType> {};

TEST_P(KQuantBlocks, EveryValueIsBitExactWithDequantizeRow) {
  const DType t = GetParam();
  const int nb = 24;
  const std::vector<uint8_t> w = RandomBlocks(t, nb, 1);
  std::vector<float> want(nb * kquant::kValues);
  ASSERT_TRUE(DequantizeRow(t, w.data(), want.data(), static_cast<int64_t>(want.size())).ok());
  const int bytes = t == DType::kQ4_K ? kquant::kQ4KBytes : kquant::kQ6KBytes;
  int differ = 0;
  for (int b = 0; b < nb; ++b) {
    for (int i = 0; i < kquant::kValues; ++i) {
      const uint8_t* blk = w.data() + static_cast<size_t>(b) * bytes;
      const float got = t == DType::kQ4_K ? kquant::Q4KValue(blk, i) : kquant::Q6KValue(blk, i);
      const float ref = want[b * kquant::kValues + i];
      if (std::memcmp(&got, &ref, 4) != 0) {
        if (++differ <= 5) ADD_FAILURE() << "block " << b << " value " << i << ": " << got << " vs " << ref;
      }
    }
  }
  EXPECT_EQ(differ, 0);
}

TEST_P(KQuantBlocks, PartsCoverEachValueOnce) {
  const DType t = GetParam();
  std::vector<int> seen(kquant::kValues, 0);
  for (int p = 0; p < kquant::kPartsPerBlock; ++p) {
    if (t == DType::kQ4_K) {
      for (int k = 0; k < 16; ++k) {
        ++seen[kquant::Q4KPartA(p) + k];
        ++seen[kquant::Q4KPartA(p) + 32 + k];
      }
    } else {
      for (int g = 0; g < 4; ++g) {
        for (int k = 0; k < 8; ++k) ++seen[kquant::Q6KPartX(p, g) + k];
      }
    }
  }
  for (int i = 0; i < kquant::kValues; ++i) EXPECT_EQ(seen[i], 1) << "value " << i;
}

// The eight parts' dots summed over a row of super-blocks equal Σ DequantizeRow(w)·x to fp32 accumulation
// error.
TEST_P(KQuantBlocks, PartDotsSumToTheRowDot) {
  const DType t = GetParam();
  const int nb = 16;
  const std::vector<uint8_t> w = RandomBlocks(t, nb, 2);
  std::vector<float> wf(nb * kquant::kValues), x(wf.size());
  ASSERT_TRUE(DequantizeRow(t, w.data(), wf.data(), static_cast<int64_t>(wf.size())).ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  const int bytes = t == DType::kQ4_K ? kquant::kQ4KBytes : kquant::kQ6KBytes;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w.data() + static_cast<size_t>(b) * bytes;
    const float* xb = x.data() + b * kquant::kValues;
    double want = 0, mag = 0;
    for (int i = 0; i < kquant::kValues; ++i) {
      want += static_cast<double>(wf[b * kquant::kValues + i]) * xb[i];
      mag += std::fabs(static_cast<double>(wf[b * kquant::kValues + i]) * xb[i]);
    }
    double got = 0;
    for (int p = 0; p < kquant::kPartsPerBlock; ++p) {
      if (t == DType::kQ4_K) {
        float xa[16], xc[16];
        std::memcpy(xa, xb + kquant::Q4KPartA(p), sizeof(xa));
        std::memcpy(xc, xb + kquant::Q4KPartA(p) + 32, sizeof(xc));
        got += kquant::Q4KPartDot(blk, p, xa, xc);
      } else {
        float xg[4][8];
        for (int g = 0; g < 4; ++g) std::memcpy(xg[g], xb + kquant::Q6KPartX(p, g), sizeof(xg[g]));
        got += kquant::Q6KPartDot(blk, p, xg);
      }
    }
    // The mins make Q4_K's partial sums cancel: bound by the magnitude of the terms, not of the result.
    EXPECT_NEAR(got, want, 1e-5 * mag + 1e-30) << "block " << b;
  }
}

// The int8-activation GEMV's quantiser on a lane's piece of a 32-block (16 values for Q4_K, 8 for Q6_K),
// given the block's |max|: codes, scale and code sums bit for bit those of cpu::QuantizeActsRow, including an
// all-zero block and exact ties.
TEST(KQuantInt8Acts, PiecesQuantiseAsQuantizeActsRow) {
  const int k = 256;
  std::vector<float> x(k);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (int i = 32; i < 64; ++i) x[i] = 0.f;              // an all-zero block
  for (int i = 64; i < 96; ++i) x[i] = (i - 80) * 0.5f;  // amax 8: codes at x * 127 / 8, some exact ties
  std::vector<int8_t> qs(k);
  std::vector<float> d(k / 32), s(k / 32);
  QuantizeActsRow(x.data(), k, qs.data(), d.data(), s.data());
  for (int b = 0; b < k / 32; ++b) {
    const float amax = kquant::AbsMax(x.data() + 32 * b, 32);
    EXPECT_EQ(kquant::ActScale(amax), d[b]) << "block " << b;
    // The block in pieces of N values (the Q4_K lanes' 16, the Q6_K lanes' 8): each piece's codes are
    // QuantizeActsRow's, and the pieces' code sums add up to the same total.
    const auto pieces = [&]<int N>(std::integral_constant<int, N>) {
      int sum = 0;
      for (int piece = 0; piece < 32 / N; ++piece) {
        uint32_t q[N / 4];
        sum += kquant::QuantizeActs<N>(x.data() + 32 * b + N * piece, amax, q);
        for (int i = 0; i < N; ++i) {
          EXPECT_EQ(static_cast<int8_t>(q[i / 4] >> (8 * (i % 4))), qs[32 * b + N * piece + i])
              << "block " << b << ", piece of " << N << " " << piece << ", value " << i;
        }
      }
      return sum;
    };
    const int sum16 = pieces(std::integral_constant<int, 16>{});
    EXPECT_EQ(sum16, pieces(std::integral_constant<int, 8>{})) << "block " << b;
    EXPECT_EQ(d[b] * static_cast<float>(sum16), s[b]) << "block " << b;
  }
}

// A row of super-blocks through the int8-activation parts, as a warp computes it (each 32-block's |max| over
// the whole block, as the lanes' shuffles give it), against cpu::MatMul over the same blocks, which quantises
// the activations the same way: equal but for the order of the fp32 sums.
TEST_P(KQuantBlocks, Int8ActivationPartsSumToTheCpuIntegerDot) {
  const DType t = GetParam();
  const int nb = 16, k = nb * kquant::kValues;
  const std::vector<uint8_t> w = RandomBlocks(t, nb, 4);
  std::vector<float> x(k), wf(k);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng) * 3.f;
  float want = 0.f;
  ASSERT_TRUE(MatMul(x.data(), 1, k, w.data(), t, 1, &want).ok());
  ASSERT_TRUE(DequantizeRow(t, w.data(), wf.data(), k).ok());
  double mag = 0;
  for (int i = 0; i < k; ++i) mag += std::fabs(static_cast<double>(wf[i]) * x[i]);
  const int bytes = t == DType::kQ4_K ? kquant::kQ4KBytes : kquant::kQ6KBytes;
  double got = 0;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* blk = w.data() + static_cast<size_t>(b) * bytes;
    const float* xb = x.data() + b * kquant::kValues;
    const auto block_max = [&](int offset) { return kquant::AbsMax(xb + offset / 32 * 32, 32); };
    for (int p = 0; p < kquant::kPartsPerBlock; ++p) {
      if (t == DType::kQ4_K) {
        const int a = kquant::Q4KPartA(p);
        const float ma = block_max(a), mc = block_max(a + 32);
        uint32_t qa[4], qc[4], head[4], qsw[4];
        const int sa = kquant::QuantizeActs<16>(xb + a, ma, qa),
                  sc = kquant::QuantizeActs<16>(xb + a + 32, mc, qc);
        kquant::Q4KLoadPart(blk, p, head, qsw);
        got += kquant::Q4KPartDotQ8(head, qsw, p, qa, qc, kquant::ActScale(ma), kquant::ActScale(mc), sa, sc);
      } else {
        uint32_t qx[4][2];
        float dx[4];
        int sx[4];
        for (int g = 0; g < 4; ++g) {
          const int o = kquant::Q6KPartX(p, g);
          const float m = block_max(o);
          sx[g] = kquant::QuantizeActs<8>(xb + o, m, qx[g]);
          dx[g] = kquant::ActScale(m);
        }
        got += kquant::Q6KPartDotQ8(blk, p, qx, dx, sx);
      }
    }
  }
  EXPECT_NEAR(got, want, 1e-7 * mag) << "mag " << mag;
  // The int8 activations move the result off the fp32 dot by far more than that (so the check above is not
  // passing on the fp32 path's numbers).
  double exact = 0;
  for (int i = 0; i < k; ++i) exact += static_cast<double>(wf[i]) * x[i];
  EXPECT_GT(std::fabs(exact - want), 1e-5 * mag);
}

INSTANTIATE_TEST_SUITE_P(Q4KAndQ6K, KQuantBlocks, testing::Values(DType::kQ4_K, DType::kQ6_K),
                         [](const testing::TestParamInfo<DType>& i) {
                           return std::string(i.param == DType::kQ4_K ? "Q4_K" : "Q6_K");
                         });

}  // namespace
}  // namespace stoke::cpu
