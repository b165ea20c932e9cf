#include "engine/runner/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"

namespace stoke {
namespace {

using testing::TinyLlama;

std::unique_ptr<CpuLlama> Make(const TinyLlama& m) {
  auto model = CpuLlama::Create(m.ToWeights(true));
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

int32_t Argmax(const float* x, int n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

GenerateOptions Greedy(int max_tokens) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.sampling.max_tokens = max_tokens;
  o.block_size = 4;
  return o;
}

const std::vector<int32_t> kPrompt = {1, 40, 7, 93, 12, 55, 3};

TEST(GenerateTest, GreedyFollowsTheReferenceArgmax) {
  TinyLlama m(5);
  auto model = Make(m);
  std::vector<int32_t> streamed;
  auto r = Generate(*model, kPrompt, Greedy(12), [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tokens.size(), 12u);
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_EQ(streamed, r->tokens);
  EXPECT_EQ(r->prompt_tokens, 7);
  EXPECT_EQ(r->decode_steps, 11);
  std::vector<int32_t> seq = kPrompt;
  for (int32_t t : r->tokens) {
    const std::vector<float> ref = m.Reference(seq);
    EXPECT_EQ(t, Argmax(ref.data() + (seq.size() - 1) * m.c.vocab_size, m.c.vocab_size));
    seq.push_back(t);
  }
}

TEST(GenerateTest, StopsAtEosUnlessIgnoredOrTooEarly) {
  TinyLlama m(5);
  auto model = Make(m);
  auto free_run = Generate(*model, kPrompt, Greedy(12));
  ASSERT_TRUE(free_run.ok());
  const int32_t eos = free_run->tokens[3];
  const size_t first =
      std::find(free_run->tokens.begin(), free_run->tokens.end(), eos) - free_run->tokens.begin();

  GenerateOptions o = Greedy(12);
  o.eos_ids = {eos};
  auto stopped = Generate(*model, kPrompt, o);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, FinishReason::kStop);
  EXPECT_EQ(stopped->tokens,
            std::vector<int32_t>(free_run->tokens.begin(), free_run->tokens.begin() + first));

  o.sampling.ignore_eos = true;
  auto ignored = Generate(*model, kPrompt, o);
  ASSERT_TRUE(ignored.ok());
  EXPECT_EQ(ignored->tokens, free_run->tokens);

  o.sampling.ignore_eos = false;
  o.eos_ids.clear();
  o.sampling.stop_token_ids = {eos};
  o.sampling.min_tokens = static_cast<int>(first) + 1;  // the first EOS comes too early to stop
  auto min_run = Generate(*model, kPrompt, o);
  ASSERT_TRUE(min_run.ok());
  EXPECT_GT(min_run->tokens.size(), first);
  EXPECT_EQ(min_run->tokens[first], eos);
}

TEST(GenerateTest, CallbackCanCancel) {
  TinyLlama m(6);
  auto model = Make(m);
  int calls = 0;
  auto r = Generate(*model, kPrompt, Greedy(10), [&](int32_t) { return ++calls < 4; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish, FinishReason::kCancelled);
  EXPECT_EQ(r->tokens.size(), 4u);
}

TEST(GenerateTest, SeededSamplingIsReproducibleAcrossChunkingAndBlockSizes) {
  TinyLlama m(7);
  auto model = Make(m);
  GenerateOptions o;
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.95f;
  o.sampling.seed = 1234;
  o.sampling.max_tokens = 16;
  auto a = Generate(*model, kPrompt, o);
  o.prefill_chunk = 2;
  o.block_size = 3;
  auto b = Generate(*model, kPrompt, o);
  o.sampling.seed = 4321;
  auto c = Generate(*model, kPrompt, o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

TEST(GenerateTest, RespectsTheContextLength) {
  TinyLlama m(8);
  m.c.max_position = 10;
  auto model = Make(m);
  auto r = Generate(*model, kPrompt, Greedy(50));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->tokens.size(), 3u);  // 7 prompt + 3 = 10
  EXPECT_EQ(r->finish, FinishReason::kLength);
  std::vector<int32_t> long_prompt(10, 5);
  EXPECT_EQ(Generate(*model, long_prompt, Greedy(5)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate(*model, {}, Greedy(5)).status().code(), StatusCode::kInvalidArgument);
}

TEST(ScoreLogitsTest, MatchesReferenceForEveryChunkSize) {
  TinyLlama m(9);
  auto model = Make(m);
  std::vector<int32_t> ids;
  for (int i = 0; i < 45; ++i) ids.push_back((i * 37 + 11) % m.c.vocab_size);
  const std::vector<float> ref = m.Reference(ids);
  for (int chunk : {45, 16, 7, 1}) {
    auto got = ScoreLogits(*model, ids, chunk, 8);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) num += std::pow((*got)[i] - ref[i], 2), den += ref[i] * ref[i];
    EXPECT_LT(std::sqrt(num / den), 2e-5) << "chunk " << chunk;
  }
  EXPECT_FALSE(ScoreLogits(*model, ids, 0).ok());
}

}  // namespace
}  // namespace stoke
