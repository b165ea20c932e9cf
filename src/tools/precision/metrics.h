// The numbers the output-consistency gate compares a candidate precision by (docs/precision.md): pure
// functions over logits, token sequences and embeddings, with no model inside.
//
//   LogitComparison cmp;
//   cmp.Add(ref_logits, cand_logits, rows, vocab, next_tokens);   // as often as there are chunks
//   cmp.top1_agreement(), cmp.mean_kl(), cmp.reference_perplexity(), cmp.candidate_perplexity()
#pragma once

#include <cstdint>
#include <span>

namespace stoke::precision {

// Teacher-forced comparison of two models' next-token distributions over the same positions, accumulated
// chunk by chunk (so that no more than a chunk of logits is held at once). Sums in double.
class LogitComparison {
 public:
  // ref, cand = [rows, vocab] logits of the same positions; next = [rows] the token that follows each
  // position in the text (-1: none, that row counts for top-1 and KL but not for perplexity).
  void Add(std::span<const float> ref, std::span<const float> cand, int64_t rows, int vocab,
           std::span<const int32_t> next);

  int64_t positions() const { return positions_; }
  // Fraction of positions where both argmaxes are the same token (ties: the lowest id).
  double top1_agreement() const;
  // Mean over positions of KL(reference || candidate) = Σ_v p_ref(v) (log p_ref(v) - log p_cand(v)), in nats.
  double mean_kl() const;
  // exp(mean negative log-likelihood of the next token) under each model.
  double reference_perplexity() const;
  double candidate_perplexity() const;

 private:
  int64_t positions_ = 0;
  int64_t scored_ = 0;  // positions with a next token
  int64_t top1_same_ = 0;
  double kl_sum_ = 0;
  double ref_nll_ = 0;
  double cand_nll_ = 0;
};

// Greedy-text agreement of one prompt: the number of leading tokens the two generations share, divided by
// the longer generation's length (1 when both are empty).
double GreedyPrefixAgreement(std::span<const int32_t> reference, std::span<const int32_t> candidate);

// Cosine similarity of two vectors of the same length (0 when either is all zeros).
double Cosine(std::span<const float> a, std::span<const float> b);

}  // namespace stoke::precision
