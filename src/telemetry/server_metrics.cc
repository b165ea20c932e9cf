#include "telemetry/server_metrics.h"

#include <algorithm>
#include <iterator>

namespace stoke {
namespace {

// Seconds, after vLLM's choices: TTFT and e2e span milliseconds to minutes; ITL is tighter.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                          20.0,  40.0,  80.0, 160., 640., 2560.};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                         0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0};
const std::vector<double> kLatencyBuckets = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,   0.8,  1.0,  1.5,
                                             2.0,  2.5,   5.0,  10.0, 15.0, 20.,   30.0, 40.0, 50.0,
                                             60.0, 120.0, 240., 480., 960., 1920., 7680.};

// 1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's build_1_2_5_buckets).
std::vector<double> TokenBuckets(int max_value) {
  std::vector<double> b;
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > std::max(max_value, 1)) return b;
      b.push_back(m * scale);
    }
  }
}

constexpr const char* kAdmissionReasons[] = {"token_budget", "max_seqs", "no_blocks", "queue_empty"};

}  // namespace

const char* FinishedReasonLabel(FinishReason r) {
  return r == FinishReason::kNone ? "error" : FinishReasonName(r);  // a request recorded unfinished: an error
}

StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(const std::string& model_name,
                                                               int max_model_len, MetricNaming naming) {
  auto registry = std::make_unique<MetricsRegistry>(naming);
  std::unique_ptr<ServerMetrics> m(new ServerMetrics(registry.get()));
  m->owned_registry_ = std::move(registry);
  RETURN_IF_ERROR(m->Init(model_name, max_model_len));
  return m;
}

StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(MetricsRegistry* registry,
                                                               const std::string& model_name,
                                                               int max_model_len) {
  if (registry == nullptr) return InvalidArgumentError("ServerMetrics: no registry");
  std::unique_ptr<ServerMetrics> m(new ServerMetrics(registry));
  RETURN_IF_ERROR(m->Init(model_name, max_model_len));
  return m;
}

Status ServerMetrics::Init(const std::string& model_name, int max_model_len) {
  labels_ = {{"model_name", model_name}};
  auto& r = *registry_;
  auto hist = [&](const char* name, const char* help, const std::vector<double>& buckets,
                  Histogram* out) -> Status {
    ASSIGN_OR_RETURN(auto f, r.AddHistogram(name, help, buckets));
    ASSIGN_OR_RETURN(*out, f.TryWithLabels(labels_));
    return OkStatus();
  };
  auto gauge = [&](const char* name, const char* help, Gauge* out) -> Status {
    ASSIGN_OR_RETURN(auto f, r.AddGauge(name, help));
    ASSIGN_OR_RETURN(*out, f.TryWithLabels(labels_));
    return OkStatus();
  };
  auto counter = [&](const char* name, const char* help, Counter* out) -> Status {
    ASSIGN_OR_RETURN(auto f, r.AddCounter(name, help));
    ASSIGN_OR_RETURN(*out, f.TryWithLabels(labels_));
    return OkStatus();
  };
  const std::vector<double> tokens = TokenBuckets(max_model_len);

  RETURN_IF_ERROR(hist("stoke:time_to_first_token_seconds",
                       "Time from the request's first byte to its first generated token.", kTtftBuckets,
                       &ttft_));
  RETURN_IF_ERROR(hist("stoke:inter_token_latency_seconds", "Time between consecutive generated tokens.",
                       kItlBuckets, &itl_));
  RETURN_IF_ERROR(hist("stoke:e2e_request_latency_seconds",
                       "Time from the request's first byte to its last byte written.", kLatencyBuckets,
                       &e2e_));
  RETURN_IF_ERROR(hist("stoke:request_queue_time_seconds",
                       "Time a request waited before it was first scheduled.", kLatencyBuckets,
                       &queue_time_));
  RETURN_IF_ERROR(hist("stoke:request_prompt_tokens", "Prompt length of finished requests, in tokens.",
                       tokens, &prompt_tokens_hist_));
  RETURN_IF_ERROR(hist("stoke:request_generation_tokens", "Generated length of finished requests, in tokens.",
                       tokens, &generation_tokens_hist_));
  RETURN_IF_ERROR(
      hist("stoke:step_prefill_tokens", "Prompt tokens computed per engine step.", tokens, &step_prefill_));
  RETURN_IF_ERROR(hist("stoke:step_decode_tokens",
                       "Tokens decoded per engine step (one per running sequence).", TokenBuckets(4096),
                       &step_decode_));
  RETURN_IF_ERROR(hist("stoke:step_duration_seconds", "Wall time of one engine step (plan, model, sampling).",
                       ExponentialBuckets(0.0005, 2, 16), &step_duration_));

  ASSIGN_OR_RETURN(
      auto stages,
      r.AddHistogram("stoke:request_stage_seconds",
                     "Per-request time ledger: seconds spent in each stage (recv, queue, preprocess, "
                     "prefill, decode, schedule, interleave, postprocess, send, other: they sum to the "
                     "request's latency; compute = prefill + decode), summed over the request's steps.",
                     ExponentialBuckets(0.00001, 2.5, 20)));
  auto add_stage = [&](LedgerStage s) -> Status {
    MetricLabels l = labels_;
    l["stage"] = LedgerStageName(s);
    ASSIGN_OR_RETURN(stage_[static_cast<int>(s)], stages.TryWithLabels(l));
    return OkStatus();
  };
  for (LedgerStage s : LedgerStages(LedgerKind::kGeneration)) RETURN_IF_ERROR(add_stage(s));
  RETURN_IF_ERROR(add_stage(LedgerStage::kCompute));

  RETURN_IF_ERROR(
      gauge("stoke:num_requests_running", "Requests in the running set (scheduled each step).", &running_));
  RETURN_IF_ERROR(gauge("stoke:num_requests_waiting", "Requests waiting to be scheduled.", &waiting_));
  RETURN_IF_ERROR(
      gauge("stoke:kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0..1).", &kv_usage_));
  RETURN_IF_ERROR(gauge("stoke:kv_cache_blocks_free",
                        "KV-cache blocks free (cached-but-unreferenced included).", &kv_free_));
  RETURN_IF_ERROR(
      gauge("stoke:kv_cache_blocks_used", "KV-cache blocks referenced by live sequences.", &kv_used_));

  RETURN_IF_ERROR(
      counter("stoke:prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", &prefix_hits_));
  RETURN_IF_ERROR(counter("stoke:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
                          &prefix_queries_));
  RETURN_IF_ERROR(counter("stoke:prefix_cache_evictions_total",
                          "Cached KV blocks evicted (least recently used) to make room.",
                          &prefix_evictions_));
  RETURN_IF_ERROR(counter("stoke:num_preemptions_total",
                          "Sequences preempted (recomputed later) for KV space.", &preemptions_));
  RETURN_IF_ERROR(
      counter("stoke:prompt_tokens_total", "Prompt tokens of finished requests.", &prompt_tokens_total_));
  RETURN_IF_ERROR(counter("stoke:generation_tokens_total", "Tokens generated for finished requests.",
                          &generation_tokens_total_));

  auto labelled = [&](const char* name, const char* help, const char* key, const char* v1, Counter* c1,
                      const char* v2, Counter* c2) -> Status {
    ASSIGN_OR_RETURN(auto f, r.AddCounter(name, help));
    MetricLabels l = labels_;
    l[key] = v1;
    ASSIGN_OR_RETURN(*c1, f.TryWithLabels(l));
    l[key] = v2;
    ASSIGN_OR_RETURN(*c2, f.TryWithLabels(l));
    return OkStatus();
  };
  RETURN_IF_ERROR(
      labelled("stoke:step_seconds_total",
               "Engine step time by part: model (inside the model's step: on a GPU its launches "
               "and the wait for the results) and host (planning, inputs, sampling, detokenising).",
               "part", "model", &step_model_s_, "host", &step_host_s_));
  RETURN_IF_ERROR(counter("stoke:step_output_seconds_total",
                          "Host time the engine's output thread spent on tokens' text (detokenising, stop "
                          "strings, events) while the model ran the next step (--async-output on; 0 off): "
                          "work kept out of step_seconds_total.",
                          &step_output_s_));
  RETURN_IF_ERROR(
      labelled("stoke:step_read_bytes_total",
               "Bytes the engine steps read, modelled from the model's shape and storage: weights "
               "(once per step) and KV (each sequence's context once per step).",
               "kind", "weights", &step_weight_bytes_, "kv", &step_kv_bytes_));
  RETURN_IF_ERROR(
      labelled("stoke:step_flops_total",
               "FLOPs of the engine steps, modelled: matmul (2 x parameters per token, the lm_head "
               "per logits row) and attention (4 x layers x heads x head_dim per query-key pair).",
               "kind", "matmul", &step_matmul_flops_, "attention", &step_attention_flops_));

  ASSIGN_OR_RETURN(success_,
                   r.AddCounter("stoke:request_success_total",
                                "Finished requests by finished_reason (stop, length, abort, error)."));
  for (FinishReason fr :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled, FinishReason::kError}) {
    MetricLabels l = labels_;
    l["finished_reason"] = FinishedReasonLabel(fr);
    RETURN_IF_ERROR(success_.TryWithLabels(l).status());
  }
  ASSIGN_OR_RETURN(
      admission_stop_,
      r.AddCounter("stoke:step_admission_stop_total",
                   "Engine steps by why admitting waiting requests stopped (token_budget, max_seqs, "
                   "no_blocks, queue_empty)."));
  for (size_t i = 0; i < std::size(kAdmissionReasons); ++i) {
    MetricLabels l = labels_;
    l["reason"] = kAdmissionReasons[i];
    ASSIGN_OR_RETURN(admission_stop_known_[i], admission_stop_.TryWithLabels(l));
  }

  r.AddCollectHook([this] {
    std::function<EngineSnapshot()> source;
    {
      std::lock_guard lock(snapshot_mu_);
      source = snapshot_source_;
    }
    if (source) ApplySnapshot(source());
  });
  return OkStatus();
}

void ServerMetrics::RecordStep(const StepRecord& step) {
  if (step.prefill_tokens > 0) step_prefill_.Observe(step.prefill_tokens);
  if (step.decode_tokens > 0) step_decode_.Observe(step.decode_tokens);
  if (step.duration > 0) step_duration_.Observe(step.duration * 1e-9);
  step_model_s_.Inc(step.model_ns * 1e-9);
  step_host_s_.Inc(std::max<Nanos>(0, step.duration - step.model_ns) * 1e-9);
  step_output_s_.Inc(step.output_ns * 1e-9);
  step_weight_bytes_.Inc(step.weight_bytes);
  step_kv_bytes_.Inc(step.kv_bytes);
  step_matmul_flops_.Inc(step.matmul_flops);
  step_attention_flops_.Inc(step.attention_flops);
  running_.Set(step.num_running);
  waiting_.Set(step.num_waiting);
  kv_used_.Set(step.kv_blocks_used);
  kv_free_.Set(step.kv_blocks_free);
  const int total = step.kv_blocks_used + step.kv_blocks_free;
  kv_usage_.Set(total > 0 ? static_cast<double>(step.kv_blocks_used) / total : 0.0);
  if (!step.admission_stop.empty()) {
    for (size_t i = 0; i < std::size(kAdmissionReasons); ++i) {
      if (step.admission_stop == kAdmissionReasons[i]) {
        admission_stop_known_[i].Inc();
        return;
      }
    }
    MetricLabels l = labels_;  // a reason added later: slower path, still counted
    l["reason"] = step.admission_stop;
    admission_stop_.WithLabels(l).Inc();
  }
}

void ServerMetrics::RecordRequest(const RequestRecord& r) {
  MetricLabels l = labels_;
  l["finished_reason"] = FinishedReasonLabel(r.finish);
  success_.WithLabels(l).Inc();
  prompt_tokens_total_.Inc(r.prompt_tokens);
  generation_tokens_total_.Inc(r.completion_tokens);
  prompt_tokens_hist_.Observe(r.prompt_tokens);
  generation_tokens_hist_.Observe(r.completion_tokens);
  if (r.ttft >= 0) ttft_.Observe(r.ttft);
  if (r.e2e >= 0) e2e_.Observe(r.e2e);
  if (r.queue_time >= 0) queue_time_.Observe(r.queue_time);
  for (double gap : r.inter_token) {
    if (gap >= 0) itl_.Observe(gap);
  }
}

void ServerMetrics::ObserveStage(LedgerStage stage, double seconds) {
  if (seconds >= 0) stage_[static_cast<int>(stage)].Observe(seconds);
}

void ServerMetrics::ObserveLedger(const Ledger& l) {
  for (LedgerStage s : LedgerStages(l.kind)) ObserveStage(s, static_cast<double>(l[s]) * 1e-9);
  if (l.kind == LedgerKind::kGeneration) {
    ObserveStage(LedgerStage::kCompute,
                 static_cast<double>(l[LedgerStage::kPrefill] + l[LedgerStage::kDecode]) * 1e-9);
  }
}

void ServerMetrics::SetSnapshotSource(std::function<EngineSnapshot()> source) {
  std::lock_guard lock(snapshot_mu_);
  snapshot_source_ = std::move(source);
}

void ServerMetrics::ApplySnapshot(const EngineSnapshot& s) {
  std::lock_guard lock(snapshot_mu_);
  running_.Set(s.num_running);
  waiting_.Set(s.num_waiting);
  kv_used_.Set(s.kv_blocks_used);
  kv_free_.Set(s.kv_blocks_free);
  const int total = s.kv_blocks_total > 0 ? s.kv_blocks_total : s.kv_blocks_used + s.kv_blocks_free;
  kv_usage_.Set(total > 0 ? static_cast<double>(s.kv_blocks_used) / total : 0.0);
  // Counters advance by the difference; an engine restart (smaller values) just re-bases.
  auto advance = [](Counter& c, int64_t now, int64_t before) {
    if (now > before) c.Inc(static_cast<double>(now - before));
  };
  advance(prefix_hits_, s.prefix_cache_hits, last_snapshot_.prefix_cache_hits);
  advance(prefix_queries_, s.prefix_cache_queries, last_snapshot_.prefix_cache_queries);
  advance(prefix_evictions_, s.prefix_cache_evictions, last_snapshot_.prefix_cache_evictions);
  advance(preemptions_, s.num_preemptions, last_snapshot_.num_preemptions);
  last_snapshot_ = s;
}

}  // namespace stoke
