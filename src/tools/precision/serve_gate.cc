#include "tools/precision/serve_gate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "engine/model/fp8_checkpoint.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {

using GateResult = std::optional<precision::GateReport>;

namespace {

// "kv int8", "weights fp8", "weights fp8, kv int8": what the candidate changes against the reference.
std::string Asked(const DecoderOptions& o) {
  std::vector<std::string> parts;
  if (o.quantization != WeightQuantization::kNone)
    parts.push_back(fmt::format("weights {}", WeightQuantizationName(o.quantization)));
  if (o.kv_cache.dtype != KvCacheDtype::kAuto)
    parts.push_back(fmt::format("kv {}", KvCacheDtypeName(o.kv_cache.dtype)));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

StatusOr<std::optional<precision::GateReport>> RunServeGate(const std::string& path,
                                                            const DecoderOptions& serving,
                                                            const Tokenizer& tokenizer,
                                                            bool allow_inconsistent,
                                                            const Backends& backends) {
  DecoderOptions candidate = serving;
  candidate.device = ResolveDecoderDevice(serving.device, backends);
  // A pre-quantised FP8 checkpoint is fp8 whatever --quantization says: fp8 is its own precision, the
  // reference, and the gate would compare it with itself. Its original is another file (model check
  // --reference); only a KV precision is left to check here.
  if (candidate.quantization == WeightQuantization::kFp8 && IsFp8CheckpointFolder(path)) {
    LOG_INFO(
        "serve: {} is a pre-quantised FP8 checkpoint: fp8 is its own precision (compare it with the model it "
        "came from: stoke model check --model {} --reference ORIGINAL)",
        path, path);
    candidate.quantization = WeightQuantization::kNone;
  }
  if (!precision::DiffersFromReference(candidate, candidate.device)) return GateResult();
  auto text = precision::ReadGateText("");
  if (!text.ok()) {
    if (!allow_inconsistent) {
      return FailedPreconditionError("consistency gate for {}: {} (or pass --allow-inconsistent)",
                                     Asked(candidate), text.status().message());
    }
    LOG_WARN("serve: consistency gate skipped ({}); serving unchecked (--allow-inconsistent)",
             text.status().message());
    return GateResult();
  }
  LOG_INFO("serve: consistency gate: {} against the reference on {} ...", Asked(candidate), candidate.device);
  auto load = [&](const DecoderOptions& o) { return LoadDecoder(path, o, backends); };
  ASSIGN_OR_RETURN(precision::GateReport report,
                   precision::CheckDecoderPrecision(load, precision::ReferenceOptions(candidate), candidate,
                                                    tokenizer, *text, precision::ServeGateOptions()));
  const std::string summary = precision::ReportToText(report);
  if (report.pass()) {
    LOG_INFO("serve: {}", summary);
    return GateResult(std::move(report));
  }
  if (!allow_inconsistent) {
    return FailedPreconditionError(
        "the consistency gate rejects this precision (--allow-inconsistent serves it "
        "anyway):\n{}",
        summary);
  }
  LOG_WARN("serve: serving a precision the consistency gate rejects (--allow-inconsistent):\n{}", summary);
  return GateResult(std::move(report));
}

std::string PrecisionModelFields(const ServedPrecision& precision,
                                 const std::optional<precision::GateReport>& gate) {
  nlohmann::ordered_json p;
  if (!precision.kv_cache_dtype.empty()) p["kv_cache_dtype"] = precision.kv_cache_dtype;  // "": an encoder
  p["quantization"] = precision.quantization;
  p["consistency_gate"] = gate ? precision::ReportToJson(*gate) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json out;
  out["precision"] = std::move(p);
  return out.dump();
}

Status PublishGateMetrics(const precision::GateReport& gate, const std::string& model_name,
                          const ServedPrecision& precision, MetricsRegistry& registry) {
  const MetricLabels labels = {
      {"model_name", model_name},
      {"kv_cache_dtype", precision.kv_cache_dtype.empty() ? "none" : precision.kv_cache_dtype},
      {"quantization", precision.quantization}};
  ASSIGN_OR_RETURN(
      GaugeFamily pass,
      registry.AddGauge("stoke:precision_gate_pass",
                        "1 when the output-consistency gate run at load passed, 0 when it failed "
                        "(served with --allow-inconsistent)."));
  ASSIGN_OR_RETURN(Gauge g, pass.TryWithLabels(labels));
  g.Set(gate.pass() ? 1.0 : 0.0);
  ASSIGN_OR_RETURN(GaugeFamily metric,
                   registry.AddGauge("stoke:precision_gate_metric",
                                     "Each metric of the consistency gate run at load (docs/precision.md)."));
  for (const precision::MetricResult& m : gate.metrics) {
    MetricLabels with_metric = labels;
    with_metric["metric"] = m.name;
    ASSIGN_OR_RETURN(Gauge mg, metric.TryWithLabels(with_metric));
    mg.Set(m.value);
  }
  return OkStatus();
}

}  // namespace stoke::precision
