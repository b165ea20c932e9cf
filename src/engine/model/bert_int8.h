// --quantization int8 for BERT encoders: calibration, the pass that measures SmoothQuant's per-channel
// factors and, with static activation scales (Int8Activations::kStatic), those scales (docs/precision.md).
// The unquantised encoder runs over representative samples and, for each GEMM input of each layer
// (BertGemmInput), records each channel's max |x_j| (smoothing) and a high percentile of |x| over every
// element the samples produce; that value / 127 becomes the input's static int8 scale
// (BertEncoder::QuantizeWeightsInt8), and larger values clip. Per-token scales need only the first.
//
//   ASSIGN_OR_RETURN(BertActivationRanges r, CalibrateBertActivations(*fp32, samples, {.percentile
//   = 99.99})); RETURN_IF_ERROR(encoder->QuantizeWeightsInt8(r));
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/bert.h"

namespace stoke {

struct BertCalibrationOptions {
  // Of |x| over every element of a GEMM input (all samples' tokens x its width): the value at rank
  // ceil(p / 100 · N) in ascending order. 100 = the absolute maximum. Measured on all-MiniLM-L6-v2 with the
  // smoothing below (docs/precision.md): 99.999 came closest to the gate's bar (none of 99 ... 100 passes).
  double percentile = 99.999;
  // SmoothQuant's migration strength: with alpha > 0, a first pass records each input channel's max |x_j|,
  // and s_j = max|x_j|^alpha / max|W[:, j]|^(1 - alpha) (W: every Linear reading that input) moves the
  // activations' outlier channels into the weights (x_j / s_j, W[:, j] · s_j); a second pass measures the
  // percentile of |x / s|. 0 = no smoothing (one pass). Measured on all-MiniLM-L6-v2: docs/precision.md.
  double smoothing_alpha = 0.8;
  // kPerToken: only the smoothing factors are measured (each token's scale is computed at run time; the
  // percentile is unused, BertActivationRanges::layers stays 0); kStatic: the percentile pass as well.
  Int8Activations activations = Int8Activations::kPerToken;
  int batch_size = 32;         // samples per forward pass
  ThreadPool* pool = nullptr;  // null = ThreadPool::Default()
};

// Runs `fp32` (unquantised: FailedPrecondition otherwise) over `samples` (token ids incl. [CLS]/[SEP],
// truncated as Embed truncates) and returns each layer's four input ranges (and smoothing factors).
// InvalidArgument for no samples, a percentile outside (0, 100], an alpha outside [0, 1], or a bad id
// (Embed's error).
StatusOr<BertActivationRanges> CalibrateBertActivations(const BertEncoder& fp32,
                                                        const std::vector<std::vector<int32_t>>& samples,
                                                        const BertCalibrationOptions& options = {});

// The percentile value of |x| over a stream of values whose count N is known in advance: keeps only the
// K = N - ceil(p / 100 · N) + 1 largest magnitudes seen (the answer is the smallest of them), so memory is
// K floats, not N. Exposed for tests.
class AbsPercentile {
 public:
  AbsPercentile(int64_t total, double percentile);
  void Add(const float* x, int64_t n);
  // The percentile of every value added so far (counting values not yet added as 0 when fewer than `total`
  // came); 0 when nothing was added.
  float Value();

 private:
  void Prune();
  int64_t keep_ = 1;
  float floor_ = 0.f;  // values <= floor_ cannot be among the keep_ largest any more
  std::vector<float> top_;
};

}  // namespace stoke
