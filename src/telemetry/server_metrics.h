// The server's metric set, named after vLLM's with the `stoke:` prefix (or `stoke_` with
// MetricNaming::kPrometheus, see telemetry/metrics.h), each labelled with model_name. Fed
// from three places:
//   - the engine thread, once per step:            RecordStep(StepRecord)
//   - whoever sees a request finish (net layer):   RecordRequest(RequestRecord), ObserveStage(...)
//   - a snapshot of the engine's counters, pulled on each scrape through SetSnapshotSource()
// ExposeText() is what GET /metrics serves. Thread-safe.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/sampling.h"
#include "base/status.h"
#include "telemetry/metrics.h"
#include "telemetry/records.h"

namespace stoke {

// What one finished request contributes. Times in seconds; a negative value means "not measured".
struct RequestRecord {
  FinishReason finish = FinishReason::kNone;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
  double ttft = -1;                 // first byte received -> first token produced
  double e2e = -1;                  // first byte received -> last byte written
  double queue_time = -1;           // submitted -> first scheduled (also the ledger's "queue" stage)
  std::vector<double> inter_token;  // gap before each token after the first
};

// finished_reason label values, as vLLM names them: stop | length | abort | error.
const char* FinishedReasonLabel(FinishReason r);

class ServerMetrics {
 public:
  // max_model_len bounds the token-count histograms' buckets.
  static StatusOr<std::unique_ptr<ServerMetrics>> Create(const std::string& model_name, int max_model_len,
                                                         MetricNaming naming = MetricNaming::kVllm);
  // The same families in a registry shared with other models (the server's one /metrics): each model's
  // series carry its model_name. `registry` must outlive the metrics.
  static StatusOr<std::unique_ptr<ServerMetrics>> Create(MetricsRegistry* registry,
                                                         const std::string& model_name, int max_model_len);

  void RecordStep(const StepRecord& step);
  void RecordRequest(const RequestRecord& r);
  void ObserveStage(LedgerStage stage, double seconds);
  // Every stage of the ledger's kind (a negative `other` is not observed); for a generation request also
  // compute = prefill + decode, the stage dashboards from before the split read.
  void ObserveLedger(const Ledger& ledger);
  // Called on each scrape for the engine's cumulative counters and gauges (must not call ExposeText).
  void SetSnapshotSource(std::function<EngineSnapshot()> source);
  // Applies a snapshot now (counters advance by the difference to the last one; gauges are set).
  void ApplySnapshot(const EngineSnapshot& s);

  std::string ExposeText() const { return registry_->ExposeText(); }
  MetricsRegistry& registry() { return *registry_; }

 private:
  explicit ServerMetrics(MetricsRegistry* registry) : registry_(registry) {}
  Status Init(const std::string& model_name, int max_model_len);

  std::unique_ptr<MetricsRegistry> owned_registry_;  // the first Create's
  MetricsRegistry* registry_;
  MetricLabels labels_;  // {model_name}
  std::mutex snapshot_mu_;
  std::function<EngineSnapshot()> snapshot_source_;  // guarded by snapshot_mu_
  EngineSnapshot last_snapshot_;                     // guarded by snapshot_mu_

  // Handles (label set fixed to model_name).
  Histogram ttft_, itl_, e2e_, queue_time_, prompt_tokens_hist_, generation_tokens_hist_;
  Histogram step_prefill_, step_decode_, step_duration_;
  std::array<Histogram, kNumLedgerStages> stage_;
  Gauge running_, waiting_, kv_usage_, kv_free_, kv_used_;
  Counter prefix_hits_, prefix_queries_, prefix_evictions_, preemptions_;
  Counter prompt_tokens_total_, generation_tokens_total_;
  // The per-step split: step_seconds_total{part=model|host}, step_read_bytes_total{kind=weights|kv},
  // step_flops_total{kind=matmul|attention}.
  Counter step_model_s_, step_host_s_, step_weight_bytes_, step_kv_bytes_, step_matmul_flops_,
      step_attention_flops_;
  Counter step_output_s_;  // step_output_seconds_total: the output thread's time (async output)
  CounterFamily success_;                        // {finished_reason}
  CounterFamily admission_stop_;                 // {reason}
  std::array<Counter, 4> admission_stop_known_;  // the four reasons, in kAdmissionReasons order
};

}  // namespace stoke
