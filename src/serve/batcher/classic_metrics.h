// Metrics of the classic serving path, in the telemetry registry (so GET /metrics shows them), named where a
// Triton user would look (nv_inference_* -> stoke:inference_*; counters end in _total), plus what Triton
// lacks: batch size histogram, why each batch closed, queue depth at dispatch, per-instance busy time, and
// the full per-request time ledger (design.md §4).
//
//   stoke:inference_request_success_total{model_name}         requests answered (a batch-8 request counts 1)
//   stoke:inference_request_failure_total{model_name,reason}  REJECTED (queue full, timed out) | BACKEND |
//   OTHER stoke:inference_count_total / stoke:inference_exec_count_total   rows inferred / model executions
//   stoke:inference_pending_request_count{model_name}          gauge: queued, not yet dispatched
//   stoke:inference_{request,queue,compute_input,compute_infer,compute_output}_duration_us_total
//   stoke:batch_size{model_name}                              histogram: rows per execution
//   stoke:batch_close_total{model_name,reason}                full | preferred | delay | immediate | ...
//   stoke:batch_queue_depth{model_name}                       histogram: requests queued when a batch left
//   stoke:instance_busy_seconds_total{model_name,instance}    time each instance spent executing
//   stoke:instance_executions_total{model_name,instance}
//   stoke:request_stage_seconds{model_name,stage}             ledger: recv queue preprocess h2d compute d2h
//                                                              postprocess send other (telemetry/ledger.h)
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "serve/batcher/classic_model.h"
#include "serve/batcher/launch_rule.h"
#include "telemetry/ledger.h"
#include "telemetry/metrics.h"
#include "telemetry/request_log.h"

namespace stoke {

// The ledger of a request the network layer answered (every front end builds it the same way): recv = first
// byte -> `parsed` (read, parsed, validated), preprocess = `parsed` -> queued (tokenising, decoding: Prepare)
// plus its batch's input assembly, queue = queued -> its batch starts executing, h2d/compute/d2h/postprocess
// from its batch, send = outputs ready -> `sent` (serialised, last byte written), other = the rest.
Ledger RequestLedger(Nanos recv, Nanos parsed, const RequestTimes& t, Nanos sent);

class ClassicMetrics;
// After a successful request's last byte: its ledger to the metrics and to the request log (each may be
// null). api: "kserve_http" | "kserve_grpc" | "embeddings".
void RecordClassicRequest(ClassicMetrics* metrics, RequestLog* log, const std::string& model, const char* api,
                          std::string id, const Ledger& ledger, int64_t tokens_in = 0);

class ClassicMetrics {
 public:
  // Registers the families in `registry` (shared by every model of the server) with model_name = `model`.
  static StatusOr<std::unique_ptr<ClassicMetrics>> Create(MetricsRegistry* registry, const std::string& model,
                                                          int num_instances);

  void OnBatch(int64_t rows, CloseReason reason, size_t queue_depth);
  void OnExecution(int instance, Nanos busy);
  void SetPending(size_t n) { pending_.Set(static_cast<double>(n)); }
  // A request answered with outputs: its durations (ns).
  void OnSuccess(Nanos request, Nanos queue, Nanos compute_input, Nanos compute_infer, Nanos compute_output);
  // reason: "REJECTED" | "BACKEND" | "OTHER"
  void OnFailure(const char* reason);
  // After the last byte was written.
  void ObserveLedger(const Ledger& ledger);

 private:
  ClassicMetrics() = default;
  Status Init(MetricsRegistry* registry, const std::string& model, int num_instances);

  Counter success_, inference_count_, exec_count_;
  Counter request_us_, queue_us_, compute_input_us_, compute_infer_us_, compute_output_us_;
  CounterFamily failure_;
  MetricLabels labels_;
  Gauge pending_;
  Histogram batch_size_, queue_depth_;
  std::array<Counter, kNumCloseReasons> close_;
  std::vector<Counter> busy_seconds_, executions_;
  std::array<Histogram, kNumLedgerStages> stage_;
};

}  // namespace stoke
