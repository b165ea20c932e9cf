#include "serve/batcher/classic_metrics.h"

#include "telemetry/ledger_trace.h"

namespace stoke {

StatusOr<std::unique_ptr<ClassicMetrics>> ClassicMetrics::Create(MetricsRegistry* registry,
                                                                 const std::string& model,
                                                                 int num_instances) {
  std::unique_ptr<ClassicMetrics> m(new ClassicMetrics());
  RETURN_IF_ERROR(m->Init(registry, model, num_instances));
  return m;
}

Status ClassicMetrics::Init(MetricsRegistry* r, const std::string& model, int num_instances) {
  labels_ = {{"model_name", model}};
  auto counter = [&](const char* name, const char* help, Counter* out) -> Status {
    ASSIGN_OR_RETURN(auto f, r->AddCounter(name, help));
    ASSIGN_OR_RETURN(*out, f.TryWithLabels(labels_));
    return OkStatus();
  };
  RETURN_IF_ERROR(counter("stoke:inference_request_success_total",
                          "Inference requests answered with outputs (a batch-8 request counts 1).",
                          &success_));
  RETURN_IF_ERROR(counter("stoke:inference_count_total", "Rows inferred (a batch-8 request counts 8).",
                          &inference_count_));
  RETURN_IF_ERROR(counter("stoke:inference_exec_count_total",
                          "Model executions (batches); inference_count / exec_count = average batch rows.",
                          &exec_count_));
  RETURN_IF_ERROR(counter(
      "stoke:inference_request_duration_us_total",
      "Cumulative end-to-end microseconds of successful requests (first byte to outputs).", &request_us_));
  RETURN_IF_ERROR(counter("stoke:inference_queue_duration_us_total",
                          "Cumulative microseconds successful requests waited in the batcher queue.",
                          &queue_us_));
  RETURN_IF_ERROR(counter("stoke:inference_compute_input_duration_us_total",
                          "Cumulative microseconds preparing inputs (batch assembly + host-to-device copy).",
                          &compute_input_us_));
  RETURN_IF_ERROR(counter("stoke:inference_compute_infer_duration_us_total",
                          "Cumulative microseconds executing the model.", &compute_infer_us_));
  RETURN_IF_ERROR(counter("stoke:inference_compute_output_duration_us_total",
                          "Cumulative microseconds extracting outputs (device-to-host copy + split/format).",
                          &compute_output_us_));
  ASSIGN_OR_RETURN(failure_, r->AddCounter("stoke:inference_request_failure_total",
                                           "Failed inference requests by reason: REJECTED (queue full or "
                                           "timed out in the queue), BACKEND (the model failed), OTHER."));
  for (const char* reason : {"REJECTED", "BACKEND", "OTHER"}) {
    MetricLabels l = labels_;
    l["reason"] = reason;
    RETURN_IF_ERROR(failure_.TryWithLabels(l).status());
  }
  ASSIGN_OR_RETURN(auto pending, r->AddGauge("stoke:inference_pending_request_count",
                                             "Requests queued in the batcher, not yet dispatched."));
  ASSIGN_OR_RETURN(pending_, pending.TryWithLabels(labels_));
  ASSIGN_OR_RETURN(auto bs,
                   r->AddHistogram("stoke:batch_size", "Rows per model execution.",
                                   {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024}));
  ASSIGN_OR_RETURN(batch_size_, bs.TryWithLabels(labels_));
  ASSIGN_OR_RETURN(auto qd, r->AddHistogram("stoke:batch_queue_depth",
                                            "Requests in the batcher queue when a batch was dispatched "
                                            "(including the batch's own).",
                                            {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}));
  ASSIGN_OR_RETURN(queue_depth_, qd.TryWithLabels(labels_));
  ASSIGN_OR_RETURN(auto close, r->AddCounter("stoke:batch_close_total",
                                             "Batches dispatched, by why the launch rule closed them."));
  for (int i = 0; i < kNumCloseReasons; ++i) {
    MetricLabels l = labels_;
    l["reason"] = CloseReasonName(static_cast<CloseReason>(i));
    ASSIGN_OR_RETURN(close_[i], close.TryWithLabels(l));
  }
  ASSIGN_OR_RETURN(auto busy, r->AddCounter("stoke:instance_busy_seconds_total",
                                            "Seconds each model instance spent executing batches."));
  ASSIGN_OR_RETURN(auto execs,
                   r->AddCounter("stoke:instance_executions_total", "Batches each model instance executed."));
  for (int i = 0; i < num_instances; ++i) {
    MetricLabels l = labels_;
    l["instance"] = std::to_string(i);
    ASSIGN_OR_RETURN(Counter b, busy.TryWithLabels(l));
    ASSIGN_OR_RETURN(Counter e, execs.TryWithLabels(l));
    busy_seconds_.push_back(b);
    executions_.push_back(e);
  }
  // Same name and buckets as the LLM path's ledger (telemetry/server_metrics.cc), with h2d/d2h added.
  ASSIGN_OR_RETURN(auto stages,
                   r->AddHistogram("stoke:request_stage_seconds",
                                   "Per-request time ledger: seconds spent in each stage (recv, queue, "
                                   "preprocess, h2d, compute, d2h, postprocess, send, other); they sum to "
                                   "the request's latency.",
                                   ExponentialBuckets(0.00001, 2.5, 20)));
  for (LedgerStage s : LedgerStages(LedgerKind::kClassic)) {
    MetricLabels l = labels_;
    l["stage"] = LedgerStageName(s);
    ASSIGN_OR_RETURN(stage_[static_cast<int>(s)], stages.TryWithLabels(l));
  }
  return OkStatus();
}

void ClassicMetrics::OnBatch(int64_t rows, CloseReason reason, size_t queue_depth) {
  batch_size_.Observe(static_cast<double>(rows));
  queue_depth_.Observe(static_cast<double>(queue_depth));
  close_[static_cast<int>(reason)].Inc();
  exec_count_.Inc();
  inference_count_.Inc(static_cast<double>(rows));
}

void ClassicMetrics::OnExecution(int instance, Nanos busy) {
  if (instance < 0 || instance >= static_cast<int>(busy_seconds_.size())) return;
  busy_seconds_[instance].Inc(static_cast<double>(busy) * 1e-9);
  executions_[instance].Inc();
}

void ClassicMetrics::OnSuccess(Nanos request, Nanos queue, Nanos compute_input, Nanos compute_infer,
                               Nanos compute_output) {
  success_.Inc();
  request_us_.Inc(static_cast<double>(request) * 1e-3);
  queue_us_.Inc(static_cast<double>(queue) * 1e-3);
  compute_input_us_.Inc(static_cast<double>(compute_input) * 1e-3);
  compute_infer_us_.Inc(static_cast<double>(compute_infer) * 1e-3);
  compute_output_us_.Inc(static_cast<double>(compute_output) * 1e-3);
}

void ClassicMetrics::OnFailure(const char* reason) {
  MetricLabels l = labels_;
  l["reason"] = reason;
  failure_.WithLabels(l).Inc();
}

Ledger RequestLedger(Nanos recv, Nanos parsed, const RequestTimes& t, Nanos sent) {
  using S = LedgerStage;
  Ledger l;
  l.kind = LedgerKind::kClassic;
  if (parsed < recv || parsed > t.enqueue) parsed = recv;
  const Nanos start = t.start ? t.start : t.dispatch;  // its batch began executing
  l[S::kRecv] = parsed - recv;
  l[S::kPreprocess] = (t.enqueue - parsed) + t.exec.preprocess;
  l[S::kQueue] = start - t.enqueue;
  l[S::kH2d] = t.exec.h2d;
  l[S::kCompute] = t.exec.compute;
  l[S::kD2h] = t.exec.d2h;
  l[S::kPostprocess] = t.exec.postprocess;
  l[S::kSend] = sent - t.done;
  l.Close(sent - recv);
  return l;
}

void RecordClassicRequest(ClassicMetrics* metrics, RequestLog* log, const std::string& model, const char* api,
                          std::string id, const Ledger& ledger, int64_t tokens_in) {
  // The timeline first: once /metrics counts a request, a trace on has it too.
  TraceLedger({.model = model, .api = api, .id = id, .end = MonotonicNanos()}, ledger);
  if (metrics != nullptr) metrics->ObserveLedger(ledger);
  if (log == nullptr || !log->enabled()) return;
  RequestLogEntry e;
  e.id = std::move(id);
  e.model = model;
  e.api = api;
  e.status = 200;
  e.start_unix_ms = UnixMillisAt(MonotonicNanos() - ledger.e2e);
  e.ledger = ledger;
  e.tokens_in = tokens_in;
  log->Add(std::move(e));
}

void ClassicMetrics::ObserveLedger(const Ledger& ledger) {
  for (LedgerStage s : LedgerStages(LedgerKind::kClassic)) {
    if (ledger[s] >= 0) stage_[static_cast<int>(s)].Observe(static_cast<double>(ledger[s]) * 1e-9);
  }
}

}  // namespace stoke
