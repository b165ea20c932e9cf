// LlmLoop with a fake decoder: its "KV cache" stores token ids in the slots the block tables name, and its
// logits are a deterministic function of the history it reads back through the block table. So a wrong
// position, block table, copy or eviction changes the output, and a request's output must not depend on
// what it is batched with, on chunking or on preemption.
#include "serve/llm_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "base/logging.h"
#include "engine/runner/sampler.h"

namespace stoke {
namespace {

// Each loop logs its sizing at info; keep test output readable.
const bool kQuiet = [] {
  InitLogging("warn");
  return true;
}();

constexpr int kVocab = 64;
constexpr int32_t kEos = 63;

// ids 0..25 'a'..'z', 26..51 'A'..'Z', 52..59 '0'..'7', 60/61 the two bytes of 'é', 62 ' ', 63 EOS.
class FakeTokenizer final : public Tokenizer {
 public:
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions&) const override {
    std::vector<int32_t> ids;
    for (char c : text) {
      if (c >= 'a' && c <= 'z') ids.push_back(c - 'a');
      if (c >= 'A' && c <= 'Z') ids.push_back(26 + c - 'A');
      if (c == ' ') ids.push_back(62);
    }
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) s += TokenBytes(id);
    return s;
  }
  int vocab_size() const override { return kVocab; }
  const std::vector<int32_t>& eos_ids() const override { return eos_; }
  bool IsSpecial(int32_t id) const override { return id == kEos; }
  std::string TokenBytes(int32_t id) const override {
    if (id < 26) return std::string(1, static_cast<char>('a' + id));
    if (id < 52) return std::string(1, static_cast<char>('A' + id - 26));
    if (id < 60) return std::string(1, static_cast<char>('0' + id - 52));
    if (id == 60) return "\xC3";
    if (id == 61) return "\xA9";
    if (id == 62) return " ";
    return "";
  }
  std::string DecodePiece(int32_t id, bool, bool) const override { return TokenBytes(id); }

 private:
  std::vector<int32_t> eos_ = {kEos};
};

struct FakeModelOptions {
  int context = 512;
  // The next token after a history; default: a hash of the whole history (never EOS).
  std::function<int32_t(const std::vector<int32_t>& history)> next;
  int step_sleep_us = 0;
  int fail_at_step = -1;          // Step number (0-based) that returns an error
  std::shared_future<void> gate;  // when valid, each Step waits for it first
  // Accept Logits::kToken like a GPU backend: the token is drawn by the model (here with the host Sampler at
  // the given (seed, step), so outputs must equal host sampling exactly when the loop plumbs them right).
  bool samples_on_device = false;
  // Called at the start of each Step (e.g. to advance a test clock by what the step "costs").
  std::function<void(const StepInput&)> on_step;
};

int32_t HashNext(const std::vector<int32_t>& h) {
  uint64_t x = 1469598103934665603ull;
  for (int32_t t : h) x = (x ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  x ^= x >> 29;
  return static_cast<int32_t>(x % 60);  // 0..59: letters and digits, one byte each
}

class FakeModel final : public DecoderModel {
 public:
  explicit FakeModel(FakeModelOptions o) : o_(std::move(o)) {
    cfg_.vocab_size = kVocab;
    cfg_.max_position = o_.context;
    cfg_.eos_token_ids = {kEos};
    if (!o_.next) o_.next = HashNext;
  }
  const LlamaConfig& config() const override { return cfg_; }
  Status AllocateKvCache(int num_blocks, int block_size) override {
    num_blocks_ = num_blocks;
    bs_ = block_size;
    kv_.assign(static_cast<size_t>(num_blocks) * block_size, -1);
    return OkStatus();
  }
  KvCacheShape kv_shape() const override { return {1, 1, 1, bs_, num_blocks_}; }
  int64_t KvBytesPerToken() const override { return 64; }
  Status CopyKvBlock(int32_t src, int32_t dst) override {
    std::copy_n(kv_.begin() + src * bs_, bs_, kv_.begin() + dst * bs_);
    ++copies;
    return OkStatus();
  }
  bool SamplesOnDevice() const override { return o_.samples_on_device; }
  Status Step(const StepInput& in, StepOutput* out) override {
    if (o_.gate.valid()) o_.gate.wait();
    if (o_.on_step) o_.on_step(in);
    if (o_.step_sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(o_.step_sleep_us));
    if (steps++ == o_.fail_at_step) return InternalError("injected failure");
    max_batch = std::max<int>(max_batch, in.sequences.size());
    out->logits.clear();
    out->tokens.clear();
    out->num_rows = 0;
    for (const StepSequence& s : in.sequences) {
      if (s.logits == StepSequence::Logits::kToken && !o_.samples_on_device) {
        return InvalidArgumentError("kToken sent to a model that returns logits");
      }
      // Write K/V (here: the token ids) into the slots of this chunk.
      for (int i = 0; i < s.num_tokens; ++i) {
        const int pos = s.start_pos + i;
        if (pos / bs_ >= static_cast<int>(s.block_table.size()))
          return InternalError("block table too short");
        kv_[s.block_table[pos / bs_] * bs_ + pos % bs_] = in.token_ids[s.token_begin + i];
      }
      if (s.logits == StepSequence::Logits::kNone) continue;
      // Attend: read the whole history back through the block table.
      std::vector<int32_t> history;
      for (int pos = 0; pos < s.start_pos + s.num_tokens; ++pos) {
        const int32_t t = kv_[s.block_table[pos / bs_] * bs_ + pos % bs_];
        if (t < 0) return InternalError("KV slot for position {} was never written", pos);
        history.push_back(t);
      }
      const int32_t next = o_.next(history);
      // A peaked but smooth distribution, so seeded sampling has real choices to make.
      std::vector<float> row(kVocab);
      for (int v = 0; v < kVocab; ++v) row[v] = -0.4f * static_cast<float>((v - next + kVocab) % kVocab);
      if (s.logits == StepSequence::Logits::kToken) {
        SamplingParams p;
        p.temperature = s.sampling.temperature;
        p.top_k = s.sampling.top_k;
        p.top_p = s.sampling.top_p;
        out->tokens.push_back(Sampler(p, s.sampling.seed).SampleAt(row.data(), kVocab, s.sampling.step));
        ++device_tokens;
        continue;
      }
      out->logits.insert(out->logits.end(), row.begin(), row.end());
      ++out->num_rows;
      ++host_rows;
    }
    return OkStatus();
  }

  std::atomic<int> steps{0};
  std::atomic<int> max_batch{0};
  std::atomic<int> copies{0};
  std::atomic<int> device_tokens{0};  // Logits::kToken rows served
  std::atomic<int> host_rows{0};      // logits rows returned (kLast / kAll)

 private:
  FakeModelOptions o_;
  LlamaConfig cfg_;
  int num_blocks_ = 0;
  int bs_ = 16;
  std::vector<int32_t> kv_;
};

// Collects one request's events (engine thread writes, test reads after `done`).
struct Collector {
  std::mutex mu;
  std::vector<GenerationEvent> events;
  std::promise<void> done_promise;
  std::shared_future<void> done = done_promise.get_future().share();

  std::function<void(GenerationEvent)> Callback() {
    return [this](GenerationEvent ev) {
      std::lock_guard<std::mutex> lk(mu);
      const bool last = ev.finish != FinishReason::kNone;
      events.push_back(std::move(ev));
      if (last) done_promise.set_value();
    };
  }
  bool Wait(int seconds = 120) {  // a hang guard, not a time bound
    return done.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready;
  }
  std::vector<int32_t> Tokens() {
    std::lock_guard<std::mutex> lk(mu);
    std::vector<int32_t> t;
    for (const auto& e : events) t.insert(t.end(), e.token_ids.begin(), e.token_ids.end());
    return t;
  }
  std::string Text() {
    std::lock_guard<std::mutex> lk(mu);
    std::string s;
    for (const auto& e : events) s += e.text;
    return s;
  }
  const GenerationEvent& Last() { return events.back(); }
};

struct Spec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int priority = 0;
};

std::vector<int32_t> Prompt(int n, int32_t salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7 + salt) % 52;
  return p;
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

SamplingParams Seeded(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 8;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

std::unique_ptr<LlmLoop> MakeLoop(LlmLoopOptions lo, FakeModelOptions mo = {},
                                  FakeModel** model_out = nullptr) {
  auto model = std::make_unique<FakeModel>(std::move(mo));
  if (model_out) *model_out = model.get();
  auto loop = LlmLoop::Create(lo, std::move(model), std::make_shared<FakeTokenizer>());
  EXPECT_TRUE(loop.ok()) << loop.status().ToString();
  return loop.ok() ? std::move(*loop) : nullptr;
}

LlmLoopOptions SmallLoop(int num_blocks = 64, int budget = 32, int max_seqs = 8) {
  LlmLoopOptions lo;
  lo.block_size = 4;
  lo.num_kv_blocks = num_blocks;
  lo.scheduler.max_num_batched_tokens = budget;
  lo.scheduler.max_num_seqs = max_seqs;
  lo.scheduler.watermark_blocks = 0;
  return lo;
}

GenerationRequest Req(const std::string& id, const Spec& s, Collector& c) {
  GenerationRequest r;
  r.id = id;
  r.prompt_ids = s.prompt;
  r.sampling = s.sampling;
  r.priority = s.priority;
  r.on_event = c.Callback();
  return r;
}

// Runs each spec alone on a fresh loop: the reference outputs.
std::vector<std::pair<std::vector<int32_t>, std::string>> RunAlone(const std::vector<Spec>& specs) {
  std::vector<std::pair<std::vector<int32_t>, std::string>> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto loop = MakeLoop(SmallLoop(/*num_blocks=*/256, /*budget=*/512, /*max_seqs=*/1));
    Collector c;
    EXPECT_TRUE(loop->Submit(Req("alone", specs[i], c)).ok());
    EXPECT_TRUE(c.Wait());
    out.emplace_back(c.Tokens(), c.Text());
  }
  return out;
}

std::vector<Spec> MixedSpecs() {
  std::vector<Spec> specs;
  for (int i = 0; i < 10; ++i) {
    Spec s;
    s.prompt = Prompt(3 + (i * 11) % 37, i);
    s.sampling = i % 2 ? Seeded(5 + i * 3, 1000 + i) : Greedy(5 + i * 3);
    specs.push_back(s);
  }
  return specs;
}

// A model that samples on the device gets Logits::kToken with each request's seed and step; the outputs equal
// host sampling token for token (greedy and seeded), while logprobs requests, and stop tokens masked before
// min_tokens, still get logits rows. With LlmLoopOptions::device_sampling off every row is logits.
TEST(LlmLoopTest, DeviceSamplingMatchesHostSamplingAndFallsBackWhereLogitsAreNeeded) {
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

TEST(LlmLoopTest, BatchedRequestsGetWhatEachGetsAlone) {
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

TEST(LlmLoopTest, PreemptionKeepsOutputsIdentical) {
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

TEST(LlmLoopTest, PrefixCacheSkipsSharedPromptAndKeepsOutput) {
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

TEST(LlmLoopTest, CancelFreesBlocksWithinAStep) {
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

TEST(LlmLoopTest, CancelWhileWaiting) {
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

TEST(LlmLoopTest, StopStringEndsBeforeItAndIsNeverEmitted) {
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

TEST(LlmLoopTest, EosStopsUnlessIgnoredOrBeforeMinTokens) {
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

TEST(LlmLoopTest, StopTokenIdsEndGeneration) {
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

TEST(LlmLoopTest, Utf8IsNeverSplitAcrossEvents) {
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

TEST(LlmLoopTest, LogprobsOnePerToken) {
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

TEST(LlmLoopTest, RejectsBadRequestsWithTheNumbers) {
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

TEST(LlmLoopTest, FullQueueIsResourceExhausted) {
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

TEST(LlmLoopTest, ModelErrorFailsTheStepsRequestsOnly) {
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

TEST(LlmLoopTest, TimingsAndStepRecords) {
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
TEST(LlmLoopTest, StepRecordsCountTheWorkAndSplitTheTime) {
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
TEST(LlmLoopTest, StepRecordsWithoutCostsCountOnly) {
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
TEST(LlmLoopTest, TargetStepTimeCapsPrefillByTheMeasuredCost) {
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
    FakeModelOptions mo;
    mo.on_step = [&clock](const StepInput& in) {
      int64_t kv = 0;
      for (const StepSequence& s : in.sequences) kv += s.start_pos + s.num_tokens;
      clock.Advance(1'000'000 + 50'000 * static_cast<int64_t>(in.token_ids.size()) + 1'000 * kv);
    };
    auto loop = MakeLoop(lo, mo);
    // 40 requests over a running set of 16: prompts keep arriving as others finish.
    std::vector<Collector> c(40);
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(
          loop->Submit(Req("r" + std::to_string(i), {Prompt(150 + 7 * i, i), Greedy(24 + i % 5)}, c[i]))
              .ok());
    }
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
TEST(LlmLoopTest, LedgerStagesAddUpToTheEngineTime) {
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
TEST(LlmLoopTest, LedgerOfARequestCancelledInTheQueue) {
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

TEST(LlmLoopTest, ShutdownFailsRequestsInFlight) {
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

TEST(LlmLoopTest, SizesKvFromTheBudget) {
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

}  // namespace
}  // namespace stoke
