// Token sampling from one row of logits: greedy, temperature, top-k, top-p, and logprobs.
//
// Randomness is counter-based: the uniform draw for a request's n-th sample is a hash of (seed, n), so a
// request's samples depend only on its seed and its own step count -- never on which other requests share
// the batch, or on how many times other samplers ran.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "api/sampling.h"

namespace stoke {

class Sampler {
 public:
  // Uses p.temperature, p.top_k, p.top_p; `seed` picks the random stream (see SeedFor).
  explicit Sampler(const SamplingParams& p, uint64_t seed);

  // Draws the token for the next step (the step counter then advances). temperature <= 0 or top_k == 1:
  // argmax, ties to the lowest id. Otherwise softmax(logits / T), restricted to the top_k largest, then to
  // the smallest prefix (best first) whose mass reaches top_p, renormalised and sampled.
  int32_t Sample(const float* logits, int vocab);
  // Same as Sample at an explicit step, without advancing the counter.
  int32_t SampleAt(const float* logits, int vocab, uint64_t step);

  // log-softmax of the raw logits (no temperature): the chosen id's logprob and the k best alternatives
  // (best first, ties to the lowest id). k is clamped to [0, vocab].
  TokenLogprob Logprobs(const float* logits, int vocab, int32_t chosen, int k) const;

  uint64_t step() const { return step_; }
  void set_step(uint64_t step) { step_ = step; }  // resume after preemption-by-recompute
  uint64_t seed() const { return seed_; }

  // The seed of a request: its own when given, else a fresh random one.
  static uint64_t SeedFor(const SamplingParams& p);
  // The uniform in [0, 1) drawn at (seed, step).
  static double Uniform(uint64_t seed, uint64_t step);

 private:
  int32_t Greedy(const float* logits, int vocab) const;

  float temperature_;
  int top_k_;
  float top_p_;
  uint64_t seed_;
  uint64_t step_ = 0;
  // Scratch, reused across calls: candidates (logit, then probability; id), their top-p buckets.
  std::vector<std::pair<float, int32_t>> cand_, nucleus_, edge_;
  std::vector<uint16_t> bucket_;
  std::vector<double> bucket_mass_;
};

}  // namespace stoke
