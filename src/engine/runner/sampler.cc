#include "engine/runner/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace stoke {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Best first: larger logit, then lower id. NaN sorts last.
bool Better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  const bool an = std::isnan(a.first), bn = std::isnan(b.first);
  if (an != bn) return bn;
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

}  // namespace

Sampler::Sampler(const SamplingParams& p, uint64_t seed)
    : temperature_(p.temperature), top_k_(p.top_k), top_p_(p.top_p), seed_(seed) {}

uint64_t Sampler::SeedFor(const SamplingParams& p) {
  if (p.seed.has_value()) return *p.seed;
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

double Sampler::Uniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(step ^ 0x5851f42d4c957f2dull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t Sampler::Greedy(const float* logits, int vocab) const {
  int32_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > best_v) {  // strict: ties keep the lowest id
      best = i;
      best_v = logits[i];
      found = true;
    }
  }
  return best;
}

int32_t Sampler::Sample(const float* logits, int vocab) {
  const int32_t id = SampleAt(logits, vocab, step_);
  ++step_;
  return id;
}

int32_t Sampler::SampleAt(const float* logits, int vocab, uint64_t step) {
  if (vocab <= 0) return 0;
  if (!(temperature_ > 0) || top_k_ == 1) return Greedy(logits, vocab);
  const double inv_t = 1.0 / temperature_;
  const double u = Uniform(seed_, step);

  // Candidates best first when a cut (top-k / top-p) needs an order; all ids in id order otherwise.
  cand_.clear();
  cand_.reserve(vocab);
  for (int i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) cand_.emplace_back(logits[i], i);
  }
  if (cand_.empty()) return 0;
  size_t n = cand_.size();
  const float max_logit = std::min_element(cand_.begin(), cand_.end(), Better)->first;  // the best
  if (!std::isfinite(max_logit)) return Greedy(logits, vocab);  // all -inf, or +inf present
  if (top_k_ > 0 && static_cast<size_t>(top_k_) < n) {
    std::nth_element(cand_.begin(), cand_.begin() + top_k_, cand_.end(), Better);
    n = top_k_;
    std::sort(cand_.begin(), cand_.begin() + n, Better);
  }
  // Unnormalised probabilities, in place of the logits.
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp((static_cast<double>(cand_[i].first) - max_logit) * inv_t);
    cand_[i].first = static_cast<float>(p);
    total += p;
  }
  if (top_p_ < 1.0f && top_p_ > 0.0f) {
    if (top_k_ <= 0 || static_cast<size_t>(top_k_) >= cand_.size()) {
      // Not sorted yet: sort a growing head until it holds top_p of the mass (usually a few hundred ids).
      size_t head = std::min<size_t>(n, 256);
      for (;;) {
        auto by_prob = [](const auto& a, const auto& b) {
          return a.first != b.first ? a.first > b.first : a.second < b.second;
        };
        std::partial_sort(cand_.begin(), cand_.begin() + head, cand_.begin() + n, by_prob);
        double mass = 0;
        for (size_t i = 0; i < head; ++i) mass += cand_[i].first;
        if (mass >= top_p_ * total || head == n) break;
        head = std::min(n, head * 4);
      }
    }
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += cand_[keep].first;
      ++keep;
      if (cum >= top_p_ * total) break;
    }
    n = keep;
    total = cum;
  }
  const double target = u * total;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cand_[i].first;
    if (target < cum) return cand_[i].second;
  }
  return cand_[n - 1].second;  // rounding at the very end of the mass
}

TokenLogprob Sampler::Logprobs(const float* logits, int vocab, int32_t chosen, int k) const {
  TokenLogprob out;
  out.token_id = chosen;
  if (vocab <= 0) return out;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double lse = max_logit + std::log(sum);
  if (chosen >= 0 && chosen < vocab) out.logprob = static_cast<float>(logits[chosen] - lse);
  k = std::clamp(k, 0, vocab);
  if (k > 0) {
    std::vector<std::pair<float, int32_t>> all(vocab);
    for (int i = 0; i < vocab; ++i) all[i] = {logits[i], i};
    std::partial_sort(all.begin(), all.begin() + k, all.end(), Better);
    out.top.reserve(k);
    for (int i = 0; i < k; ++i) out.top.emplace_back(all[i].second, static_cast<float>(all[i].first - lse));
  }
  return out;
}

}  // namespace stoke
