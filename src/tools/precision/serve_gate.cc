#include "tools/precision/serve_gate.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {

using GateResult = std::optional<precision::GateReport>;

StatusOr<std::optional<precision::GateReport>> RunServeGate(const std::string& path,
                                                            const DecoderOptions& serving,
                                                            const Tokenizer& tokenizer,
                                                            bool allow_inconsistent,
                                                            const Backends& backends) {
  DecoderOptions candidate = serving;
  candidate.device = ResolveDecoderDevice(serving.device, backends);
  if (!precision::DiffersFromReference(candidate, candidate.device)) return GateResult();
  auto text = precision::ReadGateText("");
  if (!text.ok()) {
    if (!allow_inconsistent) {
      return FailedPreconditionError(
          "consistency gate for --kv-cache-dtype {}: {} (or pass --allow-inconsistent)",
          KvCacheDtypeName(candidate.kv_cache.dtype), text.status().message());
    }
    LOG_WARN("serve: consistency gate skipped ({}); serving unchecked (--allow-inconsistent)",
             text.status().message());
    return GateResult();
  }
  LOG_INFO("serve: consistency gate: kv {} against the reference on {} ...",
           KvCacheDtypeName(candidate.kv_cache.dtype), candidate.device);
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

std::string PrecisionModelFields(const std::string& kv_cache_dtype,
                                 const std::optional<precision::GateReport>& gate) {
  nlohmann::ordered_json p;
  p["kv_cache_dtype"] = kv_cache_dtype;
  p["consistency_gate"] = gate ? precision::ReportToJson(*gate) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json out;
  out["precision"] = std::move(p);
  return out.dump();
}

Status PublishGateMetrics(const precision::GateReport& gate, const std::string& model_name,
                          const std::string& kv_cache_dtype, MetricsRegistry& registry) {
  ASSIGN_OR_RETURN(
      GaugeFamily pass,
      registry.AddGauge("stoke:precision_gate_pass",
                        "1 when the output-consistency gate run at load passed, 0 when it failed "
                        "(served with --allow-inconsistent)."));
  ASSIGN_OR_RETURN(Gauge g,
                   pass.TryWithLabels({{"model_name", model_name}, {"kv_cache_dtype", kv_cache_dtype}}));
  g.Set(gate.pass() ? 1.0 : 0.0);
  ASSIGN_OR_RETURN(GaugeFamily metric,
                   registry.AddGauge("stoke:precision_gate_metric",
                                     "Each metric of the consistency gate run at load (docs/precision.md)."));
  for (const precision::MetricResult& m : gate.metrics) {
    ASSIGN_OR_RETURN(
        Gauge mg, metric.TryWithLabels(
                      {{"model_name", model_name}, {"kv_cache_dtype", kv_cache_dtype}, {"metric", m.name}}));
    mg.Set(m.value);
  }
  return OkStatus();
}

}  // namespace stoke::precision
