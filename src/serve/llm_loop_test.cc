// LlmLoop with a fake decoder (llm_loop_test_util.h): a request's output must not depend on what it is batched
// with, on chunking or on preemption; stops, cancellation, logprobs and bad input. The step records, the
// step-time target and the ledger are in llm_loop_steps_test.cc.
#include "serve/llm_loop.h"

#include <gtest/gtest.h>

#include "serve/llm_loop_test_util.h"

namespace stoke {
namespace {

using namespace llm_loop_testing;  // NOLINT(build/namespaces): the shared fakes of these tests

// A model that samples on the device gets Logits::kToken with each request's seed and step; the outputs equal
// host sampling token for token (greedy and seeded), while logprobs requests, and stop tokens masked before
// min_tokens, still get logits rows. With LlmLoopOptions::device_sampling off every row is logits.
TEST_P(LlmLoopTest, DeviceSamplingMatchesHostSamplingAndFallsBackWhereLogitsAreNeeded) {
  std::vector<Spec> specs = MixedSpecs();
  Spec lp;
  lp.prompt = Prompt(9, 3);
  lp.sampling = Seeded(7, 77);
  lp.sampling.logprobs = 2;
  specs.push_back(lp);
  Spec minp;
  minp.prompt = Prompt(5, 4);
  minp.sampling = Seeded(10, 78);
  minp.sampling.min_tokens = 6;  // EOS is a stop token (no ignore_eos): masked on the host until 6 tokens
  specs.push_back(minp);
  const auto alone = RunAlone(specs);
  int total = 0;
  for (const Spec& sp : specs) total += sp.sampling.max_tokens;
  for (bool enabled : {true, false}) {
    FakeModel* model = nullptr;
    FakeModelOptions mo;
    mo.samples_on_device = true;
    LlmLoopOptions lo = SmallLoop(/*num_blocks=*/256, /*budget=*/16, /*max_seqs=*/6);
    lo.device_sampling = enabled;
    auto loop = MakeLoop(lo, mo, &model);
    std::vector<std::unique_ptr<Collector>> cs;
    for (size_t i = 0; i < specs.size(); ++i) {
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE(loop->Submit(Req("r" + std::to_string(i), specs[i], *cs[i])).ok());
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_TRUE(cs[i]->Wait());
      EXPECT_EQ(cs[i]->Tokens(), alone[i].first) << "request " << i << " device_sampling " << enabled;
      EXPECT_EQ(cs[i]->Text(), alone[i].second) << "request " << i;
      EXPECT_EQ(cs[i]->Last().finish, FinishReason::kLength);
    }
    size_t with_logprobs = 0;
    for (const auto& e : cs[specs.size() - 2]->events) with_logprobs += e.logprobs.size();
    EXPECT_EQ(with_logprobs, 7u);
    const int host_expected = enabled ? lp.sampling.max_tokens + minp.sampling.min_tokens : total;
    EXPECT_EQ(model->host_rows.load(), host_expected) << "device_sampling " << enabled;
    EXPECT_EQ(model->device_tokens.load(), total - host_expected) << "device_sampling " << enabled;
  }
}

TEST_P(LlmLoopTest, BatchedRequestsGetWhatEachGetsAlone) {
  const std::vector<Spec> specs = MixedSpecs();
  const auto alone = RunAlone(specs);
  FakeModel* model = nullptr;
  // Every request is in before the first step runs (the gate), so they share steps however this machine
  // schedules the test thread. A small budget forces chunked prefill interleaved with decodes.
  std::promise<void> open;
  FakeModelOptions mo;
  mo.gate = open.get_future().share();
  auto loop = MakeLoop(SmallLoop(/*num_blocks=*/256, /*budget=*/16, /*max_seqs=*/6), mo, &model);
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < specs.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(loop->Submit(Req("r" + std::to_string(i), specs[i], *cs[i])).ok());
  }
  open.set_value();
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(cs[i]->Wait());
    EXPECT_EQ(cs[i]->Tokens(), alone[i].first) << "request " << i;
    EXPECT_EQ(cs[i]->Text(), alone[i].second) << "request " << i;
    EXPECT_EQ(cs[i]->Last().finish, FinishReason::kLength);
    EXPECT_EQ(cs[i]->Last().completion_tokens, specs[i].sampling.max_tokens);
    EXPECT_EQ(cs[i]->Last().prompt_tokens, static_cast<int>(specs[i].prompt.size()));
  }
  EXPECT_GE(model->max_batch.load(), 4) << "requests never shared a step";
  ASSERT_TRUE(loop->WaitIdle());
  const LlmLoopStats st = loop->stats();
  EXPECT_EQ(st.requests_finished, 10);
  EXPECT_EQ(st.engine.kv_blocks_used, 0);
  EXPECT_EQ(st.engine.num_running, 0);
}

TEST_P(LlmLoopTest, PreemptionKeepsOutputsIdentical) {
  const std::vector<Spec> specs = MixedSpecs();
  const auto alone = RunAlone(specs);
  // 24 blocks of 4 = 96 token slots for ten requests of up to ~70 tokens each: preemption is certain.
  auto loop = MakeLoop(SmallLoop(/*num_blocks=*/24, /*budget=*/64, /*max_seqs=*/8));
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < specs.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(loop->Submit(Req("r" + std::to_string(i), specs[i], *cs[i])).ok());
  }
  int preempted_requests = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_TRUE(cs[i]->Wait());
    EXPECT_EQ(cs[i]->Tokens(), alone[i].first) << "request " << i;
    EXPECT_EQ(cs[i]->Text(), alone[i].second) << "request " << i;
    preempted_requests += cs[i]->Last().timings.num_preemptions > 0;
  }
  const LlmLoopStats st = loop->stats();
  EXPECT_GT(st.engine.num_preemptions, 0);
  EXPECT_GT(preempted_requests, 0);
  EXPECT_GT(st.recompute_tokens, 0);
}

TEST_P(LlmLoopTest, PrefixCacheSkipsSharedPromptAndKeepsOutput) {
  Spec s{Prompt(40, 3), Greedy(6)};
  auto loop = MakeLoop(SmallLoop());
  Collector a, b;
  ASSERT_TRUE(loop->Submit(Req("a", s, a)).ok());
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(loop->Submit(Req("b", s, b)).ok());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.Tokens(), b.Tokens());
  EXPECT_EQ(a.Last().cached_prompt_tokens, 0);
  EXPECT_EQ(b.Last().cached_prompt_tokens, 36);  // 9 full blocks of 4; the 40th token is always computed
  const LlmLoopStats st = loop->stats();
  EXPECT_EQ(st.engine.prefix_cache_queries, 80);
  EXPECT_EQ(st.engine.prefix_cache_hits, 36);
}

TEST_P(LlmLoopTest, CancelFreesBlocksWithinAStep) {
  auto loop = MakeLoop(SmallLoop());
  Collector running;
  Spec s{Prompt(10, 1), Greedy(200)};
  // Cancelled from its second token's callback (the engine thread, as a net thread would between two steps;
  // the stats were published after the first step): when the cancel lands does not depend on how fast this
  // machine runs the test thread.
  std::atomic<int> tokens_seen{0};
  std::atomic<int> blocks_at_first_token{-1};
  GenerationRequest r = Req("run", s, running);
  auto inner = r.on_event;
  r.on_event = [&, inner](GenerationEvent ev) {
    if (++tokens_seen == 2) {
      blocks_at_first_token = loop->stats().engine.kv_blocks_used;
      loop->Cancel("run");
      loop->Cancel("no-such-request");  // ignored
    }
    inner(std::move(ev));
  };
  ASSERT_TRUE(loop->Submit(std::move(r)).ok());
  ASSERT_TRUE(running.Wait());
  EXPECT_GT(blocks_at_first_token.load(), 0);
  EXPECT_EQ(running.Last().finish, FinishReason::kCancelled);
  EXPECT_LE(running.Last().completion_tokens, 3);  // the cancel is seen before the next step
  ASSERT_TRUE(loop->WaitIdle());
  EXPECT_EQ(loop->stats().engine.kv_blocks_used, 0);
  EXPECT_EQ(loop->stats().requests_cancelled, 1);
}

TEST_P(LlmLoopTest, CancelWhileWaiting) {
  std::promise<void> open;
  FakeModelOptions mo;
  mo.gate = open.get_future().share();
  auto loop = MakeLoop(SmallLoop(64, 32, /*max_seqs=*/1), mo);
  Collector a, b;
  ASSERT_TRUE(loop->Submit(Req("a", {Prompt(5, 1), Greedy(3)}, a)).ok());
  ASSERT_TRUE(loop->Submit(Req("b", {Prompt(5, 2), Greedy(3)}, b)).ok());
  loop->Cancel("b");
  open.set_value();
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.Last().finish, FinishReason::kLength);
  EXPECT_EQ(b.Last().finish, FinishReason::kCancelled);
  EXPECT_EQ(b.Last().completion_tokens, 0);
}

TEST_P(LlmLoopTest, StopStringEndsBeforeItAndIsNeverEmitted) {
  Spec s{Prompt(7, 5), Greedy(40)};
  const auto ref = RunAlone({s})[0];
  const std::string& full = ref.second;
  ASSERT_GE(full.size(), 20u);
  // A stop string taken from the middle of the reference output.
  const std::string stop = full.substr(10, 3);
  const size_t cut = full.find(stop);
  s.sampling.stop = {stop, "this never occurs"};
  auto loop = MakeLoop(SmallLoop());
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("s", s, c)).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.Text(), full.substr(0, cut));
  EXPECT_EQ(c.Last().finish, FinishReason::kStop);
  // Tokens released are exactly those whose text was released (the stop string's tokens withheld).
  FakeTokenizer tok;
  EXPECT_EQ(tok.Decode(c.Tokens(), true), c.Text());
  for (const auto& e : c.events) EXPECT_EQ(e.text.find(stop), std::string::npos);
}

TEST_P(LlmLoopTest, EosStopsUnlessIgnoredOrBeforeMinTokens) {
  FakeModelOptions mo;
  // EOS whenever the history is at least 12 tokens long, else a letter.
  mo.next = [](const std::vector<int32_t>& h) {
    return h.size() >= 12 ? kEos : static_cast<int32_t>(h.size());
  };
  auto loop = MakeLoop(SmallLoop(), mo);
  Collector plain, min_tok, ignore;
  SamplingParams p = Greedy(20);
  ASSERT_TRUE(loop->Submit(Req("plain", {Prompt(10, 0), p}, plain)).ok());
  p.min_tokens = 5;
  ASSERT_TRUE(loop->Submit(Req("min", {Prompt(10, 0), p}, min_tok)).ok());
  p.min_tokens = 0;
  p.ignore_eos = true;
  ASSERT_TRUE(loop->Submit(Req("ignore", {Prompt(10, 0), p}, ignore)).ok());
  ASSERT_TRUE(plain.Wait() && min_tok.Wait() && ignore.Wait());
  // History 10 -> token 10 ('k'), 11 -> 'l', then EOS: 2 tokens emitted, EOS counted but not emitted.
  EXPECT_EQ(plain.Tokens(), (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(plain.Text(), "kl");
  EXPECT_EQ(plain.Last().finish, FinishReason::kStop);
  EXPECT_EQ(plain.Last().completion_tokens, 3);
  // min_tokens 5: EOS is masked for the first 5 tokens (the peaked distribution's runner-up is taken).
  EXPECT_EQ(min_tok.Last().finish, FinishReason::kStop);
  EXPECT_EQ(min_tok.Last().completion_tokens, 6);
  EXPECT_EQ(min_tok.Tokens().size(), 5u);
  for (int32_t t : min_tok.Tokens()) EXPECT_NE(t, kEos);
  // ignore_eos: runs to max_tokens; EOS tokens are part of the output (and decode to nothing).
  EXPECT_EQ(ignore.Last().finish, FinishReason::kLength);
  EXPECT_EQ(ignore.Last().completion_tokens, 20);
  EXPECT_EQ(ignore.Tokens().size(), 20u);
}

TEST_P(LlmLoopTest, StopTokenIdsEndGeneration) {
  Spec s{Prompt(6, 9), Greedy(30)};
  const auto ref = RunAlone({s})[0];
  ASSERT_GE(ref.first.size(), 10u);
  const int32_t stop_id = ref.first[6];
  const size_t first = std::find(ref.first.begin(), ref.first.end(), stop_id) - ref.first.begin();
  s.sampling.stop_token_ids = {stop_id};
  auto loop = MakeLoop(SmallLoop());
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("t", s, c)).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.Tokens(), std::vector<int32_t>(ref.first.begin(), ref.first.begin() + first));
  EXPECT_EQ(c.Last().finish, FinishReason::kStop);
}

TEST_P(LlmLoopTest, Utf8IsNeverSplitAcrossEvents) {
  FakeModelOptions mo;
  // Alternate the two bytes of 'é' with letters: c3 a9 'x' c3 a9 'x' ...
  mo.next = [](const std::vector<int32_t>& h) {
    const int32_t last = h.back();
    return last == 60 ? 61 : last == 61 ? 23 : 60;
  };
  auto loop = MakeLoop(SmallLoop(), mo);
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("u", {{0}, Greedy(9)}, c)).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.Text(), "\xC3\xA9x\xC3\xA9x\xC3\xA9x");
  for (const auto& e : c.events) {
    EXPECT_NE(e.text, "\xC3") << "a broken character was emitted";
  }
}

TEST_P(LlmLoopTest, LogprobsOnePerToken) {
  Spec s{Prompt(5, 1), Greedy(4)};
  s.sampling.logprobs = 2;
  auto loop = MakeLoop(SmallLoop());
  Collector c;
  ASSERT_TRUE(loop->Submit(Req("lp", s, c)).ok());
  ASSERT_TRUE(c.Wait());
  size_t n = 0;
  for (const auto& e : c.events) {
    ASSERT_EQ(e.logprobs.size(), e.token_ids.size());
    for (size_t i = 0; i < e.token_ids.size(); ++i) {
      EXPECT_EQ(e.logprobs[i].token_id, e.token_ids[i]);
      ASSERT_EQ(e.logprobs[i].top.size(), 2u);
      EXPECT_EQ(e.logprobs[i].top[0].first, e.token_ids[i]);  // greedy: the chosen one is the best
      EXPECT_LT(e.logprobs[i].logprob, 0.0f);
    }
    n += e.token_ids.size();
  }
  EXPECT_EQ(n, 4u);
}

TEST_P(LlmLoopTest, RejectsBadRequestsWithTheNumbers) {
  FakeModelOptions mo;
  mo.context = 100;
  auto loop = MakeLoop(SmallLoop(/*num_blocks=*/64), mo);
  Collector c;
  Status st = loop->Submit(Req("long", {Prompt(60, 0), Greedy(50)}, c));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("60"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("50"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("100"), std::string::npos) << st.message();
  EXPECT_EQ(loop->Submit(Req("empty", {{}, Greedy(5)}, c)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loop->Submit(Req("vocab", {{1, 2, kVocab}, Greedy(5)}, c)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loop->Submit(Req("zero", {{1}, Greedy(0)}, c)).code(), StatusCode::kInvalidArgument);
  // The KV cache is smaller than the context here: 16 blocks of 4 = 64 tokens.
  auto small = MakeLoop(SmallLoop(/*num_blocks=*/16), mo);
  st = small->Submit(Req("kv", {Prompt(40, 0), Greedy(30)}, c));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("64"), std::string::npos) << st.message();
  EXPECT_EQ(loop->context_length(), 100);
  EXPECT_EQ(loop->max_sequence_tokens(), 100);  // 64 blocks of 4 hold more than the context
  EXPECT_EQ(small->max_sequence_tokens(), 64);  // the whole cache, less than the context
  EXPECT_EQ(loop->stats().requests_rejected, 4);
}

TEST_P(LlmLoopTest, FullQueueIsResourceExhausted) {
  std::promise<void> open;
  FakeModelOptions mo;
  mo.gate = open.get_future().share();
  LlmLoopOptions lo = SmallLoop(64, 32, /*max_seqs=*/1);
  lo.max_waiting = 2;
  auto loop = MakeLoop(lo, mo);
  Collector a, b, c, d;
  ASSERT_TRUE(loop->Submit(Req("a", {Prompt(5, 1), Greedy(2)}, a)).ok());
  ASSERT_TRUE(loop->WaitIdle(int64_t{50} * 1000 * 1000) == false);  // a is stuck in the gated step
  ASSERT_TRUE(loop->Submit(Req("b", {Prompt(5, 2), Greedy(2)}, b)).ok());
  ASSERT_TRUE(loop->Submit(Req("c", {Prompt(5, 3), Greedy(2)}, c)).ok());
  EXPECT_EQ(loop->Submit(Req("b", {Prompt(5, 2), Greedy(2)}, d)).code(),
            StatusCode::kInvalidArgument);  // in flight
  EXPECT_EQ(loop->Submit(Req("d", {Prompt(5, 4), Greedy(2)}, d)).code(), StatusCode::kResourceExhausted);
  open.set_value();
  ASSERT_TRUE(a.Wait() && b.Wait() && c.Wait());
  ASSERT_TRUE(loop->WaitIdle());
  EXPECT_TRUE(loop->Submit(Req("d", {Prompt(5, 4), Greedy(2)}, d)).ok());
  ASSERT_TRUE(d.Wait());
}

TEST_P(LlmLoopTest, ModelErrorFailsTheStepsRequestsOnly) {
  FakeModelOptions mo;
  mo.fail_at_step = 0;
  auto loop = MakeLoop(SmallLoop(), mo);
  Collector a, b;
  ASSERT_TRUE(loop->Submit(Req("a", {Prompt(5, 1), Greedy(3)}, a)).ok());
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.Last().finish, FinishReason::kError);
  EXPECT_EQ(a.Last().error.code(), StatusCode::kInternal);
  ASSERT_TRUE(loop->Submit(Req("b", {Prompt(5, 1), Greedy(3)}, b)).ok());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(b.Last().finish, FinishReason::kLength);
  ASSERT_TRUE(loop->WaitIdle());
  EXPECT_EQ(loop->stats().engine.kv_blocks_used, 0);
  EXPECT_EQ(loop->stats().requests_failed, 1);
}

TEST_P(LlmLoopTest, ShutdownFailsRequestsInFlight) {
  Collector c;
  {
    FakeModelOptions mo;
    mo.step_sleep_us = 1000;
    auto loop = MakeLoop(SmallLoop(), mo);
    ASSERT_TRUE(loop->Submit(Req("x", {Prompt(5, 1), Greedy(200)}, c)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(c.Wait());  // the loop's destructor already failed it
  EXPECT_EQ(c.Last().finish, FinishReason::kError);
  EXPECT_EQ(c.Last().error.code(), StatusCode::kUnavailable);
}

TEST_P(LlmLoopTest, SizesKvFromTheBudget) {
  LlmLoopOptions lo;
  lo.block_size = 16;
  lo.kv_budget_bytes = 64 * 16 * 100;  // 64 bytes per token (fake), 16 per block: 100 blocks
  lo.scheduler.max_num_seqs = 64;
  auto loop = MakeLoop(lo);
  EXPECT_EQ(loop->num_kv_blocks(), 100);
  lo.kv_budget_bytes = 10;
  auto r =
      LlmLoop::Create(lo, std::make_unique<FakeModel>(FakeModelOptions{}), std::make_shared<FakeTokenizer>());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// Async output: the text of step k's token reaches its client while the model runs step k + 1 (the fake
// model's step waits for it: synchronously it could never arrive), from the output thread; the last event,
// decided by the length before the next step is planned, comes from the engine thread itself.
TEST(LlmLoopAsyncOutputTest, TextOfAStepsTokensIsOutWhileTheNextStepRuns) {
  Collector c;
  std::atomic<int> overlapped{0};
  FakeModelOptions mo;
  std::atomic<int> step{0};
  mo.on_step = [&](const StepInput&) {
    const int k = step++;
    if (k == 0) return;  // the prompt's step: no token out yet
    // Token k (sampled by step k - 1) is out before this step returns: a hang guard, not a time bound.
    for (int i = 0; i < 20000; ++i) {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        if (static_cast<int>(c.events.size()) >= k) {
          ++overlapped;
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  };
  LlmLoopOptions lo = SmallLoop();
  lo.async_output = true;
  std::map<std::thread::id, int> threads;
  auto loop = MakeLoop(lo, mo);
  GenerationRequest r = Req("a", Spec{Prompt(5, 1), Greedy(6)}, c);
  r.on_event = [&, inner = c.Callback()](GenerationEvent ev) {
    {
      std::lock_guard<std::mutex> lk(c.mu);
      ++threads[std::this_thread::get_id()];
    }
    inner(std::move(ev));
  };
  ASSERT_TRUE(loop->Submit(std::move(r)).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.Text(), RunAlone({Spec{Prompt(5, 1), Greedy(6)}})[0].second);
  EXPECT_EQ(c.events.size(), 6u);  // one letter per token, the last with kLength
  EXPECT_EQ(c.Last().finish, FinishReason::kLength);
  EXPECT_EQ(overlapped.load(), 5) << "steps 1..5 each saw the previous token's event arrive while they ran";
  EXPECT_EQ(threads.size(), 2u) << "five events from the output thread, the last from the engine thread";
}

// A stop string is seen one step late with async output: that step computed one more token for the sequence,
// which is dropped; what the client gets is the same. Step records carry the output thread's time.
TEST(LlmLoopAsyncOutputTest, StopStringCostsOneStepAndChangesNothing) {
  Spec s{Prompt(7, 5), Greedy(40)};
  const std::string full = RunAlone({s})[0].second;
  s.sampling.stop = {full.substr(10, 3)};
  std::vector<std::string> texts;
  std::vector<int> steps;
  for (bool async : {false, true}) {
    LlmLoopOptions lo = SmallLoop();
    lo.async_output = async;
    std::mutex mu;
    int with_output_time = 0;
    lo.on_step = [&](const StepRecord& r) {
      std::lock_guard<std::mutex> lk(mu);
      with_output_time += r.output_ns > 0;
    };
    FakeModel* model = nullptr;
    auto loop = MakeLoop(lo, {}, &model);
    Collector c;
    ASSERT_TRUE(loop->Submit(Req("s", s, c)).ok());
    ASSERT_TRUE(c.Wait());
    EXPECT_EQ(c.Last().finish, FinishReason::kStop);
    EXPECT_EQ(c.Last().completion_tokens, static_cast<int>(full.find(s.sampling.stop[0])) + 3);
    // The ledger still adds up for a request finished by the engine thread after the output thread's find.
    const RequestTimings& t = c.Last().timings;
    EXPECT_EQ(t.finish - t.first_scheduled, t.prefill + t.decode + t.schedule + t.interleave + t.postprocess);
    texts.push_back(c.Text());
    steps.push_back(model->steps.load());
    ASSERT_TRUE(loop->WaitIdle());
    std::lock_guard<std::mutex> lk(mu);
    if (async) {
      EXPECT_EQ(with_output_time, steps.back() - 1) << "every step after the prompt's overlapped some output";
    } else {
      EXPECT_EQ(with_output_time, 0);
    }
  }
  EXPECT_EQ(texts[0], texts[1]);
  EXPECT_EQ(texts[0], full.substr(0, full.find(s.sampling.stop[0])));
  EXPECT_EQ(steps[1], steps[0] + 1);
}

// Both output paths, for the tests of this file and llm_loop_steps_test.cc (one binary).
INSTANTIATE_TEST_SUITE_P(Output, LlmLoopTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "async" : "sync"; });

}  // namespace
}  // namespace stoke
