// The output-consistency gate each decoder load of `stoke serve` runs (src/server/model_loader.cc;
// docs/precision.md "At load"): when the decoder options ask for another precision than the backend's
// reference (the KV cache dtype, the weight quantisation), the model is loaded at both precisions, compared
// over a few hundred tokens of the gate text (tools/precision/gate.h), and a failing precision is refused
// unless --allow-inconsistent. The result goes to /metrics and to the model's GET /v1/models entry.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "engine/model/backends.h"
#include "engine/model/factory.h"
#include "engine/tokenizer/tokenizer.h"
#include "telemetry/metrics.h"
#include "tools/precision/gate.h"

namespace stoke::precision {

// nullopt when the options are the reference precision (nothing to compare). FailedPrecondition naming the
// failing metrics when the gate fails and !allow_inconsistent; with allow_inconsistent a failing report is
// returned (and logged as a warning). The models load through LoadDecoder with `backends`.
StatusOr<std::optional<precision::GateReport>> RunServeGate(const std::string& path,
                                                            const DecoderOptions& serving,
                                                            const Tokenizer& tokenizer,
                                                            bool allow_inconsistent,
                                                            const Backends& backends);

// The precision a decoder was loaded at, as DecoderModel names it.
struct ServedPrecision {
  // kv_cache_dtype_name(): "fp32", "bf16", "int8", "fp8"; "" for an encoder (no KV cache: left out of the
  // /v1/models entry, "none" in the gauges' label).
  std::string kv_cache_dtype;
  std::string quantization = "none";  // quantization_name(): "none", "fp8"
};

// {"precision": {"kv_cache_dtype": "int8", "quantization": "none", "consistency_gate": {pass, metrics, ...} |
// null}} as text, for DecoderHandle::model_fields (serve/repository/model_repository.h).
std::string PrecisionModelFields(const ServedPrecision& precision,
                                 const std::optional<precision::GateReport>& gate);

// Gauges stoke:precision_gate_pass {model_name, kv_cache_dtype, quantization} (1 pass, 0 fail) and
// stoke:precision_gate_metric {model_name, kv_cache_dtype, quantization, metric} (each metric's value).
Status PublishGateMetrics(const precision::GateReport& gate, const std::string& model_name,
                          const ServedPrecision& precision, MetricsRegistry& registry);

}  // namespace stoke::precision
