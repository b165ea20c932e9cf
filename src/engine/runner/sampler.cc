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
  const bool top_k_cut = top_k_ > 0 && static_cast<size_t>(top_k_) < n;
  const bool top_p_cut = top_p_ > 0.0f && top_p_ < 1.0f;
  if (top_k_cut) {
    std::nth_element(cand_.begin(), cand_.begin() + top_k_, cand_.end(), Better);
    n = top_k_;
    cand_.resize(n);
    std::sort(cand_.begin(), cand_.end(), Better);
  }
  // Without a top-k cut the candidates are unsorted: top-p then buckets them by -log p (kBucketsPerNat per
  // nat) so only the bucket straddling the nucleus edge needs sorting -- O(vocab), not O(vocab log vocab).
  constexpr int kBuckets = 4096;
  constexpr double kBucketsPerNat = 64.0;
  const bool bucketed = top_p_cut && !top_k_cut;
  if (bucketed) {
    bucket_.resize(n);
    bucket_mass_.assign(kBuckets, 0.0);
  }
  // Unnormalised probabilities, in place of the logits.
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    const double z = (static_cast<double>(max_logit) - cand_[i].first) * inv_t;  // >= 0
    const double p = std::exp(-z);
    cand_[i].first = static_cast<float>(p);
    total += p;
    if (bucketed) {
      const int b = z * kBucketsPerNat >= kBuckets - 1 ? kBuckets - 1 : static_cast<int>(z * kBucketsPerNat);
      bucket_[i] = static_cast<uint16_t>(b);
      bucket_mass_[b] += p;
    }
  }
  if (top_p_cut) {
    // The nucleus: the smallest best-first prefix whose mass reaches top_p of the total.
    const double target = top_p_ * total;
    size_t keep = 0;
    double cum = 0;
    if (bucketed) {
      int edge = 0;
      double above = 0;
      while (edge < kBuckets - 1 && above + bucket_mass_[edge] < target) above += bucket_mass_[edge++];
      nucleus_.clear();
      edge_.clear();
      for (size_t i = 0; i < n; ++i) {
        if (bucket_[i] < edge) nucleus_.push_back(cand_[i]);
        if (bucket_[i] == edge) edge_.push_back(cand_[i]);
      }
      std::sort(edge_.begin(), edge_.end(), Better);  // probabilities: larger first, ties to the lowest id
      cum = above;
      for (const auto& c : edge_) {
        nucleus_.push_back(c);
        if ((cum += c.first) >= target) break;
      }
      cand_.swap(nucleus_);
      keep = cand_.size();
    } else {
      while (keep < n) {
        cum += cand_[keep].first;
        ++keep;
        if (cum >= target) break;
      }
    }
    n = keep;
    total = 0;
    for (size_t i = 0; i < n; ++i) total += cand_[i].first;
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
