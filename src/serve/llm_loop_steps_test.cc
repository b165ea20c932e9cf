// LlmLoop's step records (counted work, the model / host split), the step-time target (--target-step-ms) and
// the per-request ledger, with the fake decoder of llm_loop_test_util.h.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "serve/llm_loop.h"
#include "serve/llm_loop_test_util.h"

namespace stoke {
namespace {

using namespace llm_loop_testing;  // NOLINT(build/namespaces): the shared fakes of these tests

TEST_P(LlmLoopTest, TimingsAndStepRecords) {
  std::mutex mu;
  std::vector<StepRecord> steps;
  std::vector<RequestTimings> done;
  LlmLoopOptions lo = SmallLoop(64, /*budget=*/8);
  lo.on_step = [&](const StepRecord& r) {
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(r);
  };
  lo.on_request_done = [&](const RequestTimings& t, const GenerationEvent&) {
    std::lock_guard<std::mutex> lk(mu);
    done.push_back(t);
  };
  auto loop = MakeLoop(lo);
  Collector c;
  GenerationRequest r = Req("t", {Prompt(20, 1), Greedy(5)}, c);
  r.recv_time = MonotonicNanos();
  ASSERT_TRUE(loop->Submit(std::move(r)).ok());
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(loop->WaitIdle());
  const RequestTimings& t = c.Last().timings;
  EXPECT_GT(t.recv, 0);
  EXPECT_LE(t.recv, t.submit);
  EXPECT_LE(t.submit, t.first_scheduled);
  EXPECT_LE(t.first_scheduled, t.first_token);
  EXPECT_LE(t.first_token, t.finish);
  EXPECT_EQ(t.inter_token.size(), 4u);
  EXPECT_GT(t.compute, 0);
  EXPECT_GE(t.ttft(), t.queue());
  std::lock_guard<std::mutex> lk(mu);
  ASSERT_EQ(done.size(), 1u);
  // 20 prompt tokens at 8 per step: 3 prefill steps (8, 8, 4), then 4 decode steps.
  ASSERT_EQ(steps.size(), 7u);
  EXPECT_EQ(steps[0].prefill_tokens, 8);
  EXPECT_EQ(steps[0].admission_stop, "queue_empty");  // the one request was admitted (chunked)
  EXPECT_EQ(steps[2].prefill_tokens, 4);
  EXPECT_EQ(steps[3].decode_tokens, 1);
  EXPECT_EQ(steps[6].admission_stop, "queue_empty");
  EXPECT_EQ(loop->stats().steps, 7);
  EXPECT_EQ(loop->stats().generation_tokens, 5);
}

// Each step record counts what the step read and computed (KV positions, query-key pairs, logits rows), turns
// it into bytes and FLOPs with the model's costs, and splits its time into the model's part and the host's.
TEST_P(LlmLoopTest, StepRecordsCountTheWorkAndSplitTheTime) {
  std::mutex mu;
  std::vector<StepRecord> steps;
  LlmLoopOptions lo = SmallLoop(64, /*budget=*/8);
  lo.step_costs.matmul_params = 100;
  lo.step_costs.lm_head_params = 10;
  lo.step_costs.weight_bytes = 1000;
  lo.step_costs.lm_head_bytes = 100;
  lo.step_costs.kv_bytes_per_token = 8;
  lo.step_costs.attention_flops_per_pair = 4;
  lo.on_step = [&](const StepRecord& r) {
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(r);
  };
  auto loop = MakeLoop(lo);
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("t", {Prompt(20, 1), Greedy(5)}, c)).ok());
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(loop->WaitIdle());
  std::lock_guard<std::mutex> lk(mu);
  // 20 prompt tokens at 8 per step: chunks [0, 8), [8, 16), [16, 20) (the last one samples), then 4 decodes
  // at positions 20..23. Token i of a chunk starting at s attends to s + i + 1 keys.
  ASSERT_EQ(steps.size(), 7u);
  const int64_t kv[] = {8, 16, 20, 21, 22, 23, 24};
  const int64_t pairs[] = {36, 8 * 8 + 36, 4 * 16 + 10, 21, 22, 23, 24};
  const int64_t rows[] = {0, 0, 1, 1, 1, 1, 1};
  const int64_t tokens[] = {8, 8, 4, 1, 1, 1, 1};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i);
    const StepRecord& r = steps[i];
    EXPECT_EQ(r.kv_positions, kv[i]);
    EXPECT_EQ(r.attention_pairs, pairs[i]);
    EXPECT_EQ(r.logit_rows, rows[i]);
    EXPECT_DOUBLE_EQ(r.weight_bytes, rows[i] > 0 ? 1000 : 900);  // no logits row: the lm_head is not read
    EXPECT_DOUBLE_EQ(r.kv_bytes, 8.0 * kv[i]);
    EXPECT_DOUBLE_EQ(r.matmul_flops, 2.0 * 100 * tokens[i] + 2.0 * 10 * rows[i]);
    EXPECT_DOUBLE_EQ(r.attention_flops, 4.0 * pairs[i]);
    EXPECT_GE(r.model_ns, 0);
    EXPECT_LE(r.model_ns, r.duration);
  }
}

// Without a cost model the counts are still taken and the modelled bytes and FLOPs stay 0.
TEST_P(LlmLoopTest, StepRecordsWithoutCostsCountOnly) {
  std::mutex mu;
  std::vector<StepRecord> steps;
  LlmLoopOptions lo = SmallLoop(64, /*budget=*/32);
  lo.on_step = [&](const StepRecord& r) {
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(r);
  };
  auto loop = MakeLoop(lo);
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("t", {Prompt(6, 2), Greedy(2)}, c)).ok());
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(loop->WaitIdle());
  std::lock_guard<std::mutex> lk(mu);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].kv_positions, 6);
  EXPECT_EQ(steps[1].kv_positions, 7);
  EXPECT_EQ(steps[0].attention_pairs, 21);
  EXPECT_EQ(steps[1].logit_rows, 1);
  EXPECT_EQ(steps[1].weight_bytes, 0);
  EXPECT_EQ(steps[1].matmul_flops, 0);
}

// A clock that only the fake model moves.
class ManualClock final : public Clock {
 public:
  Nanos Now() const override { return now_.load(); }
  void Advance(Nanos ns) { now_ += ns; }

 private:
  std::atomic<Nanos> now_{1'000'000};
};

// --target-step-ms: a model whose steps cost exactly 1 ms + 50 us per token + 1 us per KV position read (on a
// clock only it moves). Uncapped, the 512-token budget makes steps of ~30 ms; with a 10 ms target, once the
// fit has its first 8 steps, every step stays within 10 ms while all 40 requests still finish (prefill
// trickles in beside the decodes).
TEST_P(LlmLoopTest, TargetStepTimeCapsPrefillByTheMeasuredCost) {
  auto run = [](double target_ms, std::vector<StepRecord>* steps) {
    ManualClock clock;
    std::mutex mu;
    LlmLoopOptions lo = SmallLoop(/*num_blocks=*/1024, /*budget=*/512, /*max_seqs=*/16);
    lo.clock = &clock;
    lo.target_step_ms = target_ms;
    lo.target_step_min_prefill = 16;
    lo.on_step = [&](const StepRecord& r) {
      std::lock_guard<std::mutex> lk(mu);
      steps->push_back(r);
    };
    // The run is a function of the requests alone: the first step (a one-token starter) waits inside the
    // model until all 40 are in, so no step's batch depends on when the submitting thread got to run (under a
    // sanitizer or a loaded CI a step took 10.035 ms when the 40 trickled into the first steps).
    std::promise<void> entered, go;
    std::shared_future<void> go_f = go.get_future().share();
    std::atomic<bool> first{true};
    FakeModelOptions mo;
    mo.on_step = [&clock, &entered, go_f, &first](const StepInput& in) {
      if (first.exchange(false)) {
        entered.set_value();
        go_f.wait();
      }
      int64_t kv = 0;
      for (const StepSequence& s : in.sequences) kv += s.start_pos + s.num_tokens;
      clock.Advance(1'000'000 + 50'000 * static_cast<int64_t>(in.token_ids.size()) + 1'000 * kv);
    };
    auto loop = MakeLoop(lo, mo);
    Collector starter;
    ASSERT_TRUE(loop->Submit(Req("starter", {Prompt(1, 99), Greedy(1)}, starter)).ok());
    entered.get_future().wait();
    // 40 requests over a running set of 16: prompts keep arriving as others finish.
    std::vector<Collector> c(40);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(
          loop->Submit(Req("r" + std::to_string(i), {Prompt(150 + 7 * i, i), Greedy(24 + i % 5)}, c[i]))
              .ok());
    }
    go.set_value();
    ASSERT_TRUE(starter.Wait());
    for (auto& x : c) {
      ASSERT_TRUE(x.Wait());
      EXPECT_EQ(x.Last().finish, FinishReason::kLength);
    }
    ASSERT_TRUE(loop->WaitIdle());
  };
  std::vector<StepRecord> uncapped, capped;
  run(0, &uncapped);
  run(10, &capped);
  auto max_ms = [](const std::vector<StepRecord>& s, size_t from) {
    double m = 0;
    for (size_t i = from; i < s.size(); ++i) m = std::max(m, s[i].duration / 1e6);
    return m;
  };
  EXPECT_GT(max_ms(uncapped, 0), 20);
  for (const StepRecord& r : uncapped) EXPECT_EQ(r.prefill_cap, -1);
  // The fit starts capping after its first 8 steps; from then on no step passes the target, and some steps
  // were held below the 512-token budget by the cap.
  ASSERT_GT(capped.size(), 8u);
  EXPECT_LE(max_ms(capped, 8), 10.0 + 1e-6);
  int held = 0;
  for (size_t i = 8; i < capped.size(); ++i) {
    EXPECT_GE(capped[i].prefill_cap, 16);
    held += capped[i].prefill_cap < 512 && capped[i].prefill_tokens == capped[i].prefill_cap;
  }
  EXPECT_GT(held, 0);
}

// A clock that moves 1 us every time it is read, from any thread: every interval the loop measures is
// non-zero and the run is free of wall-clock noise.
class TickClock final : public Clock {
 public:
  Nanos Now() const override { return now_.fetch_add(1000) + 1000; }

 private:
  mutable std::atomic<Nanos> now_{1'000'000};
};

// The engine-side ledger adds up exactly, request by request: from the step that first computed it to its
// finish, every nanosecond is prefill, decode, schedule, interleave or its own postprocess; compute is
// prefill + decode; a request batched with others shows interleave (their sampling, steps without it).
TEST_P(LlmLoopTest, LedgerStagesAddUpToTheEngineTime) {
  TickClock clock;
  LlmLoopOptions lo = SmallLoop(64, /*budget=*/12, /*max_seqs=*/4);
  lo.clock = &clock;
  std::promise<void> open;
  FakeModelOptions mo;
  mo.gate = open.get_future().share();  // hold the first step until every request is in
  std::vector<std::unique_ptr<Collector>> cs;  // before the loop: outlives its last callback
  auto loop = MakeLoop(lo, mo);
  for (int i = 0; i < 6; ++i) {
    cs.push_back(std::make_unique<Collector>());
    GenerationRequest r = Req("r" + std::to_string(i), {Prompt(5 + 4 * i, i), Greedy(3 + 2 * i)}, *cs.back());
    r.recv_time = clock.Now();
    ASSERT_TRUE(loop->Submit(std::move(r)).ok());
  }
  open.set_value();
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(cs[i]->Wait());
    const GenerationEvent& last = cs[i]->Last();
    ASSERT_EQ(last.finish, FinishReason::kLength);
    const RequestTimings& t = last.timings;
    EXPECT_EQ(t.finish - t.first_scheduled, t.prefill + t.decode + t.schedule + t.interleave + t.postprocess)
        << "request " << i;
    EXPECT_EQ(t.compute, t.prefill + t.decode);
    EXPECT_GT(t.prefill, 0);
    EXPECT_GT(t.decode, 0);  // 3+ tokens: at least two decode steps
    EXPECT_GT(t.schedule, 0);
    EXPECT_GT(t.postprocess, 0);
    EXPECT_GT(t.interleave, 0);  // six requests share the steps (and the budget of 12 splits prefills)

    // The whole ledger: recv .. send sum exactly to e2e, and nothing is left for `other`.
    const Nanos parsed = t.recv + 1000, end = t.finish + 5000;
    const Ledger l = GenerationLedger(t, parsed, end);
    EXPECT_EQ(l.e2e, end - t.recv);
    EXPECT_EQ(l[LedgerStage::kOther], 0) << LedgerHeaderValue(l);
    EXPECT_EQ(l[LedgerStage::kRecv], 1000);
    EXPECT_EQ(l[LedgerStage::kSend], 5000);
    EXPECT_EQ(l[LedgerStage::kQueue], t.queue());
    Nanos sum = 0;
    for (LedgerStage s : LedgerStages(LedgerKind::kGeneration)) sum += l[s];
    EXPECT_EQ(sum, l.e2e);
  }
}

// A request cancelled while it waits never ran: its whole engine time is queue.
TEST_P(LlmLoopTest, LedgerOfARequestCancelledInTheQueue) {
  TickClock clock;
  LlmLoopOptions lo = SmallLoop(64, /*budget=*/8, /*max_seqs=*/1);
  lo.clock = &clock;
  std::promise<void> open;
  FakeModelOptions mo;
  mo.gate = open.get_future().share();
  Collector a, b;  // before the loop: outlive its last callback
  auto loop = MakeLoop(lo, mo);
  ASSERT_TRUE(loop->Submit(Req("a", {Prompt(4, 1), Greedy(4)}, a)).ok());
  ASSERT_TRUE(loop->Submit(Req("b", {Prompt(4, 2), Greedy(4)}, b)).ok());
  loop->Cancel("b");
  open.set_value();
  ASSERT_TRUE(b.Wait());
  ASSERT_TRUE(a.Wait());
  const RequestTimings& t = b.Last().timings;
  if (t.first_scheduled == 0) {  // cancelled before its first step (the usual case)
    const Ledger l = GenerationLedger(t, t.submit, t.finish);
    EXPECT_EQ(l[LedgerStage::kQueue], t.finish - t.submit);
    EXPECT_EQ(l[LedgerStage::kDecode] + l[LedgerStage::kPrefill] + l[LedgerStage::kInterleave], 0);
  } else {
    EXPECT_EQ(t.finish - t.first_scheduled, t.prefill + t.decode + t.schedule + t.interleave + t.postprocess);
  }
}

}  // namespace
}  // namespace stoke
