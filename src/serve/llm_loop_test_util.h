// The fake decoder, tokenizer and request helpers of the LlmLoop tests (llm_loop_test.cc: outputs, stops,
// cancellation, preemption; llm_loop_steps_test.cc: step records, the step-time target, the ledger). The fake
// model's "KV cache" stores token ids in the slots the block tables name, and its logits are a deterministic
// function of the history it reads back through the block table, so a wrong position, block table, copy or
// eviction changes the output.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "base/logging.h"
#include "engine/runner/sampler.h"
#include "serve/llm_loop.h"

namespace stoke::llm_loop_testing {

// Each loop logs its sizing at info; keep test output readable.
inline const bool kQuiet = [] {
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

inline int32_t HashNext(const std::vector<int32_t>& h) {
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

inline std::vector<int32_t> Prompt(int n, int32_t salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7 + salt) % 52;
  return p;
}

inline SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

inline SamplingParams Seeded(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 8;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

// Every LlmLoopTest runs twice: with the text side of each token between steps, and on the output thread
// (LlmLoopOptions::async_output, --async-output on). MakeLoop applies the test's parameter.
inline bool& AsyncOutput() {
  static bool on = false;
  return on;
}

class LlmLoopTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { AsyncOutput() = GetParam(); }
  void TearDown() override { AsyncOutput() = false; }
};

inline std::unique_ptr<LlmLoop> MakeLoop(LlmLoopOptions lo, FakeModelOptions mo = {},
                                  FakeModel** model_out = nullptr) {
  lo.async_output = lo.async_output || AsyncOutput();
  auto model = std::make_unique<FakeModel>(std::move(mo));
  if (model_out) *model_out = model.get();
  auto loop = LlmLoop::Create(lo, std::move(model), std::make_shared<FakeTokenizer>());
  EXPECT_TRUE(loop.ok()) << loop.status().ToString();
  return loop.ok() ? std::move(*loop) : nullptr;
}

inline LlmLoopOptions SmallLoop(int num_blocks = 64, int budget = 32, int max_seqs = 8) {
  LlmLoopOptions lo;
  lo.block_size = 4;
  lo.num_kv_blocks = num_blocks;
  lo.scheduler.max_num_batched_tokens = budget;
  lo.scheduler.max_num_seqs = max_seqs;
  lo.scheduler.watermark_blocks = 0;
  return lo;
}

inline GenerationRequest Req(const std::string& id, const Spec& s, Collector& c) {
  GenerationRequest r;
  r.id = id;
  r.prompt_ids = s.prompt;
  r.sampling = s.sampling;
  r.priority = s.priority;
  r.on_event = c.Callback();
  return r;
}

// Runs each spec alone on a fresh loop: the reference outputs.
inline std::vector<std::pair<std::vector<int32_t>, std::string>> RunAlone(const std::vector<Spec>& specs) {
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

inline std::vector<Spec> MixedSpecs() {
  std::vector<Spec> specs;
  for (int i = 0; i < 10; ++i) {
    Spec s;
    s.prompt = Prompt(3 + (i * 11) % 37, i);
    s.sampling = i % 2 ? Seeded(5 + i * 3, 1000 + i) : Greedy(5 + i * 3);
    specs.push_back(s);
  }
  return specs;
}

}  // namespace stoke::llm_loop_testing
