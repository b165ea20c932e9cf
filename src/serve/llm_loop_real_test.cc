// LlmLoop over the real SmolLM2-135M (Q4_1 GGUF): batched, chunked and prefix-cached requests must produce
// the greedy tokens the single-sequence runner (engine/runner/generate.h) produces for each prompt alone.
// Skips when the model is not on disk (STOKE_MODEL_DIR, default ~/.cache/stoke/models).
#include <gtest/gtest.h>

#include <filesystem>
#include <future>

#include "engine/loader/model_registry.h"
#include "engine/model/factory.h"
#include "engine/runner/generate.h"
#include "serve/llm_loop.h"

namespace stoke {
namespace {

std::string SmolLmPath() {
  return DefaultModelDir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
}

#define SKIP_WITHOUT_MODEL(p)                                                                               \
  if (!std::filesystem::exists(p))                                                                          \
  GTEST_SKIP() << "model not on disk: " << (p) << " (run `stoke model fetch smollm2-135m-instruct` or set " \
               << "STOKE_MODEL_DIR)"

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  GenerationEvent last;
};

TEST(LlmLoopRealModelTest, BatchedGreedyMatchesSingleSequenceRunner) {
  const std::string path = SmolLmPath();
  SKIP_WITHOUT_MODEL(path);
  auto tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::shared_ptr<const Tokenizer> tokenizer = std::move(*tok);

  // Two prompts share a long prefix (prefix cache), one is short, one is long enough to be chunked.
  const std::string shared =
      "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
      "All that glitters is not gold, and not all those who wander are lost. ";
  const std::vector<std::string> texts = {
      shared + "The moral of the story is",
      shared + "In summary, the author argues that",
      "Paris is the capital of",
      "Once upon a time, in a small village by the sea, there lived an old fisherman who every morning",
  };
  constexpr int kMaxTokens = 10;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = kMaxTokens;
  greedy.ignore_eos = true;  // fixed length: compare every position

  std::vector<std::vector<int32_t>> prompts, expected;
  {
    auto model = LoadDecoder(path);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    for (const std::string& t : texts) {
      auto ids = tokenizer->Encode(t);
      ASSERT_TRUE(ids.ok());
      prompts.push_back(*ids);
      GenerateOptions go;
      go.sampling = greedy;
      auto r = Generate(**model, *ids, go);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      expected.push_back(r->tokens);
    }
  }

  auto model = LoadDecoder(path);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  LlmLoopOptions lo;
  lo.kv_budget_bytes = int64_t{64} << 20;
  lo.scheduler.max_num_batched_tokens = 24;  // the long prompts are chunked, decodes interleave
  auto loop = LlmLoop::Create(lo, std::move(*model), tokenizer);
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();

  // The first prompt runs alone first so the second finds the shared prefix in the cache.
  std::vector<Result> results(texts.size());
  std::vector<std::promise<void>> done(texts.size());
  auto submit = [&](size_t i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt_ids = prompts[i];
    r.sampling = greedy;
    r.on_event = [&, i](GenerationEvent ev) {
      results[i].tokens.insert(results[i].tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      results[i].text += ev.text;
      if (ev.finish != FinishReason::kNone) {
        results[i].last = std::move(ev);
        done[i].set_value();
      }
    };
    ASSERT_TRUE((*loop)->Submit(std::move(r)).ok());
  };
  submit(0);
  ASSERT_EQ(done[0].get_future().wait_for(std::chrono::minutes(2)), std::future_status::ready);
  for (size_t i = 1; i < texts.size(); ++i) submit(i);
  for (size_t i = 1; i < texts.size(); ++i) {
    ASSERT_EQ(done[i].get_future().wait_for(std::chrono::minutes(2)), std::future_status::ready);
  }
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(results[i].tokens, expected[i]) << "prompt " << i << ": " << texts[i] << results[i].text;
    EXPECT_EQ(results[i].last.finish, FinishReason::kLength);
    EXPECT_EQ(results[i].text, tokenizer->Decode(expected[i])) << "prompt " << i;
  }
  // The shared text is ~38 tokens: at least two full blocks of 16 come from the cache.
  EXPECT_GE(results[1].last.cached_prompt_tokens, 32) << "the shared prefix was not reused";
  EXPECT_EQ(results[0].last.cached_prompt_tokens, 0);
}

}  // namespace
}  // namespace stoke
