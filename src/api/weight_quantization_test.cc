// --quantization's values: none, fp8 and int8 parse and name themselves back; anything else is
// InvalidArgument naming the value.
#include "api/weight_quantization.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

TEST(WeightQuantizationTest, ParsesEveryValueAndNamesItBack) {
  for (WeightQuantization q :
       {WeightQuantization::kNone, WeightQuantization::kFp8, WeightQuantization::kInt8}) {
    auto parsed = ParseWeightQuantization(WeightQuantizationName(q));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, q);
  }
  EXPECT_EQ(WeightQuantizationName(WeightQuantization::kNone), "none");
  EXPECT_EQ(WeightQuantizationName(WeightQuantization::kFp8), "fp8");
  EXPECT_EQ(WeightQuantizationName(WeightQuantization::kInt8), "int8");
}

TEST(WeightQuantizationTest, OthersAreInvalid) {
  for (const char* bad : {"", "FP8", "INT8", "e4m3", "q4_1", "bf16"}) {
    auto r = ParseWeightQuantization(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace stoke
