#include "telemetry/ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

namespace stoke {
namespace {

using ::testing::HasSubstr;

TEST(LedgerTest, VocabularyIsOneListOfDistinctNames) {
  std::set<std::string> names;
  for (int i = 0; i < kNumLedgerStages; ++i) names.insert(LedgerStageName(static_cast<LedgerStage>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumLedgerStages));
  for (const char* n : {"recv", "queue", "preprocess", "h2d", "compute", "d2h", "postprocess", "send",
                        "prefill", "decode", "schedule", "interleave", "other"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  // Generation shows compute split; classic shows the copies; both end with other.
  auto gen = LedgerStages(LedgerKind::kGeneration);
  auto classic = LedgerStages(LedgerKind::kClassic);
  EXPECT_EQ(gen.back(), LedgerStage::kOther);
  EXPECT_EQ(classic.back(), LedgerStage::kOther);
  EXPECT_EQ(std::count(gen.begin(), gen.end(), LedgerStage::kCompute), 0);
  EXPECT_EQ(std::count(gen.begin(), gen.end(), LedgerStage::kDecode), 1);
  EXPECT_EQ(std::count(classic.begin(), classic.end(), LedgerStage::kH2d), 1);
  EXPECT_EQ(std::count(classic.begin(), classic.end(), LedgerStage::kInterleave), 0);
}

TEST(LedgerTest, CloseMakesTheStagesSumToE2e) {
  Ledger l;
  l[LedgerStage::kRecv] = 100;
  l[LedgerStage::kQueue] = 2000;
  l[LedgerStage::kCompute] = 30000;
  l[LedgerStage::kSend] = 400;
  l.Close(33000);
  EXPECT_EQ(l[LedgerStage::kOther], 500);
  Nanos sum = 0;
  for (Nanos v : l.ns) sum += v;
  EXPECT_EQ(sum, l.e2e);
  // Over-attributed (overlapping measurements): other goes negative and the sum still holds.
  l.Close(32000);
  EXPECT_EQ(l[LedgerStage::kOther], -500);
  EXPECT_EQ(l.Attributed() + l[LedgerStage::kOther], 32000);
}

TEST(LedgerTest, HeaderAndJsonInMillisecondsWithTheKindsStages) {
  Ledger l;
  l.kind = LedgerKind::kGeneration;
  l[LedgerStage::kRecv] = 12'000;           // 0.012 ms
  l[LedgerStage::kDecode] = 250'000'000;    // 250 ms
  l[LedgerStage::kInterleave] = 1'234'567;  // 1.235 ms (rounded)
  l.Close(260'000'000);
  const std::string h = LedgerHeaderValue(l);
  EXPECT_THAT(h, HasSubstr("recv=0.012;"));
  EXPECT_THAT(h, HasSubstr("decode=250.000;"));
  EXPECT_THAT(h, HasSubstr("interleave=1.235;"));
  EXPECT_THAT(h, HasSubstr("prefill=0.000;"));
  EXPECT_THAT(h, ::testing::EndsWith(";e2e=260.000"));
  EXPECT_THAT(h, ::testing::Not(HasSubstr("h2d")));
  EXPECT_THAT(h, ::testing::Not(HasSubstr("compute")));
  const std::string j = LedgerJson(l);
  EXPECT_THAT(j, ::testing::StartsWith(R"({"e2e_ms":260.000,"stages_ms":{"recv":0.012,)"));
  EXPECT_THAT(j, HasSubstr(R"("other":8.753)"));

  Ledger c;  // classic
  c.Close(1'000'000);
  EXPECT_THAT(LedgerHeaderValue(c), HasSubstr("h2d=0.000;compute=0.000;d2h=0.000;"));
  EXPECT_THAT(LedgerHeaderValue(c), ::testing::Not(HasSubstr("decode")));
}

TEST(LedgerTest, RequestedValues) {
  for (const char* v : {"1", "true", "TRUE", "yes", "on"}) EXPECT_TRUE(LedgerRequested(v)) << v;
  for (const char* v : {"", "0", "false", "no", "2"}) EXPECT_FALSE(LedgerRequested(v)) << v;
}

}  // namespace
}  // namespace stoke
