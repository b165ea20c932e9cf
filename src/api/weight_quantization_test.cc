// --quantization's values: none and fp8 parse and name themselves back; int8 is named but Unimplemented;
// anything else is InvalidArgument naming the value.
#include "api/weight_quantization.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

TEST(WeightQuantizationTest, ParsesNoneAndFp8AndNamesThemBack) {
  for (WeightQuantization q : {WeightQuantization::kNone, WeightQuantization::kFp8}) {
    auto parsed = ParseWeightQuantization(WeightQuantizationName(q));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, q);
  }
  EXPECT_EQ(WeightQuantizationName(WeightQuantization::kNone), "none");
  EXPECT_EQ(WeightQuantizationName(WeightQuantization::kFp8), "fp8");
}

TEST(WeightQuantizationTest, Int8IsUnimplementedAndOthersInvalid) {
  auto int8 = ParseWeightQuantization("int8");
  EXPECT_EQ(int8.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(int8.status().message().find("int8"), std::string::npos);
  for (const char* bad : {"", "FP8", "e4m3", "q4_1", "bf16"}) {
    auto r = ParseWeightQuantization(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace stoke
