#include "engine/model/bert_int8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "base/half.h"

namespace stoke {

AbsPercentile::AbsPercentile(int64_t total, double percentile) {
  const int64_t rank = static_cast<int64_t>(std::ceil(percentile / 100.0 * static_cast<double>(total)));
  keep_ = std::max<int64_t>(1, total - std::clamp<int64_t>(rank, 1, std::max<int64_t>(1, total)) + 1);
}

void AbsPercentile::Add(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > floor_ || static_cast<int64_t>(top_.size()) < keep_) top_.push_back(a);
    if (static_cast<int64_t>(top_.size()) >= 4 * keep_ + 1024) Prune();
  }
}

void AbsPercentile::Prune() {
  if (static_cast<int64_t>(top_.size()) <= keep_) return;
  std::nth_element(top_.begin(), top_.begin() + (keep_ - 1), top_.end(), std::greater<float>());
  top_.resize(keep_);
  floor_ = *std::min_element(top_.begin(), top_.end());
}

float AbsPercentile::Value() {
  if (top_.empty()) return 0.f;
  Prune();
  // Fewer kept than keep_: the missing ones are values never added (0).
  if (static_cast<int64_t>(top_.size()) < keep_) return 0.f;
  return *std::min_element(top_.begin(), top_.end());
}

namespace {

// Max |W[:, j]| over the rows of every Linear in `ws` (all [out, in], F32/F16/BF16), per column j.
std::vector<float> ColumnAbsMax(const std::vector<const BertEncoder::Linear*>& ws) {
  std::vector<float> m(ws[0]->in, 0.f);
  for (const BertEncoder::Linear* l : ws) {
    const auto* p = static_cast<const uint8_t*>(l->w);
    for (int64_t r = 0; r < l->out; ++r) {
      for (int64_t j = 0; j < l->in; ++j) {
        const int64_t i = r * l->in + j;
        float v;
        if (l->dtype == DType::kF32) {
          std::memcpy(&v, p + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          v = l->dtype == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
        }
        m[j] = std::max(m[j], std::fabs(v));
      }
    }
  }
  return m;
}

// SmoothQuant's s_j = max|x_j|^alpha / max|W_j|^(1 - alpha), kept within [1e-4, 1e4] (a dead channel or
// column would otherwise make it 0 or infinite).
std::vector<float> SmoothingFactors(const std::vector<float>& x_max, const std::vector<float>& w_max,
                                    double alpha) {
  std::vector<float> s(x_max.size());
  for (size_t j = 0; j < s.size(); ++j) {
    const double v = std::pow(std::max<double>(x_max[j], 1e-5), alpha) /
                     std::pow(std::max<double>(w_max[j], 1e-5), 1.0 - alpha);
    s[j] = static_cast<float>(std::clamp(v, 1e-4, 1e4));
  }
  return s;
}

}  // namespace

StatusOr<BertActivationRanges> CalibrateBertActivations(const BertEncoder& fp32,
                                                        const std::vector<std::vector<int32_t>>& samples,
                                                        const BertCalibrationOptions& options) {
  if (fp32.quantization() != WeightQuantization::kNone) {
    return FailedPreconditionError("calibration needs the unquantised encoder (its weights are {})",
                                   WeightQuantizationName(fp32.quantization()));
  }
  if (samples.empty()) return InvalidArgumentError("calibration: no samples");
  if (!(options.percentile > 0.0 && options.percentile <= 100.0)) {
    return InvalidArgumentError("calibration percentile {} must be in (0, 100]", options.percentile);
  }
  if (options.batch_size < 1) return InvalidArgumentError("calibration batch size must be >= 1");
  if (!(options.smoothing_alpha >= 0.0 && options.smoothing_alpha <= 1.0)) {
    return InvalidArgumentError("calibration smoothing alpha {} must be in [0, 1]", options.smoothing_alpha);
  }
  ThreadPool& pool = options.pool != nullptr ? *options.pool : ThreadPool::Default();
  const BertConfig& c = fp32.config();
  // Elements each input will see in all: tokens (as Embed truncates them) x the input's width.
  int64_t tokens = 0;
  for (const auto& s : samples)
    tokens += std::min<int64_t>(static_cast<int64_t>(s.size()), fp32.max_seq_length());
  const int64_t widths[kBertGemmInputs] = {c.hidden_size, c.hidden_size, c.hidden_size, c.intermediate_size};
  auto run_all = [&](const BertActivationObserver& observe) -> Status {
    std::vector<float> out;
    for (size_t b = 0; b < samples.size(); b += options.batch_size) {
      const size_t e = std::min(samples.size(), b + options.batch_size);
      const std::vector<std::vector<int32_t>> batch(samples.begin() + b, samples.begin() + e);
      RETURN_IF_ERROR(
          fp32.Embed(batch, &out, pool, observe).WithContext("calibration sample " + std::to_string(b)));
    }
    return OkStatus();
  };
  BertActivationRanges r;
  r.smoothing_alpha = options.smoothing_alpha;
  if (options.smoothing_alpha > 0.0) {
    // Pass 1: each input channel's max |x_j|; then the factors from it and the weights' column maxima.
    std::vector<std::vector<float>> x_max;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      for (int j = 0; j < kBertGemmInputs; ++j) x_max.emplace_back(widths[j], 0.f);
    }
    RETURN_IF_ERROR(run_all([&](int layer, BertGemmInput input, const float* x, int64_t rows, int64_t cols) {
      std::vector<float>& m = x_max[layer * kBertGemmInputs + static_cast<int>(input)];
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) m[j] = std::max(m[j], std::fabs(x[i * cols + j]));
      }
    }));
    r.smooth.resize(c.num_hidden_layers);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const BertEncoder::Layer& L = fp32.layers()[l];
      const std::vector<const BertEncoder::Linear*> readers[kBertGemmInputs] = {
          {&L.query, &L.key, &L.value}, {&L.attn_out}, {&L.intermediate}, {&L.output}};
      for (int j = 0; j < kBertGemmInputs; ++j) {
        r.smooth[l][j] = SmoothingFactors(x_max[l * kBertGemmInputs + j], ColumnAbsMax(readers[j]),
                                          options.smoothing_alpha);
      }
    }
  }
  r.activations = options.activations;
  r.samples = static_cast<int64_t>(samples.size());
  r.tokens = tokens;
  r.layers.resize(c.num_hidden_layers);  // per-token: all 0, unused (no static scale)
  if (options.activations == Int8Activations::kPerToken) return r;
  // Pass 2 (static scales; the only one without smoothing): the percentile of |x / s| per input.
  std::vector<AbsPercentile> stats;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int j = 0; j < kBertGemmInputs; ++j) stats.emplace_back(tokens * widths[j], options.percentile);
  }
  std::vector<float> scratch;
  RETURN_IF_ERROR(run_all([&](int layer, BertGemmInput input, const float* x, int64_t rows, int64_t cols) {
    AbsPercentile& st = stats[layer * kBertGemmInputs + static_cast<int>(input)];
    if (r.smooth.empty()) return st.Add(x, rows * cols);
    const std::vector<float>& s = r.smooth[layer][static_cast<int>(input)];
    scratch.resize(rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) scratch[i * cols + j] = x[i * cols + j] / s[j];
    }
    st.Add(scratch.data(), rows * cols);
  }));
  r.percentile = options.percentile;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int j = 0; j < kBertGemmInputs; ++j) r.layers[l][j] = stats[l * kBertGemmInputs + j].Value();
  }
  return r;
}

}  // namespace stoke
