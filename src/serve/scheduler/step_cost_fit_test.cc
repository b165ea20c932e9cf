#include "serve/scheduler/step_cost_fit.h"

#include <gtest/gtest.h>


namespace stoke {
namespace {

// Steps costing exactly 2 ms + 20 us per token + 10 ns per KV position: the fit recovers the three
// coefficients, and the prefill budget is what fits the target after the decodes.
TEST(StepCostFitTest, RecoversALinearCostAndBudgetsTheRest) {
  StepCostFit fit;
  auto cost = [](double tokens, double kv) { return 2e-3 + 20e-6 * tokens + 10e-9 * kv; };
  for (int i = 0; i < 200; ++i) {
    const double decodes = 32 + (i * 37) % 200, prefill = (i * 53) % 700, kv = decodes * (500 + (i * 13) % 900);
    fit.Add(decodes + prefill, kv + prefill, cost(decodes + prefill, kv + prefill));
  }
  const auto c = fit.coefficients();
  EXPECT_NEAR(c[0], 2e-3, 1e-9);
  EXPECT_NEAR(c[1], 20e-6, 1e-11);
  EXPECT_NEAR(c[2], 10e-9, 1e-13);
  EXPECT_NEAR(fit.Predict(100, 1e5), cost(100, 1e5), 1e-9);
  // 64 decodes reading 64,000 positions: 2 + 1.28 + 0.64 = 3.92 ms; a 10 ms target leaves 6.08 ms for prefill.
  const auto room = fit.Room(10e-3, 64, 64000, /*min_tokens=*/16);
  ASSERT_TRUE(room.has_value());
  EXPECT_NEAR(room->seconds, 6.08e-3, 1e-9);
  EXPECT_NEAR(room->per_token, 20e-6, 1e-11);
  EXPECT_NEAR(room->per_kv_position, 10e-9, 1e-13);
  EXPECT_EQ(room->min_tokens, 16);
  // Decodes alone over the target: no room (the scheduler still gives the first chunk its minimum).
  EXPECT_LT(fit.Room(3e-3, 64, 64000, 16)->seconds, 0);
}

TEST(StepCostFitTest, NoRoomUntilEnoughStepsAndFollowsADrift) {
  StepCostFit fit(/*decay=*/0.9);
  EXPECT_FALSE(fit.Room(1e-3, 1, 10, 16).has_value());
  for (int i = 0; i < 8; ++i) fit.Add(100 + 10 * i, 1000 + 300 * i, 1e-3 + 1e-6 * (100 + 10 * i));
  EXPECT_TRUE(fit.Room(1e-3, 1, 10, 16).has_value());
  // The machine gets twice as slow per token: after a few dozen steps the fit has moved with it.
  for (int i = 0; i < 100; ++i) {
    fit.Add(100 + 10 * (i % 9), 1000 + 300 * (i % 7), 1e-3 + 2e-6 * (100 + 10 * (i % 9)));
  }
  EXPECT_NEAR(fit.coefficients()[1], 2e-6, 1e-8);
}

TEST(StepCostFitTest, ADegenerateFitGivesNoNegativeCosts) {
  StepCostFit fit;
  for (int i = 0; i < 20; ++i) fit.Add(10, 100, 5e-3);  // nothing varies: the cost is all constant
  const auto room = fit.Room(1e-3, 1, 10, 16);
  ASSERT_TRUE(room.has_value());
  EXPECT_GE(room->per_token, 0);
  EXPECT_GE(room->per_kv_position, 0);
}

}  // namespace
}  // namespace stoke
