#include "tools/precision/encoder_gate.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/logging.h"
#include "tools/precision/calibration.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {

StatusOr<EncoderAtPrecision> LoadEncoderAtPrecision(const std::string& path, const BertDeviceOptions& options,
                                                    const Backends& backends, int max_seq_length) {
  ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> loaded, BertEncoder::Load(path));
  if (max_seq_length > 0) loaded->set_max_seq_length(max_seq_length);
  return EncoderAtPrecisionFrom(std::move(loaded), options, backends);
}

StatusOr<EncoderAtPrecision> EncoderAtPrecisionFrom(std::unique_ptr<BertEncoder> loaded,
                                                    const BertDeviceOptions& options,
                                                    const Backends& backends) {
  if (loaded == nullptr) return InvalidArgumentError("no encoder");
  EncoderAtPrecision e;
  e.quantization = options.quantization;
  const std::string q = options.quantization == WeightQuantization::kNone
                            ? ""
                            : fmt::format(", weights {}", WeightQuantizationName(options.quantization));
  // On the CPU the encoder's own weights are quantised; a device quantises its copies of the fp32 ones.
  const bool cpu = ResolveBertDevice(options.device, backends) == "cpu";
  if (options.quantization == WeightQuantization::kInt8 && options.int8_ranges == nullptr) {
    return InvalidArgumentError("{}", kInt8NeedsCalibration);
  }
  if (cpu && options.quantization == WeightQuantization::kFp8)
    RETURN_IF_ERROR(loaded->QuantizeWeightsFp8({.testing_scale_multiplier = options.fp8_scale_multiplier}));
  if (cpu && options.quantization == WeightQuantization::kInt8) {
    RETURN_IF_ERROR(loaded->QuantizeWeightsInt8(
        *options.int8_ranges,
        {.testing_activation_scale_multiplier = options.int8_activation_scale_multiplier}));
  }
  e.encoder = std::move(loaded);
  ASSIGN_OR_RETURN(e.device, LoadBertOnDevice(e.encoder, options, backends));
  // "cuda:0 (...) bf16" (its own precision) or "cuda:0 (...), weights fp8"; "cpu fp32" or "cpu, weights fp8".
  if (e.device != nullptr) {
    e.label = e.device->device_name() + (q.empty() ? " bf16" : q);
  } else {
    e.label = q.empty() ? "cpu fp32" : "cpu" + q;
  }
  return e;
}

StatusOr<GateReport> CheckEncoderPrecision(std::shared_ptr<const BertEncoder> reference,
                                           const EncoderAtPrecision& candidate, const Tokenizer& tokenizer,
                                           std::string_view text, EncoderGateOptions options) {
  if (reference == nullptr || candidate.encoder == nullptr) return InvalidArgumentError("gate: no encoder");
  if (reference->hidden_size() != candidate.encoder->hidden_size()) {
    return InvalidArgumentError("gate: hidden sizes {} and {} differ", reference->hidden_size(),
                                candidate.encoder->hidden_size());
  }
  EmbedFn ref = [reference](const std::vector<std::vector<int32_t>>& ids, std::vector<float>* out) {
    return reference->Embed(ids, out);
  };
  EmbedFn cand;
  if (candidate.device != nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<BertRunner> runner, candidate.device->CreateRunner());
    std::shared_ptr<BertRunner> shared = std::move(runner);
    cand = [shared](const std::vector<std::vector<int32_t>>& ids, std::vector<float>* out) {
      return shared->Embed(ids, out, nullptr);
    };
  } else {
    std::shared_ptr<const BertEncoder> enc = candidate.encoder;
    cand = [enc](const std::vector<std::vector<int32_t>>& ids, std::vector<float>* out) {
      return enc->Embed(ids, out);
    };
  }
  options.max_length = std::min(reference->max_seq_length(), candidate.encoder->max_seq_length());
  return RunEncoderGate(ref, cand, reference->hidden_size(), tokenizer, text, options, "cpu fp32",
                        candidate.label);
}

StatusOr<std::optional<GateReport>> RunEncoderServeGate(const std::string& path,
                                                        const EncoderAtPrecision& serving,
                                                        const Tokenizer& tokenizer, bool allow_inconsistent) {
  using Result = std::optional<GateReport>;
  if (serving.quantization == WeightQuantization::kNone) return Result();
  const std::string asked = fmt::format("weights {}", WeightQuantizationName(serving.quantization));
  auto text = ReadGateText("");
  if (!text.ok()) {
    if (!allow_inconsistent) {
      return FailedPreconditionError("consistency gate for {}: {} (or pass --allow-inconsistent)", asked,
                                     text.status().message());
    }
    LOG_WARN("serve: consistency gate skipped ({}); serving unchecked (--allow-inconsistent)",
             text.status().message());
    return Result();
  }
  std::shared_ptr<const BertEncoder> reference = serving.encoder;
  if (reference == nullptr || reference->quantization() != WeightQuantization::kNone) {
    ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> fp32, BertEncoder::Load(path));
    if (serving.encoder != nullptr) fp32->set_max_seq_length(serving.encoder->max_seq_length());
    reference = std::move(fp32);
  }
  LOG_INFO("serve: consistency gate: encoder {} ({}) against the cpu's fp32 ...", asked, serving.label);
  ASSIGN_OR_RETURN(GateReport report, CheckEncoderPrecision(reference, serving, tokenizer, *text, {}));
  const std::string summary = ReportToText(report);
  if (report.pass()) {
    LOG_INFO("serve: {}", summary);
    return Result(std::move(report));
  }
  if (!allow_inconsistent) {
    return FailedPreconditionError(
        "the consistency gate rejects this precision (--allow-inconsistent serves it anyway):\n{}", summary);
  }
  LOG_WARN("serve: serving a precision the consistency gate rejects (--allow-inconsistent):\n{}", summary);
  return Result(std::move(report));
}

}  // namespace stoke::precision
