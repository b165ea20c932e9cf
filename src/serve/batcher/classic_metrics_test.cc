#include "serve/batcher/classic_metrics.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

// A request's timeline (ns): first byte 1000, parsed 1200, queued 1500 (after Prepare), its batch dispatched
// at 4000 and started at 4100, the batch's stages 100 + 200 + 3000 + 300 + 150 = 3750 of the 3900 it ran
// (4100 -> 8000), outputs ready at 8000, last byte written at 8600.
TEST(ClassicLedgerTest, StagesSumToTheRequestsLatency) {
  RequestTimes t;
  t.enqueue = 1500;
  t.dispatch = 4000;
  t.start = 4100;
  t.done = 8000;
  t.exec = {.preprocess = 100, .h2d = 200, .compute = 3000, .d2h = 300, .postprocess = 150};
  const Ledger l = RequestLedger(1000, 1200, t, 8600);
  using S = LedgerStage;
  EXPECT_EQ(l.kind, LedgerKind::kClassic);
  EXPECT_EQ(l[S::kRecv], 200);
  EXPECT_EQ(l[S::kPreprocess], 300 + 100);  // Prepare on the net thread + batch assembly
  EXPECT_EQ(l[S::kQueue], 2600);            // queued -> its batch started
  EXPECT_EQ(l[S::kH2d], 200);
  EXPECT_EQ(l[S::kCompute], 3000);
  EXPECT_EQ(l[S::kD2h], 300);
  EXPECT_EQ(l[S::kPostprocess], 150);
  EXPECT_EQ(l[S::kSend], 600);
  EXPECT_EQ(l[S::kOther], 150);  // the instance's time outside its measured stages
  EXPECT_EQ(l.e2e, 7600);
  Nanos sum = 0;
  for (LedgerStage s : LedgerStages(LedgerKind::kClassic)) sum += l[s];
  EXPECT_EQ(sum, l.e2e);
  for (S s : {S::kPrefill, S::kDecode, S::kSchedule, S::kInterleave}) EXPECT_EQ(l[s], 0);
}

TEST(ClassicLedgerTest, UnmeasuredParseTimeCountsAsPreprocess) {
  RequestTimes t;
  t.enqueue = 1500;
  t.dispatch = 2000;  // no start recorded: queue ends at dispatch
  t.done = 3000;
  const Ledger l = RequestLedger(1000, 0, t, 3500);
  EXPECT_EQ(l[LedgerStage::kRecv], 0);
  EXPECT_EQ(l[LedgerStage::kPreprocess], 500);
  EXPECT_EQ(l[LedgerStage::kQueue], 500);
  EXPECT_EQ(l.Attributed() + l[LedgerStage::kOther], 2500);
}

}  // namespace
}  // namespace stoke
