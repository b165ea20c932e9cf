#include "tools/doctor/doctor_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/http_client.h"
#include "tools/bench/metrics_scraper.h"
#include "tools/doctor/extract.h"
#include "tools/doctor/rules.h"
#include "tools/doctor/trace_signals.h"

namespace stoke::doctor {
namespace {

using nlohmann::json;

StatusOr<json> GetJson(const bench::HttpEndpoint& ep, const std::string& path, int* http_status) {
  ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::HttpFetch(ep, "GET", ep.base_path + path, "", 10));
  *http_status = r.status;
  if (r.status != 200) return UnavailableError("GET {}: HTTP {}", path, r.status);
  json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return UnavailableError("GET {}: not JSON", path);
  return j;
}

void Say(const DoctorOptions& o, const std::string& line) {
  if (o.progress == nullptr) return;
  std::fprintf(o.progress, "stoke doctor: %s\n", line.c_str());
  std::fflush(o.progress);
}

// The first model of GET /v1/models (`models`: OpenAI, and stoke's classic server), else of POST
// /v2/repository/index (KServe / Triton).
StatusOr<std::string> FirstModel(const bench::HttpEndpoint& ep, const StatusOr<json>& models) {
  if (models.ok()) {
    const json data = (*models).value("data", json::array());
    if (data.is_array() && !data.empty() && data[0].is_object() && data[0].value("id", json()).is_string())
      return data[0]["id"].get<std::string>();
  }
  StatusOr<bench::SimpleResponse> index =
      bench::HttpFetch(ep, "POST", ep.base_path + "/v2/repository/index", "{}", 10);
  if (index.ok() && index->status == 200) {
    const json j = json::parse(index->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_array() && !j.empty() && j[0].is_object() && j[0].value("name", json()).is_string())
      return j[0]["name"].get<std::string>();
  }
  if (!models.ok()) return models.status().WithContext("discovering the model (pass --model)");
  return UnavailableError("GET /v1/models lists no model; pass --model");
}

// Model, API and (KServe) batching config, from the public endpoints.
Status Discover(const bench::HttpEndpoint& ep, const DoctorOptions& o, DoctorReport* rep,
                ModelConfigInfo* cfg) {
  int http = 0;
  const StatusOr<json> models = GetJson(ep, "/v1/models", &http);
  rep->model = o.model;
  if (rep->model.empty()) {
    ASSIGN_OR_RETURN(rep->model, FirstModel(ep, models));
  }
  StatusOr<json> config = GetJson(ep, "/v2/models/" + rep->model + "/config", &http);
  if (config.ok()) *cfg = ParseModelConfig(*config);
  if (models.ok())
    ParseServedPrecision(*models, rep->model, cfg);  // the precision the rules suggest changing
  rep->api = o.api.empty() ? (config.ok() ? "kserve-http" : "openai-completions") : o.api;
  return OkStatus();
}

// Scrapes /metrics and /v1/gpu on a thread until Stop(); the first and last scrapes bracket the window.
class Poller {
 public:
  Poller(bench::HttpEndpoint ep, double interval_s, bool gpu)
      : ep_(std::move(ep)), interval_s_(interval_s), gpu_(gpu) {}
  void Start() {
    start_ = MonotonicNanos();
    ScrapeOnce();
    thread_ = std::thread([this] { Loop(); });
  }
  std::vector<Scrape> Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ScrapeOnce();
    return std::move(scrapes_);
  }
  std::string note() const { return note_; }

 private:
  void Loop() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; })) {
      lock.unlock();
      ScrapeOnce();
      lock.lock();
    }
  }
  void ScrapeOnce() {
    Scrape s;
    s.t_s = (MonotonicNanos() - start_) * 1e-9;
    StatusOr<bench::SimpleResponse> m = bench::HttpFetch(ep_, "GET", ep_.base_path + "/metrics", "", 5);
    if (m.ok() && m->status == 200) {
      std::map<std::string, std::string> types;
      StatusOr<std::vector<bench::PromSample>> parsed = bench::ParsePrometheusText(m->body, &types);
      if (parsed.ok()) s.metrics = std::move(parsed).value();
    } else {
      note_ = m.ok() ? fmt::format("/metrics: HTTP {}", m->status) : "/metrics: " + m.status().message();
      return;  // a failed scrape is left out, not counted as zeros
    }
    if (gpu_) {
      int http = 0;
      StatusOr<json> g = GetJson(ep_, "/v1/gpu", &http);
      if (g.ok()) s.gpu = std::move(g).value();
    }
    scrapes_.push_back(std::move(s));  // only this thread, or the caller after join
  }

  bench::HttpEndpoint ep_;
  double interval_s_;
  bool gpu_;
  Nanos start_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::vector<Scrape> scrapes_;
  std::string note_;
};

// The window needs two scrapes of /metrics to difference; without them there is nothing to diagnose.
StatusOr<Signals> Extract(const std::vector<Scrape>& scrapes, const Poller& poller,
                          const ModelConfigInfo& cfg, const std::string& model) {
  if (scrapes.size() < 2) {
    return UnavailableError("could not read the server's metrics ({}); the doctor needs GET /metrics",
                            poller.note().empty() ? "fewer than two scrapes" : poller.note());
  }
  return ExtractSignals(scrapes, cfg, model);
}

// `error_example`: the first failure's kind and detail, when the point had failures.
StatusOr<LoadPoint> DrivePoint(const DoctorOptions& o, const DoctorReport& rep, double concurrency,
                               double seconds, std::string* error_example) {
  bench::BenchOptions b;
  b.url = o.url;
  b.model = rep.model;
  ASSIGN_OR_RETURN(b.api, bench::ParseApi(rep.api));
  b.mode = bench::LoadMode::kConcurrency;
  b.loads = {concurrency};
  b.workload = o.workload;
  b.point.warmup_s = std::min(1.0, 0.2 * seconds);
  b.point.window_s = seconds;
  b.point.max_duration_s = seconds;
  b.point.stability = 0;
  b.point.drain_timeout_s = 30;
  b.point.max_cpu_percent = 100;
  b.kserve_binary = o.kserve_binary;
  b.kserve_bytes = o.kserve_bytes;
  b.scrape = false;
  b.quiet = true;
  ASSIGN_OR_RETURN(bench::BenchReport r, bench::RunBench(b, nullptr));
  LoadPoint p{.concurrency = static_cast<int>(concurrency)};
  if (!r.points.empty()) {
    const bench::PointResult& pr = r.points.back();
    p.requests_per_s = pr.requests_per_s;
    p.p50_ms = pr.latency_ms.p50;
    p.p99_ms = pr.latency_ms.p99;
    for (const auto& [kind, n] : pr.errors) p.errors += n;
    if (!pr.error_examples.empty() && error_example->empty()) {
      const auto& [kind, detail] = *pr.error_examples.begin();
      *error_example = kind + ": " + detail.substr(0, 300);
    }
  }
  return p;
}

// POST /v1/debug/trace?seconds=N on a thread, after `delay_s`; Join() gives what it read.
class TraceTaker {
 public:
  TraceTaker(bench::HttpEndpoint ep, double delay_s, double seconds) {
    thread_ = std::thread([this, ep = std::move(ep), delay_s, seconds] {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      result_ = Take(ep, seconds);
    });
  }
  StatusOr<TraceSignals> Join() {
    thread_.join();
    return std::move(result_);
  }

 private:
  static StatusOr<TraceSignals> Take(const bench::HttpEndpoint& ep, double seconds) {
    const std::string target = fmt::format("{}/v1/debug/trace?seconds={:.3f}", ep.base_path, seconds);
    ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::HttpFetch(ep, "POST", target, "", seconds + 60));
    if (r.status == 409) return UnavailableError("a trace was already being recorded (409)");
    if (r.status != 200) return UnavailableError("POST /v1/debug/trace: HTTP {}", r.status);
    return ExtractTraceSignals(r.body);
  }
  std::thread thread_;
  StatusOr<TraceSignals> result_ = InternalError("not taken");
};

// Whether to trace: auto = the server has the endpoint and no trace is running.
bool WantTrace(const bench::HttpEndpoint& ep, const DoctorOptions& o, DoctorReport* rep) {
  if (o.trace == "off") return false;
  int http = 0;
  StatusOr<json> st = GetJson(ep, "/v1/debug/trace", &http);
  if (!st.ok()) {
    if (o.trace == "on") rep->notes.push_back("GPU timeline: GET /v1/debug/trace: " + st.status().message());
    return false;
  }
  if ((*st).value("recording", false)) {
    rep->notes.push_back("GPU timeline: a trace is already being recorded on the server; none taken");
    return false;
  }
  return true;
}

void AddTrace(StatusOr<TraceSignals> t, DoctorReport* rep) {
  if (!t.ok()) {
    rep->notes.push_back("GPU timeline: " + t.status().message());
    return;
  }
  rep->signals.trace = std::move(t).value();
  if (!rep->signals.trace.gpu_timeline) rep->notes.push_back(rep->signals.trace.note);
}

}  // namespace

StatusOr<DoctorReport> RunDoctor(const DoctorOptions& o) {
  ASSIGN_OR_RETURN(bench::HttpEndpoint ep, bench::ParseHttpUrl(o.url));
  DoctorReport rep;
  rep.url = o.url;
  rep.load = o.drive_load ? "auto" : "none";
  rep.started_at = bench::NowIso8601();
  rep.thresholds = o.thresholds;
  ModelConfigInfo cfg;
  RETURN_IF_ERROR(Discover(ep, o, &rep, &cfg));
  Say(o, fmt::format("model {} via {}{}", rep.model, rep.api,
                     cfg.known ? fmt::format(" (max_batch_size {}, {} instance(s))", cfg.max_batch_size,
                                             cfg.instances)
                               : ""));
  int http = 0;
  StatusOr<json> gpu = GetJson(ep, "/v1/gpu", &http);
  const bool have_gpu = gpu.ok() && (*gpu).value("available", false);
  if (!have_gpu) {
    rep.notes.push_back(gpu.ok() ? "GPU telemetry unavailable: " + (*gpu).value("reason", std::string("?"))
                                 : "GET /v1/gpu: " + gpu.status().message());
  }

  std::vector<LoadPoint> load;
  std::string error_example;  // the driven load's first failure
  const bool trace = WantTrace(ep, o, &rep);
  std::optional<TraceTaker> taker;
  StatusOr<TraceSignals> traced = UnavailableError("not taken");
  Poller poller(ep, o.scrape_interval_s, have_gpu);
  if (o.drive_load && !o.concurrency.empty()) {
    const size_t n = o.concurrency.size();
    const double lead_s = n > 1 ? 0.3 * o.duration_s / static_cast<double>(n - 1) : 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      Say(o, fmt::format("load c={} for {:.1f} s", o.concurrency[i], lead_s));
      ASSIGN_OR_RETURN(LoadPoint p, DrivePoint(o, rep, o.concurrency[i], lead_s, &error_example));
      load.push_back(p);
    }
    const double main_s = n > 1 ? 0.7 * o.duration_s : o.duration_s;
    Say(o, fmt::format("load c={} for {:.1f} s (the diagnosed window)", o.concurrency.back(), main_s));
    poller.Start();
    // The trace starts once the point's warm-up is over (DrivePoint: min(1, 0.2 x) s).
    if (trace) taker.emplace(ep, std::min(1.0, 0.2 * main_s), std::min(o.trace_seconds, 0.5 * main_s));
    StatusOr<LoadPoint> p = DrivePoint(o, rep, o.concurrency.back(), main_s, &error_example);
    if (taker) traced = taker->Join();
    std::vector<Scrape> scrapes = poller.Stop();
    if (!p.ok()) return p.status();
    load.push_back(*p);
    ASSIGN_OR_RETURN(rep.signals, Extract(scrapes, poller, cfg, rep.model));
  } else {
    Say(o, fmt::format("observing existing traffic for {:.1f} s", o.duration_s));
    poller.Start();
    if (trace) taker.emplace(ep, 0.0, std::min(o.trace_seconds, 0.5 * o.duration_s));
    std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
    if (taker) traced = taker->Join();
    const std::vector<Scrape> scrapes = poller.Stop();
    ASSIGN_OR_RETURN(rep.signals, Extract(scrapes, poller, cfg, rep.model));
  }
  if (!poller.note().empty()) rep.notes.push_back(poller.note());
  int64_t failed = 0;
  for (const LoadPoint& p : load) failed += p.errors;
  if (failed > 0) {
    // A verdict on a load that the server refused describes the refusals, not the model: say so first.
    rep.notes.insert(rep.notes.begin(),
                     fmt::format("{} requests of the driven load failed ({}){}", failed, error_example,
                                 rep.api.starts_with("kserve") && o.kserve_bytes == nullptr
                                     ? "; a model with BYTES inputs (an image model) needs --bytes-input files"
                                     : ""));
  }
  rep.signals.load = std::move(load);
  if (taker) AddTrace(std::move(traced), &rep);
  StatusOr<json> slowest = GetJson(ep, "/v1/debug/requests?slowest=5&model=" + rep.model, &http);
  if (slowest.ok()) {
    rep.slowest = std::move(slowest).value();
  } else {
    rep.notes.push_back("per-request ledgers: " + slowest.status().message());
  }
  ApplyDeviceRates(o.hbm_gbps, o.tensor_tflops, &rep.signals);
  rep.verdicts = Diagnose(rep.signals, o.thresholds);
  return rep;
}

}  // namespace stoke::doctor
