// The launch rule replayed on simulated time (FakeClock): each test is a timeline of arrivals and the
// batches the rule closes, with the reason it gives. No model, no threads.
#include "serve/batcher/launch_rule.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "serve/batcher/batch_queue.h"

namespace stoke {
namespace {

constexpr Nanos kUs = 1000;

BatcherConfig Config(int max_batch, int64_t delay_us, std::vector<int> preferred = {}) {
  BatcherConfig c;
  c.max_batch_size = max_batch;
  DynamicBatchingOptions d;
  d.max_queue_delay_us = delay_us;
  d.preferred_batch_sizes = std::move(preferred);
  c.dynamic_batching = d;
  return c;
}

std::unique_ptr<ClassicRequest> Req(int64_t rows = 1, int priority = 0, int64_t tokens = 0,
                                    int64_t timeout_us = 0) {
  auto r = std::make_unique<ClassicRequest>();
  r->rows = rows;
  r->priority = priority;
  r->tokens = tokens;
  r->timeout_us = timeout_us;
  return r;
}

// A simulation: arrivals go into a BatchQueue; Step() asks the rule and pops what it closes.
struct Sim {
  explicit Sim(const BatcherConfig& c) : q(c) {}
  void Arrive(int64_t rows = 1, int priority = 0, int64_t tokens = 0, int64_t timeout_us = 0) {
    ASSERT_TRUE(q.Enqueue(Req(rows, priority, tokens, timeout_us), clock.Now()).ok());
  }
  // The batch closed now, as "rows/reason", or "" with the wake-up time in *wake.
  std::string Step(Nanos* wake = nullptr) {
    LaunchDecision d = q.Decide(clock.Now());
    if (wake) *wake = d.wake_at;
    if (!d.launch) return "";
    last = q.Pop(d);
    return std::to_string(d.rows) + "/" + CloseReasonName(d.reason);
  }
  FakeClock clock{1'000'000};
  BatchQueue q;
  std::vector<QueueEntry> last;
};

TEST(LaunchRuleTest, ZeroDelaySendsWhateverIsQueued) {
  Sim s(Config(8, 0));
  EXPECT_EQ(s.Step(), "");  // empty queue: nothing, no wake-up
  s.Arrive();
  s.Arrive();
  s.Arrive();
  EXPECT_EQ(s.Step(), "3/immediate");
  EXPECT_TRUE(s.q.empty());
}

TEST(LaunchRuleTest, FullBatchClosesAtOnceEvenWithDelay) {
  Sim s(Config(4, 10'000));
  for (int i = 0; i < 6; ++i) s.Arrive();
  EXPECT_EQ(s.Step(), "4/full");
  Nanos wake = 0;
  EXPECT_EQ(s.Step(&wake), "");  // 2 left, delay not expired
  EXPECT_EQ(wake, s.clock.Now() + 10'000 * kUs);
}

TEST(LaunchRuleTest, DelayHoldsTheOldestThenSendsPartialBatch) {
  // t=0 a, t=300us b; delay 1000us: the batch leaves at t=1000us (a's deadline) with 2 rows.
  Sim s(Config(8, 1000));
  const Nanos t0 = s.clock.Now();
  s.Arrive();
  Nanos wake = 0;
  EXPECT_EQ(s.Step(&wake), "");
  EXPECT_EQ(wake, t0 + 1000 * kUs);
  s.clock.Advance(300 * kUs);
  s.Arrive();
  EXPECT_EQ(s.Step(&wake), "");
  EXPECT_EQ(wake, t0 + 1000 * kUs);  // held by the oldest, not the newest
  s.clock.Advance(699 * kUs);
  EXPECT_EQ(s.Step(), "");
  s.clock.Advance(1 * kUs);
  EXPECT_EQ(s.Step(), "2/delay");
}

TEST(LaunchRuleTest, PreferredSizeClosesBeforeTheDelay) {
  Sim s(Config(8, 5000, {2, 4}));
  s.Arrive();
  EXPECT_EQ(s.Step(), "");
  s.Arrive();
  // 2 is preferred and the delay has not expired: send the largest preferred prefix now.
  EXPECT_EQ(s.Step(), "2/preferred");
  for (int i = 0; i < 5; ++i) s.Arrive();
  EXPECT_EQ(s.Step(), "4/preferred");  // 5 queued: the largest preferred prefix is 4
  EXPECT_EQ(s.q.size(), 1u);
}

TEST(LaunchRuleTest, PreferredIgnoredOnceTheDelayExpired) {
  Sim s(Config(8, 1000, {2}));
  s.Arrive();
  s.clock.Advance(2000 * kUs);  // the first request is overdue
  s.Arrive();
  s.Arrive();
  EXPECT_EQ(s.Step(), "3/delay");  // everything pending goes, not just the preferred 2
}

TEST(LaunchRuleTest, AtLeastLargestPreferredSends) {
  // Requests of 3 rows never land exactly on preferred 4, but 6 >= 4 closes the batch.
  Sim s(Config(8, 100'000, {4}));
  s.Arrive(3);
  EXPECT_EQ(s.Step(), "");
  s.Arrive(3);
  EXPECT_EQ(s.Step(), "6/preferred");
}

TEST(LaunchRuleTest, RequestThatDoesNotFitEndsTheBatch) {
  // FIFO without skipping: 3 + 3 rows fit in 7, the next 3 does not; the 1 behind it waits.
  Sim s(Config(7, 100'000));
  s.Arrive(3);
  s.Arrive(3);
  s.Arrive(3);
  s.Arrive(1);
  EXPECT_EQ(s.Step(), "6/full");
  EXPECT_EQ(s.q.size(), 2u);
}

TEST(LaunchRuleTest, TokenBudgetIsPadAware) {
  // Budget 64 padded tokens: 4 rows x 16 = 64 fits; a 20-token row would make 5 x 20 = 100.
  BatcherConfig c = Config(32, 100'000);
  c.dynamic_batching->max_batch_tokens = 64;
  Sim s(c);
  for (int i = 0; i < 4; ++i) s.Arrive(1, 0, 16);
  s.Arrive(1, 0, 20);
  EXPECT_EQ(s.Step(), "4/token_budget");
  // A single request over the budget still runs, alone.
  s.Arrive(1, 0, 200);
  s.clock.Advance(200'000 * kUs);
  EXPECT_EQ(s.Step(), "1/token_budget");
  EXPECT_EQ(s.Step(), "1/delay");
}

TEST(LaunchRuleTest, BatchingOffSendsOneRequestPerBatch) {
  BatcherConfig c;
  c.max_batch_size = 8;  // no dynamic_batching
  Sim s(c);
  s.Arrive(2);
  s.Arrive(1);
  EXPECT_EQ(s.Step(), "2/unbatched");
  EXPECT_EQ(s.Step(), "1/unbatched");
  EXPECT_EQ(s.Step(), "");
}

TEST(LaunchRuleTest, PriorityLevelsScanHighestFirst) {
  BatcherConfig c = Config(2, 0);
  c.dynamic_batching->priority_levels = 2;
  c.dynamic_batching->default_priority_level = 2;
  Sim s(c);
  s.Arrive(1, 0);  // default level 2
  s.Arrive(1, 2);
  s.Arrive(1, 1);
  EXPECT_EQ(s.Step(), "2/full");
  ASSERT_EQ(s.last.size(), 2u);
  EXPECT_EQ(s.last[0].level, 1);  // the late high-priority request goes first
  EXPECT_EQ(s.last[1].level, 2);
  EXPECT_EQ(s.Step(), "1/immediate");
  EXPECT_EQ(s.last[0].level, 2);
}

TEST(LaunchRuleTest, DelayHoldsOnTheOldestEvenAtLowPriority) {
  BatcherConfig c = Config(8, 1000);
  c.dynamic_batching->priority_levels = 2;
  c.dynamic_batching->default_priority_level = 2;
  Sim s(c);
  s.Arrive(1, 2);
  s.clock.Advance(900 * kUs);
  s.Arrive(1, 1);
  EXPECT_EQ(s.Step(), "");
  s.clock.Advance(100 * kUs);  // the level-2 request has now waited 1000us
  EXPECT_EQ(s.Step(), "2/delay");
}

TEST(BatchQueueTest, PriorityOutOfRangeIsRejected) {
  BatcherConfig c = Config(8, 0);
  c.dynamic_batching->priority_levels = 2;
  c.dynamic_batching->default_priority_level = 1;
  BatchQueue q(c);
  Status s = q.Enqueue(Req(1, 3), 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("priority 3"), std::string::npos) << s.message();
}

TEST(BatchQueueTest, MaxQueueSizeRejectsWithUnavailable) {
  BatcherConfig c = Config(8, 1000);
  c.dynamic_batching->default_queue_policy.max_queue_size = 2;
  BatchQueue q(c);
  EXPECT_TRUE(q.Enqueue(Req(), 0).ok());
  EXPECT_TRUE(q.Enqueue(Req(), 0).ok());
  Status s = q.Enqueue(Req(), 0);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(q.size(), 2u);
}

TEST(BatchQueueTest, PerLevelPolicyOverridesTheDefault) {
  BatcherConfig c = Config(8, 1000);
  auto& d = *c.dynamic_batching;
  d.priority_levels = 2;
  d.default_priority_level = 2;
  d.priority_queue_policy[1].max_queue_size = 1;
  BatchQueue q(c);
  EXPECT_TRUE(q.Enqueue(Req(1, 1), 0).ok());
  EXPECT_EQ(q.Enqueue(Req(1, 1), 0).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(q.Enqueue(Req(1, 2), 0).ok());  // level 2 is unbounded
  EXPECT_TRUE(q.Enqueue(Req(1, 2), 0).ok());
}

TEST(BatchQueueTest, TimeoutRejectsAndWakesTheBatcher) {
  BatcherConfig c = Config(8, 10'000);
  c.dynamic_batching->default_queue_policy.default_timeout_us = 500;
  Sim s(c);
  const Nanos t0 = s.clock.Now();
  s.Arrive();
  Nanos wake = 0;
  EXPECT_EQ(s.Step(&wake), "");
  EXPECT_EQ(wake, t0 + 500 * kUs);  // the deadline comes before the 10ms delay
  s.clock.Advance(500 * kUs);
  std::vector<QueueEntry> expired = s.q.TakeExpired(s.clock.Now());
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_TRUE(s.q.empty());
}

TEST(BatchQueueTest, TimeoutOverrideOnlyWhenAllowedAndOnlyShorter) {
  for (bool allow : {false, true}) {
    BatcherConfig c = Config(8, 100'000);
    auto& p = c.dynamic_batching->default_queue_policy;
    p.default_timeout_us = 1000;
    p.allow_timeout_override = allow;
    Sim s(c);
    s.Arrive(1, 0, 0, /*timeout_us=*/200);   // shorter: applies only if allowed
    s.Arrive(1, 0, 0, /*timeout_us=*/5000);  // longer: never extends the default
    s.clock.Advance(200 * kUs);
    EXPECT_EQ(s.q.TakeExpired(s.clock.Now()).size(), allow ? 1u : 0u) << allow;
    s.clock.Advance(800 * kUs);
    EXPECT_EQ(s.q.TakeExpired(s.clock.Now()).size(), allow ? 1u : 2u) << allow;
  }
}

TEST(BatchQueueTest, DelayActionKeepsTimedOutRequestsBehindOnTimeOnes) {
  BatcherConfig c = Config(1, 0);
  auto& p = c.dynamic_batching->default_queue_policy;
  p.timeout_action = TimeoutAction::kDelay;
  p.default_timeout_us = 100;
  p.allow_timeout_override = true;
  Sim s(c);
  s.Arrive(1, 0, /*tokens=*/1);  // will time out
  s.clock.Advance(150 * kUs);
  s.Arrive(1, 0, /*tokens=*/2);                         // on time (deadline 100us from now)
  EXPECT_TRUE(s.q.TakeExpired(s.clock.Now()).empty());  // DELAY: nothing rejected
  EXPECT_EQ(s.q.size(), 2u);
  EXPECT_EQ(s.Step(), "1/full");
  EXPECT_EQ(s.last[0].request->tokens, 2);  // the on-time request went first
  EXPECT_EQ(s.Step(), "1/full");
  EXPECT_EQ(s.last[0].request->tokens, 1);
}

TEST(BatcherConfigTest, ParsesTritonKeysAndRoundTrips) {
  auto j = nlohmann::json::parse(R"({
    "max_batch_size": 16,
    "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": "250",
                         "priority_levels": 2, "default_priority_level": 2,
                         "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 100,
                                                  "allow_timeout_override": true, "max_queue_size": 9},
                         "priority_queue_policy": {"1": {"max_queue_size": 3}},
                         "max_batch_tokens": 4096},
    "instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 1}]})");
  auto c = BatcherConfig::FromJson(j, "test.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->max_batch_size, 16);
  EXPECT_EQ(c->instance_count, 3);
  ASSERT_TRUE(c->dynamic_batching.has_value());
  const auto& d = *c->dynamic_batching;
  EXPECT_EQ(d.preferred_batch_sizes, (std::vector<int>{4, 8}));
  EXPECT_EQ(d.max_queue_delay_us, 250);
  EXPECT_EQ(d.default_queue_policy.timeout_action, TimeoutAction::kDelay);
  EXPECT_EQ(d.PolicyFor(1).max_queue_size, 3);
  EXPECT_EQ(d.PolicyFor(2).max_queue_size, 9);
  EXPECT_EQ(d.max_batch_tokens, 4096);
  auto again = BatcherConfig::FromJson(c->ToJson(), "roundtrip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ToJson(), c->ToJson());
}

TEST(BatcherConfigTest, RejectsBadValuesNamingTheFile) {
  const char* bad[] = {
      R"({"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}})",
      R"({"max_batch_size": 4, "dynamic_batching": {"priority_levels": 2}})",
      R"({"max_batch_size": 4, "dynamic_batching": {"max_queue_delay": 5}})",
      R"({"max_batch_size": -1})",
      R"({"max_batch_size": 4, "instance_group": [{"count": 0}]})",
      R"({"max_batch_size": 4, "dynamic_batching": {"default_queue_policy": {"timeout_action": "DROP"}}})",
  };
  for (const char* text : bad) {
    auto c = BatcherConfig::FromJson(nlohmann::json::parse(text), "m.json");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(c.status().message().find("m.json"), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace stoke
