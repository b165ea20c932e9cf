#include "engine/runner/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace stoke {
namespace {

SamplingParams Params(float t, int top_k = 0, float top_p = 1.0f) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

std::vector<float> RandomLogits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(SamplerTest, GreedyTakesArgmaxWithTiesToLowestId) {
  Sampler s(Params(0.0f), 1);
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(s.Sample(l.data(), 5), 1);
  l[4] = 7.0f;
  EXPECT_EQ(s.Sample(l.data(), 5), 4);
  l[0] = NAN;  // NaN never wins
  EXPECT_EQ(s.Sample(l.data(), 5), 4);
  // top_k = 1 is greedy whatever the temperature.
  Sampler k1(Params(1.5f, 1), 9);
  std::vector<float> m = {1.0f, 3.0f, 3.0f, 0.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.Sample(m.data(), 4), 1);
}

TEST(SamplerTest, SameSeedAndStepGiveSameTokenWhateverElseRan) {
  const std::vector<float> l = RandomLogits(1000, 3, 1.0f);
  Sampler a(Params(1.0f), 42), b(Params(1.0f), 42), c(Params(1.0f), 43);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.Sample(l.data(), 1000));
    sc.push_back(c.Sample(l.data(), 1000));
  }
  // b draws step by step out of order: the draw depends only on (seed, step).
  for (int i = 49; i >= 0; --i) sb.insert(sb.begin(), b.SampleAt(l.data(), 1000, i));
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  EXPECT_EQ(a.step(), 50u);
  EXPECT_EQ(b.step(), 0u);  // SampleAt does not advance
  // Resuming at a step reproduces the rest of the stream.
  Sampler r(Params(1.0f), 42);
  r.set_step(20);
  for (int i = 20; i < 50; ++i) EXPECT_EQ(r.Sample(l.data(), 1000), sa[i]);
}

TEST(SamplerTest, UniformIsUniformAndDecorrelated) {
  const int n = 200000;
  double sum = 0, sum_sq = 0, lag = 0, prev = Sampler::Uniform(7, 0);
  int buckets[10] = {};
  for (int i = 1; i <= n; ++i) {
    const double u = Sampler::Uniform(7, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u, sum_sq += u * u, lag += (u - 0.5) * (prev - 0.5);
    buckets[static_cast<int>(u * 10)]++;
    prev = u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sum_sq / n - 0.25, 1.0 / 12, 0.003);
  EXPECT_NEAR(lag / n, 0.0, 0.002);
  for (int b : buckets) EXPECT_NEAR(b, n / 10, n / 10 * 0.05);
  // Neighbouring seeds give unrelated streams.
  int same = 0;
  for (int i = 0; i < 1000; ++i)
    same += static_cast<int>(Sampler::Uniform(1, i) * 100) == static_cast<int>(Sampler::Uniform(2, i) * 100);
  EXPECT_LT(same, 30);
}

// Empirical frequencies over many steps match softmax(logits / T) restricted by top-k / top-p.
std::map<int32_t, double> Frequencies(Sampler& s, const std::vector<float>& l, int draws) {
  std::map<int32_t, double> f;
  for (int i = 0; i < draws; ++i) f[s.Sample(l.data(), static_cast<int>(l.size()))] += 1.0 / draws;
  return f;
}

TEST(SamplerTest, TemperatureSamplesTheSoftmax) {
  const std::vector<float> l = {1.0f, 2.0f, 0.0f, 3.0f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(Params(t), 5);
    auto f = Frequencies(s, l, 100000);
    double z = 0;
    for (float x : l) z += std::exp(x / t);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], std::exp(l[i] / t) / z, 0.006) << "t " << t << " id " << i;
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKBest) {
  const std::vector<float> l = {1.0f, 2.0f, 0.0f, 3.0f, 2.5f};
  Sampler s(Params(1.0f, 2), 11);
  auto f = Frequencies(s, l, 50000);
  ASSERT_EQ(f.size(), 2u);  // only ids 3 and 4
  const double p3 = std::exp(3.0) / (std::exp(3.0) + std::exp(2.5));
  EXPECT_NEAR(f[3], p3, 0.01);
  EXPECT_NEAR(f[4], 1 - p3, 0.01);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  // probs ≈ 0.5, 0.25, 0.125, 0.0625, 0.0625 (ids 0..4, logits log2-spaced).
  const std::vector<float> l = {std::log(8.0f), std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
  {
    Sampler s(Params(1.0f, 0, 0.7f), 13);  // 0.5 < 0.7 <= 0.75: ids 0, 1
    auto f = Frequencies(s, l, 60000);
    ASSERT_EQ(f.size(), 2u);
    EXPECT_NEAR(f[0], 2.0 / 3, 0.01);
    EXPECT_NEAR(f[1], 1.0 / 3, 0.01);
  }
  {
    Sampler s(Params(1.0f, 0, 0.8f), 17);  // 0.75 < 0.8 <= 0.875: ids 0, 1, 2
    auto f = Frequencies(s, l, 60000);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_NEAR(f[2], 1.0 / 7, 0.01);
  }
  {
    Sampler s(Params(1.0f, 0, 0.3f), 19);  // the best token alone already holds 0.5
    auto f = Frequencies(s, l, 1000);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_EQ(f.begin()->first, 0);
  }
}

TEST(SamplerTest, TopPOverALargeVocabMatchesItsMass) {
  // 49152 ids and a flat distribution: the bucketed nucleus search must find the exact nucleus.
  const std::vector<float> l = RandomLogits(49152, 23, 2.0f);
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp(double(l[i])));
  std::vector<int32_t> order(l.size());
  for (size_t i = 0; i < l.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  double cum = 0;
  size_t nucleus = 0;
  while (cum < 0.9 * z) cum += p[order[nucleus++]];
  std::set<int32_t> allowed(order.begin(), order.begin() + nucleus);
  Sampler s(Params(1.0f, 0, 0.9f), 29);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(allowed.count(s.Sample(l.data(), 49152)));
  EXPECT_GT(nucleus, 1000u);  // a wide nucleus, spread over many buckets
}

TEST(SamplerTest, TopKThenTopP) {
  // top-k 3 of {4, 2, 1, 1, 0.5}·ln-ish, then top-p over the renormalised three.
  const std::vector<float> l = {std::log(4.0f), std::log(2.0f), std::log(1.0f), std::log(1.0f),
                                std::log(0.5f)};
  Sampler s(Params(1.0f, 3, 0.6f), 31);  // top-3 probs 4/7, 2/7, 1/7: 0.57 < 0.6 -> ids 0, 1
  auto f = Frequencies(s, l, 30000);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[0], 2.0 / 3, 0.015);
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  Sampler s(Params(0.3f), 1);  // temperature does not change logprobs
  TokenLogprob lp = s.Logprobs(l.data(), 4, 2, 3);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  EXPECT_EQ(lp.token_id, 2);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // tie between 1 and 3: lowest id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_TRUE(s.Logprobs(l.data(), 4, 0, 0).top.empty());
  EXPECT_EQ(s.Logprobs(l.data(), 4, 0, 99).top.size(), 4u);  // clamped to the vocab
}

}  // namespace
}  // namespace stoke
