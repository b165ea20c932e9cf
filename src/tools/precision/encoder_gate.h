// The output-consistency gate for encoders at a lower weight precision (--quantization fp8;
// docs/precision.md): the encoder loaded at that precision on its device, and compared with the CPU's fp32
// encoder of the same folder by the cosine of their embeddings (RunEncoderGate, gate.h). Used by
// `stoke model check` and by each encoder load of `stoke serve` (src/server/model_loader.cc).
//
//   ASSIGN_OR_RETURN(EncoderAtPrecision cand, LoadEncoderAtPrecision(path, {.device = "cpu",
//                                                 .quantization = WeightQuantization::kFp8}, backends));
//   ASSIGN_OR_RETURN(auto gate, RunEncoderServeGate(path, cand, *tok, allow_inconsistent));
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "api/weight_quantization.h"
#include "base/status.h"
#include "engine/model/backends.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/precision/gate.h"

namespace stoke::precision {

// An encoder as it serves: its CPU form and, on a device, the device's model.
struct EncoderAtPrecision {
  std::shared_ptr<const BertEncoder> encoder;  // fp32, or (cpu + fp8) its fp8 round trip
  std::shared_ptr<BertDeviceModel> device;     // null on the CPU
  WeightQuantization quantization = WeightQuantization::kNone;
  std::string
      label;  // "cpu fp32", "cpu, weights fp8", "cuda:0 (NVIDIA H200) bf16", "cuda:0 (...), weights fp8"
};

// Loads the BERT folder `path` for `options.device` at `options.quantization`: on the CPU with kFp8 the
// encoder's weights are quantised here (BertEncoder::QuantizeWeightsFp8, with options.fp8_scale_multiplier as
// its testing multiplier); on a device the encoder stays fp32 and LoadBertOnDevice gets the options as they
// are (the device quantises its own copies). max_seq_length > 0 overrides the encoder's.
StatusOr<EncoderAtPrecision> LoadEncoderAtPrecision(const std::string& path, const BertDeviceOptions& options,
                                                    const Backends& backends, int max_seq_length = 0);

// The same for an encoder already loaded (its fp32 weights; set_max_seq_length applied).
StatusOr<EncoderAtPrecision> EncoderAtPrecisionFrom(std::unique_ptr<BertEncoder> encoder,
                                                    const BertDeviceOptions& options,
                                                    const Backends& backends);

// Compares `candidate` with `reference` (the CPU fp32 encoder) over the text's sentences (a runner of the
// candidate's device is created for it). The report's labels: "cpu fp32" and candidate.label.
StatusOr<GateReport> CheckEncoderPrecision(std::shared_ptr<const BertEncoder> reference,
                                           const EncoderAtPrecision& candidate, const Tokenizer& tokenizer,
                                           std::string_view text, EncoderGateOptions options);

// The check `stoke serve` runs when it loads an encoder: nullopt when the weights are the checkpoint's
// (quantization none: nothing to compare). Else the CPU fp32 reference (candidate.encoder itself when it is
// fp32: on a device; else loaded again from `path`) against `serving`, on the default gate text. A failing
// report: FailedPrecondition with the report unless allow_inconsistent (then returned, and logged as a
// warning); a missing gate text likewise (refused, or served unchecked).
StatusOr<std::optional<GateReport>> RunEncoderServeGate(const std::string& path,
                                                        const EncoderAtPrecision& serving,
                                                        const Tokenizer& tokenizer, bool allow_inconsistent);

}  // namespace stoke::precision
