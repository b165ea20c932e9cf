// The gate's metrics on hand-computed cases.
#include "tools/precision/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace stoke::precision {
namespace {

TEST(LogitComparisonTest, IdenticalLogitsAgreeFully) {
  const std::vector<float> a = {1, 2, 3, 0, 5, -1};  // 2 rows x 3
  LogitComparison cmp;
  const std::vector<int32_t> next = {2, 0};
  cmp.Add(a, a, 2, 3, next);
  EXPECT_EQ(cmp.positions(), 2);
  EXPECT_DOUBLE_EQ(cmp.top1_agreement(), 1.0);
  EXPECT_NEAR(cmp.mean_kl(), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(cmp.reference_perplexity(), cmp.candidate_perplexity());
}

TEST(LogitComparisonTest, KlTop1AndPerplexityByHand) {
  // Row: reference p = softmax(0, log 3) = (1/4, 3/4); candidate q = (1/2, 1/2).
  const std::vector<float> ref = {0.0f, static_cast<float>(std::log(3.0))};
  const std::vector<float> cand = {0.0f, 0.0f};
  LogitComparison cmp;
  const std::vector<int32_t> next = {1};
  cmp.Add(ref, cand, 1, 2, next);
  const double kl = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
  EXPECT_NEAR(cmp.mean_kl(), kl, 1e-7);
  EXPECT_DOUBLE_EQ(cmp.top1_agreement(), 0.0);  // argmax 1 against 0 (tie: lowest id)
  EXPECT_NEAR(cmp.reference_perplexity(), 4.0 / 3.0, 1e-6);
  EXPECT_NEAR(cmp.candidate_perplexity(), 2.0, 1e-6);
}

TEST(LogitComparisonTest, RowsWithoutNextTokenCountOnlyForAgreement) {
  const std::vector<float> a = {3, 1, 1, 3};
  LogitComparison cmp;
  const std::vector<int32_t> next = {0, -1};
  cmp.Add(a, a, 2, 2, next);
  EXPECT_EQ(cmp.positions(), 2);
  // Perplexity from the first row only: p(0) = e^3 / (e^3 + e).
  EXPECT_NEAR(cmp.reference_perplexity(), (std::exp(3.0) + std::exp(1.0)) / std::exp(3.0), 1e-6);
}

TEST(GreedyPrefixAgreementTest, PrefixOverLongest) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 9, 4}, c = {1, 2};
  EXPECT_DOUBLE_EQ(GreedyPrefixAgreement(a, a), 1.0);
  EXPECT_DOUBLE_EQ(GreedyPrefixAgreement(a, b), 0.5);  // the 4 after the divergence does not count
  EXPECT_DOUBLE_EQ(GreedyPrefixAgreement(a, c), 0.5);
  EXPECT_DOUBLE_EQ(GreedyPrefixAgreement({}, {}), 1.0);
}

TEST(CosineTest, Values) {
  const std::vector<float> a = {1, 0}, b = {0, 2}, c = {2, 0}, z = {0, 0};
  EXPECT_DOUBLE_EQ(Cosine(a, c), 1.0);
  EXPECT_DOUBLE_EQ(Cosine(a, b), 0.0);
  EXPECT_DOUBLE_EQ(Cosine(a, z), 0.0);
  const std::vector<float> d = {1, 1};
  EXPECT_NEAR(Cosine(a, d), std::sqrt(0.5), 1e-12);
}

}  // namespace
}  // namespace stoke::precision
