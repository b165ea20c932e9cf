#include "tools/bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tools/bench/aggregate.h"

namespace stoke::bench {
namespace {

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  Summary s = Summarize(v);
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_DOUBLE_EQ(s.p50, 50.5);  // numpy.percentile(range(1, 101), 50)
  EXPECT_DOUBLE_EQ(s.p90, 90.1);
  EXPECT_DOUBLE_EQ(s.p99, 99.01);
  std::vector<double> one{7};
  EXPECT_DOUBLE_EQ(Summarize(one).p99, 7);
  std::vector<double> none;
  EXPECT_EQ(Summarize(none).count, 0);
}

TEST(Stats, LogHistogramCountsEveryPositiveValue) {
  std::vector<double> v{0.5, 1, 2, 10, 10, 99, 0};
  Histogram h = LogHistogram(v, 10);
  ASSERT_EQ(h.counts.size() + 1, h.edges.size());
  int64_t total = 0;
  for (int64_t c : h.counts) total += c;
  EXPECT_EQ(total, 6);  // the zero is skipped
  EXPECT_LE(h.edges.front(), 0.5);
  EXPECT_GE(h.edges.back(), 99);
}

WindowStats W(double rps, double p99) {
  WindowStats w;
  w.completed = 10;
  w.requests_per_s = rps;
  w.p99_ms = p99;
  return w;
}

TEST(Stats, StabilityNeedsThreeWindowsWithinTolerance) {
  EXPECT_FALSE(WindowsStable({W(10, 100), W(10, 100)}, 3, 0.1));
  EXPECT_TRUE(WindowsStable({W(5, 500), W(10, 100), W(10.5, 105), W(10.2, 108)}, 3, 0.1));
  EXPECT_FALSE(WindowsStable({W(10, 100), W(10, 100), W(12, 100)}, 3, 0.1));  // throughput 1.2x
  EXPECT_FALSE(WindowsStable({W(10, 100), W(10, 100), W(10, 130)}, 3, 0.1));  // p99 1.3x
  WindowStats empty;
  EXPECT_FALSE(WindowsStable({W(10, 100), W(10, 100), empty}, 3, 0.1));
}

RequestRecord Req(double sched_ms, double ttft_ms, double e2e_ms, int out_tokens, std::string error = "") {
  RequestRecord r;
  r.scheduled = static_cast<Nanos>(sched_ms * 1e6);
  r.sent = r.scheduled;
  r.first_token = ttft_ms > 0 ? r.scheduled + static_cast<Nanos>(ttft_ms * 1e6) : 0;
  r.done = e2e_ms > 0 ? r.scheduled + static_cast<Nanos>(e2e_ms * 1e6) : 0;
  r.output_tokens = out_tokens;
  r.input_tokens = 10;
  r.error = std::move(error);
  return r;
}

TEST(Aggregate, CountsRequestsScheduledInThePeriodAndCompletionsForThroughput) {
  const Nanos ms = 1000000;
  std::vector<RequestRecord> recs = {
      Req(500, 10, 600, 5),    // scheduled in warm-up, completes inside: throughput only
      Req(1000, 20, 110, 11),  // in
      Req(1500, 30, 210, 21),  // in
      Req(1800, 0, 0, 0),      // in, never finished: incomplete
      Req(1900, 0, 5, 0, "http_503"),
      Req(2500, 10, 100, 5),  // after the period: ignored
  };
  recs[0].warmup = true;
  PointResult p;
  AggregatePoint(recs, 1000 * ms, 2000 * ms, Slo{25, 0, 0}, &p);
  EXPECT_EQ(p.sent, 4);
  EXPECT_EQ(p.succeeded, 2);
  EXPECT_EQ(p.errors["incomplete"], 1);
  EXPECT_EQ(p.errors["http_503"], 1);
  // Completions inside [1 s, 2 s): records 0, 1, 2 and the failure (which does not count) -> 3 per second.
  EXPECT_DOUBLE_EQ(p.requests_per_s, 3);
  // Tokens count when they arrive: record 0's (one chunk at 510 ms) are before the period.
  EXPECT_DOUBLE_EQ(p.output_tokens_per_s, 11 + 21);
  EXPECT_DOUBLE_EQ(p.latency_ms.min, 110);
  EXPECT_DOUBLE_EQ(p.latency_ms.max, 210);
  EXPECT_DOUBLE_EQ(p.ttft_ms.p50, 25);
  // TPOT: (110 - 20) / 10 = 9 and (210 - 30) / 20 = 9.
  EXPECT_NEAR(p.tpot_ms.p50, 9, 1e-9);
  // SLO TTFT <= 25 ms: only the first of the two successes meets it; 1 of 4 sent.
  EXPECT_DOUBLE_EQ(p.goodput_fraction, 0.25);
  EXPECT_DOUBLE_EQ(p.goodput_rps, 1.5);
}

TEST(Aggregate, WindowUsesCompletionTime) {
  const Nanos ms = 1000000;
  std::vector<RequestRecord> recs = {Req(0, 0, 100, 1), Req(0, 0, 150, 1), Req(0, 0, 250, 1)};
  WindowStats w = WindowOf(recs, 100 * ms, 200 * ms, 0);
  EXPECT_EQ(w.completed, 2);
  EXPECT_DOUBLE_EQ(w.requests_per_s, 20);
  EXPECT_DOUBLE_EQ(w.start_s, 0.1);
  EXPECT_NEAR(w.p50_ms, 125, 1e-9);
}

TEST(Aggregate, StreamedTokensCountWhenTheyArrive) {
  const Nanos ms = 1000000;
  RequestRecord r = Req(0, 100, 400, 4);  // chunks at 100, 200, 300, 400 ms
  r.itl_ms = {100, 100, 100};
  EXPECT_DOUBLE_EQ(OutputTokensIn(r, 0, 150 * ms), 1);
  EXPECT_DOUBLE_EQ(OutputTokensIn(r, 150 * ms, 1000 * ms), 3);
  r.output_tokens = 8;  // the server's usage says two tokens per chunk
  EXPECT_DOUBLE_EQ(OutputTokensIn(r, 150 * ms, 1000 * ms), 6);
  RequestRecord whole = Req(0, 0, 400, 4);  // not streamed: all at the end
  EXPECT_DOUBLE_EQ(OutputTokensIn(whole, 0, 400 * ms), 0);
  EXPECT_DOUBLE_EQ(OutputTokensIn(whole, 0, 401 * ms), 4);
  RequestRecord failed = Req(0, 100, 400, 4, "http_500");
  EXPECT_DOUBLE_EQ(OutputTokensIn(failed, 0, 1000 * ms), 0);
  // Cut at the drain after 3 streamed chunks (100, 200, 300 ms): those count where they arrived.
  RequestRecord cut = Req(0, 100, 350, 3, "incomplete");
  cut.itl_ms = {100, 100};
  EXPECT_DOUBLE_EQ(OutputTokensIn(cut, 150 * ms, 1000 * ms), 2);
  EXPECT_DOUBLE_EQ(OutputTokensIn(cut, 0, 1000 * ms), 3);
}

TEST(Aggregate, ThroughputCountsTheStreamedTokensOfRequestsCutAtTheDrain) {
  const Nanos ms = 1000000;
  // A long request streaming one token every 10 ms from 100 ms on, cut at the drain at 2.5 s (240 chunks so
  // far), beside one that completes: the period [1 s, 2 s) saw 100 of the cut request's tokens.
  RequestRecord cut = Req(0, 100, 2500, 240, "incomplete");
  cut.itl_ms.assign(239, 10.f);
  std::vector<RequestRecord> recs = {Req(1000, 20, 110, 11), cut};
  PointResult p;
  AggregatePoint(recs, 1000 * ms, 2000 * ms, Slo{}, &p);
  EXPECT_NEAR(p.output_tokens_per_s, 11 + 100, 1e-6);
  EXPECT_EQ(p.succeeded, 1);  // latency statistics still leave it out
}

TEST(Stats, RelativeSpread) {
  EXPECT_DOUBLE_EQ(RelativeSpread({5}), 0);
  EXPECT_NEAR(RelativeSpread({9, 10, 11}), 0.1, 1e-12);
}

}  // namespace
}  // namespace stoke::bench
