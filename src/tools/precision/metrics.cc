#include "tools/precision/metrics.h"

#include <algorithm>
#include <cmath>

namespace stoke::precision {
namespace {

// log Σ exp(x) in double, and the argmax (lowest index on ties).
struct RowStats {
  double log_sum_exp;
  int argmax;
};

RowStats Stats(const float* x, int n) {
  int arg = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[arg]) arg = i;
  }
  const double m = x[arg];
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double{x[i]} - m);
  return {m + std::log(s), arg};
}

}  // namespace

void LogitComparison::Add(std::span<const float> ref, std::span<const float> cand, int64_t rows, int vocab,
                          std::span<const int32_t> next) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * vocab;
    const float* b = cand.data() + r * vocab;
    const RowStats sa = Stats(a, vocab), sb = Stats(b, vocab);
    if (sa.argmax == sb.argmax) ++top1_same_;
    double kl = 0;
    for (int v = 0; v < vocab; ++v) {
      const double la = a[v] - sa.log_sum_exp, lb = b[v] - sb.log_sum_exp;
      kl += std::exp(la) * (la - lb);
    }
    kl_sum_ += std::max(0.0, kl);  // rounding can leave a tiny negative for equal distributions
    ++positions_;
    const int32_t t = r < static_cast<int64_t>(next.size()) ? next[r] : -1;
    if (t >= 0 && t < vocab) {
      ref_nll_ += sa.log_sum_exp - a[t];
      cand_nll_ += sb.log_sum_exp - b[t];
      ++scored_;
    }
  }
}

double LogitComparison::top1_agreement() const {
  return positions_ == 0 ? 0.0 : static_cast<double>(top1_same_) / positions_;
}
double LogitComparison::mean_kl() const {
  return positions_ == 0 ? 0.0 : kl_sum_ / positions_;
}
double LogitComparison::reference_perplexity() const {
  return scored_ == 0 ? 0.0 : std::exp(ref_nll_ / scored_);
}
double LogitComparison::candidate_perplexity() const {
  return scored_ == 0 ? 0.0 : std::exp(cand_nll_ / scored_);
}

double GreedyPrefixAgreement(std::span<const int32_t> reference, std::span<const int32_t> candidate) {
  const size_t longest = std::max(reference.size(), candidate.size());
  if (longest == 0) return 1.0;
  size_t same = 0;
  while (same < reference.size() && same < candidate.size() && reference[same] == candidate[same]) ++same;
  return static_cast<double>(same) / static_cast<double>(longest);
}

double Cosine(std::span<const float> a, std::span<const float> b) {
  double dot = 0, na = 0, nb = 0;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    dot += double{a[i]} * b[i];
    na += double{a[i]} * a[i];
    nb += double{b[i]} * b[i];
  }
  if (na == 0 || nb == 0) return 0.0;
  return dot / std::sqrt(na * nb);
}

}  // namespace stoke::precision
