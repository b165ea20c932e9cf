#include "tools/precision/calibration.h"

#include <memory>

#include "base/file_util.h"
#include "base/logging.h"

namespace stoke::precision {

StatusOr<std::vector<std::vector<int32_t>>> ReadCalibrationSamples(const std::string& path,
                                                                   const Tokenizer& tokenizer,
                                                                   int max_length) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return NotFoundError("--calibration-data {}: {}", path, text.status().message());
  }
  std::vector<std::vector<int32_t>> samples;
  size_t start = 0;
  while (start < text->size() && static_cast<int>(samples.size()) < kMaxCalibrationSamples) {
    size_t end = text->find('\n', start);
    if (end == std::string::npos) end = text->size();
    std::string_view line(text->data() + start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(line, {.max_length = max_length}));
    samples.push_back(std::move(ids));
  }
  if (samples.empty()) {
    return InvalidArgumentError("--calibration-data {}: no samples (expected one sample per line)", path);
  }
  return samples;
}

Status CalibrateForInt8(const BertEncoder& fp32, const Tokenizer& tokenizer,
                        const Int8CalibrationOptions& calibration, BertDeviceOptions* options) {
  if (options->quantization != WeightQuantization::kInt8) return OkStatus();
  if (calibration.data.empty()) return InvalidArgumentError("{}", kInt8NeedsCalibration);
  ASSIGN_OR_RETURN(auto samples, ReadCalibrationSamples(calibration.data, tokenizer, fp32.max_seq_length()));
  ASSIGN_OR_RETURN(BertActivationRanges ranges,
                   CalibrateBertActivations(fp32, samples,
                                            {.percentile = calibration.percentile,
                                             .smoothing_alpha = calibration.smoothing_alpha,
                                             .activations = calibration.activations}));
  LOG_INFO("int8 calibration: {} samples ({} tokens) of {}, {} activation scales{}, smoothing alpha {}",
           ranges.samples, ranges.tokens, calibration.data, Int8ActivationsName(ranges.activations),
           ranges.activations == Int8Activations::kStatic
               ? fmt::format(" (percentile {} of |x| per GEMM input)", ranges.percentile)
               : std::string(),
           ranges.smoothing_alpha);
  options->int8_ranges = std::make_shared<const BertActivationRanges>(std::move(ranges));
  return OkStatus();
}

}  // namespace stoke::precision
