// The walk's stop rule (WalkValues), on made-up goodput curves: no server, no timing.
#include "tools/tune/tuner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace stoke::tune {
namespace {

struct Curve {
  std::vector<double> scores;
  int measured = 0;
  std::optional<double> operator()(size_t i) {
    ++measured;
    return scores[i];
  }
};

std::string Name(size_t i) {
  return "v" + std::to_string(i);
}

TEST(TuneWalkTest, StopsAtTheFirstValueThatGainsLessThanFivePercent) {
  Curve c{{100, 200, 205, 400}};  // v2 gains 2.5 %: stop there, never measure v3
  std::string why;
  EXPECT_EQ(WalkValues(4, 50, 0.05, std::ref(c), Name, &why), 1);
  EXPECT_EQ(c.measured, 3);
  EXPECT_NE(why.find("v2 gains +2.5 %"), std::string::npos) << why;
}

TEST(TuneWalkTest, GoesOnWhileNothingMeetsTheSlo) {
  Curve c{{0, 0, 120, 130}};  // rejected points score 0
  std::string why;
  EXPECT_EQ(WalkValues(4, 0, 0.05, std::ref(c), Name, &why), 3);
  EXPECT_EQ(c.measured, 4);
  EXPECT_EQ(why, "every value measured");
}

TEST(TuneWalkTest, ClimbsFromBelowThePreviousBest) {
  Curve c{{90, 500}};  // batch 1 after a baseline of batch 32: worse than the baseline, yet the climb goes on
  std::string why;
  EXPECT_EQ(WalkValues(2, 100, 0.05, std::ref(c), Name, &why), 1);
  EXPECT_EQ(c.measured, 2);
}

TEST(TuneWalkTest, StopsWhereTheClimbFlattensAndKeepsTheReferenceItNeverBeat) {
  Curve c{{50, 80, 82, 400}};  // v2 gains 2.5 % over v1: stop; none of them beat 100
  std::string why;
  EXPECT_EQ(WalkValues(4, 100, 0.05, std::ref(c), Name, &why), -1);
  EXPECT_EQ(c.measured, 3);
  EXPECT_NE(why.find("v2 gains +2.5 % goodput over v1"), std::string::npos) << why;
  EXPECT_NE(why.find("no value beat the previous step's best"), std::string::npos) << why;
}

TEST(TuneWalkTest, AFallToRejectedStopsTheClimb) {
  Curve c{{100, 0, 300}};  // the next batch size breaks the SLO (scores 0): larger ones will not do better
  std::string why;
  EXPECT_EQ(WalkValues(3, 50, 0.05, std::ref(c), Name, &why), 0);
  EXPECT_EQ(c.measured, 2);
}

TEST(TuneWalkTest, UnorderedValuesAreAllMeasured) {
  Curve c{{90, 300, 310}};  // queue delays: a worse first value does not stop the step
  std::string why;
  EXPECT_EQ(WalkValues(3, 100, 0.05, std::ref(c), Name, &why, /*ordered=*/false), 1);
  EXPECT_EQ(c.measured, 3);
  EXPECT_EQ(why, "every value measured");
}

TEST(TuneWalkTest, StopsWhenTheBudgetIsSpent) {
  int calls = 0;
  std::string why;
  auto measure = [&](size_t i) -> std::optional<double> {
    ++calls;
    if (i == 1) return std::nullopt;
    return 100.0;
  };
  EXPECT_EQ(WalkValues(3, 0, 0.05, measure, Name, &why), 0);
  EXPECT_EQ(calls, 2);
  EXPECT_NE(why.find("budget"), std::string::npos);
}

TEST(TuneWalkTest, NoValueMeetsTheSlo) {
  Curve c{{0, 0}};
  std::string why;
  EXPECT_EQ(WalkValues(2, 0, 0.05, std::ref(c), Name, &why), -1);
  EXPECT_EQ(why, "no value meets the SLO");
}

TEST(TuneOptionsTest, ServeArgsMayNotSetWhatTuneSets) {
  TuneOptions o;
  o.slos.p99_ms = 50;
  o.batch_sizes = {1};
  o.queue_delays_us = {0};
  o.instance_counts = {1};
  o.max_num_seqs = {8};
  o.max_num_batched_tokens = {512};
  o.serve_args = {"--gemm-cache", "g.json", "--no-prefix-cache"};
  EXPECT_TRUE(ValidateTuneOptions(o).ok());
  for (const char* a : {"--max-num-seqs", "--port=9000", "--config", "--device"}) {
    o.serve_args = {a, "1"};
    const Status s = ValidateTuneOptions(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << a;
    EXPECT_NE(s.message().find("tune sets"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace stoke::tune
