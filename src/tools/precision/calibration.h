// --quantization int8 for encoders needs --calibration-data FILE: each GEMM input is divided per channel by
// SmoothQuant's factors and (--int8-activations static) multiplied with one static scale, and both must
// come from running the unquantised encoder over representative samples (engine/model/bert_int8.h). Without
// them stoke refuses int8 (kInt8NeedsCalibration).
//
// The file: UTF-8 text, one sample per line (a sentence, a query, a passage: what the encoder will be asked
// to embed). Blank lines are skipped, "\r\n" endings accepted; each line is tokenised as the server would
// (truncated to the encoder's max_seq_length); the first kMaxCalibrationSamples non-blank lines are used.
// A few hundred lines of the kind of text the model will serve are enough (docs/precision.md).
//
//   BertDeviceOptions dev{.device = "cpu", .quantization = WeightQuantization::kInt8};
//   RETURN_IF_ERROR(CalibrateForInt8(*fp32_encoder, *tokenizer, {.data = "calib.txt"}, &dev));
//   ASSIGN_OR_RETURN(auto enc, EncoderAtPrecisionFrom(std::move(fp32_encoder), dev, backends));
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/model/bert_int8.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke::precision {

inline constexpr int kMaxCalibrationSamples = 1024;

// The refusal when int8 is asked for without calibration data.
inline constexpr const char* kInt8NeedsCalibration =
    "--quantization int8 needs --calibration-data FILE (stoke.toml: calibration_data): int8 activations are "
    "smoothed per channel (SmoothQuant) and, with --int8-activations static, scaled statically, and both are "
    "measured by running the unquantised encoder over representative samples (a text file, one sample per "
    "line; docs/precision.md)";

struct Int8CalibrationOptions {
  std::string data;                                                    // the sample file ("" = none)
  double percentile = BertCalibrationOptions{}.percentile;             // --calibration-percentile
  double smoothing_alpha = BertCalibrationOptions{}.smoothing_alpha;   // --calibration-smoothing
  Int8Activations activations = BertCalibrationOptions{}.activations;  // --int8-activations
};

// The file's samples as token ids (above). InvalidArgument naming the file when it has no non-blank line;
// NotFound when it cannot be read.
StatusOr<std::vector<std::vector<int32_t>>> ReadCalibrationSamples(const std::string& path,
                                                                   const Tokenizer& tokenizer,
                                                                   int max_length);

// For options->quantization == kInt8: calibrates `fp32` on calibration.data and sets
// options->int8_ranges; InvalidArgument(kInt8NeedsCalibration) when calibration.data is empty. Any other
// quantization: nothing (OkStatus).
Status CalibrateForInt8(const BertEncoder& fp32, const Tokenizer& tokenizer,
                        const Int8CalibrationOptions& calibration, BertDeviceOptions* options);

}  // namespace stoke::precision
