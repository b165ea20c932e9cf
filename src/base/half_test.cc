#include "base/half.h"

#include <gtest/gtest.h>

#include <cmath>

namespace stoke {
namespace {

TEST(HalfTest, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(f))));
      continue;
    }
    EXPECT_EQ(Fp32ToFp16(f), h) << std::hex << h;
  }
}

TEST(HalfTest, Fp16KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7c00)));
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(HalfTest, Bf16) {
  EXPECT_EQ(Bf16ToFp32(0x3f80), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(Bf16ToFp32(0x4049)), 0x4049);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(NAN))));
}

}  // namespace
}  // namespace stoke
