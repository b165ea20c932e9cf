#include "tools/bench/workload.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

namespace stoke::bench {
namespace {

TEST(Workload, ParsesLengthSpecs) {
  auto f = ParseLengthDist("128");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, LengthDist::Kind::kFixed);
  std::mt19937_64 rng(1);
  EXPECT_EQ(f->Sample(rng), 128);
  auto u = ParseLengthDist("uniform:10:20");
  ASSERT_TRUE(u.ok());
  for (int i = 0; i < 200; ++i) {
    int v = u->Sample(rng);
    EXPECT_GE(v, 10);
    EXPECT_LE(v, 20);
  }
  auto n = ParseLengthDist("normal:500:50");
  ASSERT_TRUE(n.ok());
  double sum = 0;
  for (int i = 0; i < 2000; ++i) sum += n->Sample(rng);
  EXPECT_NEAR(sum / 2000, 500, 5);
  EXPECT_FALSE(ParseLengthDist("0").ok());
  EXPECT_FALSE(ParseLengthDist("uniform:20:10").ok());
  EXPECT_FALSE(ParseLengthDist("poisson:3").ok());
  EXPECT_FALSE(ParseLengthDist("12x").ok());
}

TEST(Workload, Presets) {
  auto s = ParseWorkload("standard");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->input.a, 512);
  EXPECT_EQ(s->output.a, 256);
  EXPECT_EQ(ParseWorkload("long")->input.a, 2000);
  EXPECT_FALSE(ParseWorkload("huge").ok());
}

TEST(Workload, SyntheticIdsHaveExactLengthAndSharedPrefix) {
  WorkloadSpec spec = *ParseWorkload("short");
  spec.input = *ParseLengthDist("uniform:40:60");
  spec.shared_prefix = 16;
  auto src = PromptSource::Create(spec, Api::kOpenAiCompletions, 7);
  ASSERT_TRUE(src.ok());
  PromptItem a = src->Next(), b = src->Next();
  for (const PromptItem* it : {&a, &b}) {
    EXPECT_EQ(static_cast<int>(it->ids.size()), it->input_tokens);
    EXPECT_GE(it->input_tokens, 40);
    EXPECT_LE(it->input_tokens, 60);
    EXPECT_EQ(it->max_tokens, 128);
    for (int32_t id : it->ids) {
      EXPECT_GE(id, 1000);
      EXPECT_LT(id, 20000);
    }
  }
  EXPECT_TRUE(std::equal(a.ids.begin(), a.ids.begin() + 16, b.ids.begin()));
  EXPECT_NE(std::vector<int32_t>(a.ids.begin() + 16, a.ids.end()),
            std::vector<int32_t>(b.ids.begin() + 16, b.ids.end()));
  // Same seed, same prompts.
  auto again = PromptSource::Create(spec, Api::kOpenAiCompletions, 7);
  EXPECT_EQ(again->Next().ids, a.ids);
}

TEST(Workload, SyntheticTextHasOneWordPerToken) {
  WorkloadSpec spec = *ParseWorkload("short");
  auto src = PromptSource::Create(spec, Api::kOpenAiChat, 1);
  ASSERT_TRUE(src.ok());
  PromptItem it = src->Next();
  EXPECT_TRUE(it.ids.empty());
  int words = 1;
  for (char c : it.text) words += c == ' ';
  EXPECT_EQ(words, 128);
  EXPECT_EQ(it.input_tokens, 128);
}

TEST(Workload, ReadsJsonlAndRejectsBadLines) {
  std::string path = ::testing::TempDir() + "/bench_workload.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt": "hello there", "max_tokens": 5})"
      << "\n\n";
    f << R"({"prompt": "second"})"
      << "\n";
  }
  WorkloadSpec spec = *ParseWorkload(path);
  ASSERT_EQ(spec.file, path);
  auto src = PromptSource::Create(spec, Api::kOpenAiCompletions, 1);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PromptItem a = src->Next(), b = src->Next(), c = src->Next();
  EXPECT_EQ(a.text, "hello there");
  EXPECT_EQ(a.max_tokens, 5);
  EXPECT_EQ(b.text, "second");
  EXPECT_EQ(b.max_tokens, 128);      // the preset's output length
  EXPECT_EQ(c.text, "hello there");  // cycles

  {
    std::ofstream f(path);
    f << R"({"prompt": "ok"})"
      << "\n"
      << R"({"prompt": 3})"
      << "\n";
  }
  auto bad = PromptSource::Create(spec, Api::kOpenAiCompletions, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos) << bad.status().message();
  {
    std::ofstream f(path);
    f << R"({"messages": [{"role": "user", "content": "x"}]})"
      << "\n";
  }
  EXPECT_FALSE(PromptSource::Create(spec, Api::kOpenAiCompletions, 1).ok());  // messages need chat
  EXPECT_TRUE(PromptSource::Create(spec, Api::kOpenAiChat, 1).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace stoke::bench
