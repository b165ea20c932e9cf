#include "tools/tune/tuner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>

#include "base/file_util.h"
#include "tools/bench/bench_runner.h"
#include "tools/bench/http_client.h"
#include "tools/tune/doctor_probe.h"
#include "tools/tune/server_process.h"

namespace stoke::tune {

namespace {

// Why a point failed, short: a server the output-consistency gate refused at load (a lower precision: the
// KV-cache, weight and precision steps) says so with its failing metrics, wherever they sit in its log;
// anything else is the error's first 200 characters.
std::string FailureWhy(const std::string& error) {
  if (error.find("the consistency gate rejects this precision") == std::string::npos)
    return "failed: " + error.substr(0, 200);
  std::vector<std::string> failing;
  size_t pos = 0;
  while ((pos = error.find("FAIL  ", pos)) != std::string::npos) {
    const size_t end = error.find('\n', pos);
    std::string line = error.substr(pos + 6, end == std::string::npos ? std::string::npos : end - pos - 6);
    while (line.find("  ") != std::string::npos) line.replace(line.find("  "), 2, " ");
    failing.push_back(line);
    pos = end == std::string::npos ? error.size() : end;
  }
  return fmt::format(
      "failed: refused by the consistency gate at load ({})",
      failing.empty() ? std::string("see its log") : fmt::format("{}", fmt::join(failing, "; ")));
}

using Clock = std::chrono::steady_clock;

std::vector<std::string> ServeArgs(const TuneOptions& o, ModelKind kind, const Knobs& k) {
  std::vector<std::string> a = {"--model",     o.model, "--port",          "0",
                                "--grpc-port", "-1",    "--drain-seconds", "1"};
  if (!o.device.empty()) a.insert(a.end(), {"--device", o.device});
  const std::vector<std::string> f = k.Flags(kind);
  a.insert(a.end(), f.begin(), f.end());
  a.insert(a.end(), o.serve_args.begin(), o.serve_args.end());
  return a;
}

StatusOr<std::string> FirstModel(const bench::HttpEndpoint& ep) {
  ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::HttpFetch(ep, "GET", ep.base_path + "/v1/models", "", 10));
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return UnavailableError("GET /v1/models: HTTP {}, no model listed", r.status);
  return j["data"][0].value("id", "");
}

// The model's own batching config as the server reports it (Triton-shaped /v2/models/M/config).
Knobs ConfigKnobs(const nlohmann::json& j) {
  Knobs k;
  k.max_batch_size = j.value("max_batch_size", 0);
  if (j.contains("dynamic_batching") && j["dynamic_batching"].is_object())
    k.max_queue_delay_us = j["dynamic_batching"].value("max_queue_delay_microseconds", int64_t{0});
  if (j.contains("instance_group") && j["instance_group"].is_array() && !j["instance_group"].empty())
    k.instances = j["instance_group"][0].value("count", 1);
  return k;
}

// The workload's longest prompt in tokens.
int WorkloadMaxInput(const bench::WorkloadSpec& w) {
  switch (w.input.kind) {
    case bench::LengthDist::Kind::kFixed:
      return static_cast<int>(w.input.a);
    case bench::LengthDist::Kind::kUniform:
      return static_cast<int>(w.input.b);
    case bench::LengthDist::Kind::kNormal:
      return static_cast<int>(w.input.a + 4 * w.input.b);
  }
  return 0;
}

// The longest prompt in tokens as the server counts them: the workload's longest, plus what the server added
// to the mean (a chat template: the baseline's usage.prompt_tokens against the workload's mean); 0 when not
// known.
int MaxInputTokens(const bench::WorkloadSpec& w, double served_mean) {
  if (!w.file.empty()) return 0;
  const double extra = served_mean > w.input.Mean() ? served_mean - w.input.Mean() : 0;
  return static_cast<int>(WorkloadMaxInput(w) + extra);
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
// The standard error of the mean, relative to the mean.
double RelSem(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return m > 0 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) / m / std::sqrt(double(v.size())) : 0.0;
}

class Tuner {
 public:
  explicit Tuner(const TuneOptions& o) : o_(o), start_(Clock::now()) {}

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double PointCost() const { return o_.warmup_s + o_.window_s * o_.windows + 2; }
  bool BudgetLeft() const { return Elapsed() + PointCost() <= o_.budget_s; }

  // Starts a server with `k` (or uses --url's), measures one point with the doctor watching, stops it.
  Measurement Measure(const std::string& step, const Knobs& k) {
    Measurement m;
    m.index = static_cast<int>(r_.measurements.size());
    m.step = step;
    m.knobs = k;
    ServerProcess server;
    Status s = OkStatus();
    std::string url = o_.url;
    std::string log;
    if (url.empty()) {
      log = fmt::format("{}/logs/serve-{:03d}.log", o_.out_dir, m.index);
      s = server.Start(o_.stoke_exe, ServeArgs(o_, r_.kind, k), log, 300);
      url = server.url();
    }
    if (s.ok()) s = Discover(url);
    if (s.code() == StatusCode::kInvalidArgument) fatal_ = s;
    if (s.ok()) {
      std::unique_ptr<DoctorProbe> probe;
      if (o_.doctor && !o_.grid)  // the measured window, less a margin at its end
        probe =
            std::make_unique<DoctorProbe>(url, r_.served_name, o_.warmup_s, 0.9 * o_.window_s * o_.windows);
      s = Bench(url, &m);
      if (probe) m.doctor = probe->Join();
    }
    server.Stop();
    if (!s.ok()) {
      m.error = s.message();
      // A server whose model failed to load at start (e.g. refused by the consistency gate) answers
      // /health/ready for the moment before it exits, so the first error may be a refused connection: its
      // log says what happened.
      if (!log.empty() && m.error.find("cannot load") == std::string::npos) {
        StatusOr<std::string> text = ReadFileToString(log);
        const size_t at = text.ok() ? text->find("stoke serve: cannot load") : std::string::npos;
        if (at != std::string::npos) m.error = text->substr(at) + "\n(then: " + m.error + ")";
      }
      m.why = FailureWhy(m.error);
    }
    Judge(o_.slos, &m);
    m.elapsed_s = Elapsed();
    r_.measuring_s += m.warmup_s + m.measured_s;
    Print(m);
    r_.measurements.push_back(m);
    return m;
  }

  // Once: the served name, the kind of model, its own knobs.
  Status Discover(const std::string& url) {
    if (!r_.served_name.empty()) return OkStatus();
    ASSIGN_OR_RETURN(bench::HttpEndpoint ep, bench::ParseHttpUrl(url));
    ASSIGN_OR_RETURN(std::string name, FirstModel(ep));
    StatusOr<bench::SimpleResponse> cfg =
        bench::HttpFetch(ep, "GET", ep.base_path + "/v2/models/" + name + "/config", "", 10);
    nlohmann::json j = cfg.ok() ? nlohmann::json::parse(cfg->body, nullptr, false) : nlohmann::json();
    if (cfg.ok() && cfg->status == 200 && j.is_object()) {
      r_.kind = ModelKind::kBatched;
      r_.baseline_knobs = ConfigKnobs(j);
      encoder_ = j.value("platform", "") == "stoke_bert";
      if (encoder_ && o_.url.empty()) has_quantization_ = ReadServeDefaults(o_.stoke_exe).has_quantization;
    } else {
      r_.kind = ModelKind::kDecoder;  // no batcher config: the OpenAI path, continuous batching
      if (!o_.calibration_data.empty()) {
        fmt::print(stderr,
                   "stoke tune: --calibration-data {} is not used: '{}' is a decoder, whose precision steps try "
                   "fp8 weights and the 8-bit KV caches (int8 weights, which need calibration samples, are for "
                   "encoders)\n",
                   o_.calibration_data, name);
      }
      if (o_.url.empty()) {           // the defaults of the stoke serve tune starts (not --url's server)
        const ServeDefaults d = ReadServeDefaults(o_.stoke_exe);
        r_.baseline_knobs.max_num_seqs = d.max_num_seqs;
        r_.baseline_knobs.max_num_batched_tokens = d.max_num_batched_tokens;
        has_kv_cache_dtype_ = d.has_kv_cache_dtype;
        has_quantization_ = d.has_quantization;
      }
    }
    if (r_.kind == ModelKind::kBatched && (o_.slos.ttft_ms > 0 || o_.slos.tpot_ms > 0))
      return InvalidArgumentError(
          "--slo-ttft-ms / --slo-tpot-ms apply to decoders (streamed tokens); '{}' is a batched model: use "
          "--slo-p99-ms",
          name);
    if (r_.kind == ModelKind::kBatched && o_.slos.p99_ms <= 0)
      return InvalidArgumentError("'{}' is a batched model: give --slo-p99-ms", name);
    r_.served_name = name;
    return OkStatus();
  }

  Status Bench(const std::string& url, Measurement* m) {
    const bool decoder = r_.kind == ModelKind::kDecoder;
    bench::BenchOptions b;
    b.url = url;
    b.model = r_.served_name;
    b.api = decoder ? bench::Api::kOpenAiChat : bench::Api::kKserveHttp;
    b.stream = true;  // chat: TTFT and TPOT need the tokens as they come
    b.mode = o_.mode;
    b.loads = {o_.load};
    b.workload = o_.workload;
    b.point.mode = o_.mode;
    b.point.warmup_s = o_.warmup_s;
    b.point.window_s = o_.window_s;
    b.point.max_duration_s = o_.window_s * o_.windows;
    b.point.stability = 0;  // a fixed measuring time: what the options say, never the machine's speed
    b.point.drain_timeout_s = 30;
    b.point.slo = o_.slos.ForBench();
    // Requests built before the point, so the generator encodes nothing while it measures (-1: off). A
    // decoder's pool is larger: a repeated prompt would come from the server's prefix cache.
    b.point.prebuilt_requests = o_.prebuilt_requests > 0   ? o_.prebuilt_requests
                                : o_.prebuilt_requests < 0 ? 0
                                : decoder                  ? 2048
                                                           : 512;
    b.scrape = false;
    b.quiet = true;
    bench::ProgressPrinter quiet(stderr, /*quiet=*/true);
    ASSIGN_OR_RETURN(bench::BenchReport rep, bench::RunBench(b, &quiet));
    if (rep.points.empty()) return InternalError("bench returned no point");
    const bench::PointResult& p = rep.points[0];
    m->ok = true;
    m->requests_per_s = p.requests_per_s;
    m->goodput_rps = p.goodput_rps;
    m->p50_ms = p.latency_ms.p50;
    m->p99_ms = p.latency_ms.p99;
    m->ttft_p99_ms = p.ttft_ms.p99;
    m->tpot_p99_ms = p.tpot_ms.p99;
    m->output_tokens_per_s = p.output_tokens_per_s;
    m->mean_input_tokens = p.mean_input_tokens;
    m->succeeded = p.succeeded;
    for (const auto& [kind, n] : p.errors) m->errors += n;
    if (m->errors > 0 && !p.error_examples.empty())
      m->error = p.error_examples.begin()->first + ": " + p.error_examples.begin()->second;
    m->valid = p.valid;
    if (!p.invalid_reasons.empty()) m->invalid_reason = p.invalid_reasons[0];
    m->warmup_s = p.warmup_s;
    m->measured_s = p.measured_s;
    m->generator_cpu_percent = p.generator.cpu_percent;
    return OkStatus();
  }

  void Print(const Measurement& m) const {
    if (o_.progress == nullptr) return;
    fmt::print(o_.progress, "tune #{:<3} {:<22} {:<44} ", m.index, m.step, m.knobs.Describe(r_.kind));
    if (m.ok) {
      fmt::print(o_.progress, "{:8.1f} req/s  p50 {:7.1f} ms  p99 {:7.1f} ms  ", m.requests_per_s, m.p50_ms,
                 m.p99_ms);
      if (r_.kind == ModelKind::kDecoder)
        fmt::print(o_.progress, "TTFT p99 {:7.1f} ms  TPOT p99 {:6.2f} ms  ", m.ttft_p99_ms, m.tpot_p99_ms);
      fmt::print(o_.progress, "goodput {:8.1f}/s  {}", m.goodput_rps,
                 m.accepted ? "accepted" : "rejected: " + m.why);
      if (m.doctor.is_array() && !m.doctor.empty())
        fmt::print(o_.progress, "  doctor: {}", m.doctor[0].value("bottleneck", "?"));
    } else {
      fmt::print(o_.progress, "{}", m.why);
    }
    fmt::print(o_.progress, "  [{:.0f} s / budget {:.0f} s]\n", m.elapsed_s, o_.budget_s);
    std::fflush(o_.progress);
  }

  // The model's own values made explicit where known (for the next step's candidates and comparisons).
  Knobs Explicit(Knobs k) const {
    const Knobs& own = r_.baseline_knobs;
    if (r_.kind == ModelKind::kDecoder) {
      if (k.max_num_seqs <= 0) k.max_num_seqs = own.max_num_seqs;
      if (k.max_num_batched_tokens <= 0) k.max_num_batched_tokens = own.max_num_batched_tokens;
      return k;  // chunked prefill and CUDA graphs stay "own" until a step moves them
    }
    if (k.max_batch_size <= 0) k.max_batch_size = std::max(1, own.max_batch_size);
    if (k.max_queue_delay_us < 0) k.max_queue_delay_us = std::max<int64_t>(0, own.max_queue_delay_us);
    if (k.instances <= 0) k.instances = std::max(1, own.instances);
    return k;
  }

  WalkContext Context() const {
    WalkContext c;
    c.kind = r_.kind;
    c.mode = o_.mode;
    c.load = o_.load;
    c.device = o_.device;
    c.batch_sizes = o_.batch_sizes;
    c.queue_delays_us = o_.queue_delays_us;
    c.instance_counts = o_.instance_counts;
    c.max_num_seqs = o_.max_num_seqs;
    c.max_num_batched_tokens = o_.max_num_batched_tokens;
    c.max_input_tokens =
        MaxInputTokens(o_.workload, r_.measurements.empty() ? 0 : r_.measurements[0].mean_input_tokens);
    c.own = Explicit(Knobs{});
    c.tpot_slo_ms = o_.slos.tpot_ms;
    c.has_kv_cache_dtype = has_kv_cache_dtype_;
    c.has_quantization = has_quantization_;
    c.encoder = encoder_;
    c.calibration_data = o_.calibration_data;
    return c;
  }

  const nlohmann::json& VerdictsOf(int point) const {
    static const nlohmann::json kNull;
    return point >= 0 ? r_.measurements[static_cast<size_t>(point)].doctor : kNull;
  }

  // One step of the walk: the plan's candidates measured through WalkValues; updates best_ / best_score_.
  void Step(const std::string& knob, const StepPlan& plan) {
    StepReport st;
    st.knob = knob;
    st.from_point = r_.chosen_index;
    st.doctor = VerdictsOf(st.from_point);
    st.doctor_note = plan.doctor_note;
    if (!plan.skip.empty()) {
      st.skipped = true;
      st.stopped = plan.skip;
      st.best = best_;
      st.best_point = r_.chosen_index;
      if (o_.progress) fmt::print(o_.progress, "tune {}: skipped: {}\n", knob, plan.skip);
      r_.steps.push_back(st);
      return;
    }
    std::vector<int> idx;
    const int b = WalkValues(
        plan.candidates.size(), best_score_, o_.min_gain,
        [&](size_t i) -> std::optional<double> {
          if (!BudgetLeft()) {
            r_.budget_exhausted = true;
            return std::nullopt;
          }
          Measurement m = Measure(knob, plan.candidates[i]);
          st.points.push_back(m.index);
          idx.push_back(m.index);
          return m.score();
        },
        [&](size_t i) { return plan.names[i]; }, &st.stopped, plan.ordered);
    if (b >= 0) {
      best_ = plan.candidates[static_cast<size_t>(b)];
      best_score_ = r_.measurements[static_cast<size_t>(idx[static_cast<size_t>(b)])].score();
      r_.chosen_index = idx[static_cast<size_t>(b)];
    }
    // A point whose server never served (refused by the load gate, crashed) is not a measured value: say so.
    std::vector<std::string> failed;
    for (size_t i = 0; i < idx.size(); ++i) {
      const Measurement& m = r_.measurements[static_cast<size_t>(idx[i])];
      if (!m.ok) failed.push_back(plan.names[i]);
    }
    if (!failed.empty())
      st.stopped += fmt::format("; failed (no figure): {}", fmt::join(failed, ", "));
    if (!plan.not_measured.empty())
      st.stopped += fmt::format("; not measured: {}", fmt::join(plan.not_measured, ", "));
    st.best = best_;
    st.best_point = r_.chosen_index;
    r_.steps.push_back(st);
  }

  void Walk() {
    r_.mode = "walk";
    Measurement base = Measure("baseline", Knobs{});
    r_.doctor = base.doctor;
    r_.chosen_index = base.index;
    best_score_ = base.score();
    best_ = Knobs{};
    if (!base.ok) return;
    const WalkContext ctx = Context();
    for (const std::string& step : StepOrder(r_.kind)) {
      Step(step, PlanStep(step, ctx, Explicit(best_), VerdictsOf(r_.chosen_index)));
    }
    r_.chosen = best_;
    Confirm();
  }

  void Confirm() {
    Confirmation& c = r_.confirmation;
    if (best_ == Knobs{}) {
      c.verdict = fmt::format("no change: nothing beat the baseline by {:.0f} %", 100 * o_.min_gain);
      return;
    }
    for (int round = 0; round < o_.confirm_rounds; ++round) {
      if (!BudgetLeft() && round > 0) {
        r_.budget_exhausted = true;
        break;
      }
      c.baseline.push_back(Measure("confirm:baseline", Knobs{}).score());
      c.best.push_back(Measure("confirm:best", best_).score());
    }
    c.ran = true;
    const double mb = Mean(c.baseline), mw = Mean(c.best);
    c.spread = std::hypot(RelSem(c.baseline), RelSem(c.best));
    if (mb <= 0) {
      c.gain = mw > 0 ? INFINITY : 0;
      c.verdict = mw > 0 ? fmt::format(
                               "the baseline meets the SLO in no round; the best gives {:.1f} req/s of "
                               "goodput",
                               mw)
                         : "no gain: neither meets the SLO in the confirmation rounds";
      return;
    }
    c.gain = mw / mb - 1;
    const bool noise = c.gain < 2 * c.spread;
    c.verdict =
        noise ? fmt::format("no gain: {:+.1f} % is within the run-to-run spread (± {:.1f} %, 2x = {:.1f} %)",
                            100 * c.gain, 100 * c.spread, 200 * c.spread)
              : fmt::format("gain {:+.1f} % ± {:.1f} % ({:.1f} -> {:.1f} req/s of goodput, {} rounds)",
                            100 * c.gain, 100 * c.spread, mb, mw, c.baseline.size());
  }

  // Every combination of the kind's ordered knobs (batched: batch x delay x instances; decoders: seqs x
  // tokens).
  void Grid() {
    r_.mode = "grid";
    Measurement base = Measure("baseline", Knobs{});
    if (!base.ok) return;
    std::vector<Knobs> all;
    if (r_.kind == ModelKind::kDecoder) {
      for (int s : o_.max_num_seqs)
        for (int t : o_.max_num_batched_tokens)
          all.push_back(Knobs{.max_num_seqs = s, .max_num_batched_tokens = t});
    } else {
      for (int bs : o_.batch_sizes)
        for (int64_t d : o_.queue_delays_us)
          for (int n : o_.instance_counts)
            all.push_back(Knobs{.max_batch_size = bs, .max_queue_delay_us = d, .instances = n});
    }
    double best = base.score();
    r_.chosen_index = base.index;
    for (const Knobs& k : all) {
      if (!BudgetLeft()) {
        r_.budget_exhausted = true;
        break;
      }
      Measurement m = Measure("grid", k);
      if (m.score() > best) {
        best = m.score();
        r_.chosen = m.knobs;
        r_.chosen_index = m.index;
      }
    }
  }

  // --url: the baseline there, the doctor's verdict, and the next flag to try.
  void UrlMode() {
    r_.mode = "url";
    r_.url = o_.url;
    Measurement base = Measure("baseline", Knobs{});
    r_.doctor = base.doctor;
    r_.chosen_index = base.index;
    if (!base.ok) return;
    r_.advice = AdviseNext(Context(), Explicit(Knobs{}), base.doctor);
    r_.confirmation.verdict = "not run: --url measures one server as it is";
  }

  TuneResult Run() {
    r_.model = o_.model;
    r_.device = o_.device.empty() ? "model's own" : o_.device;
    r_.started_at = bench::NowIso8601();
    if (!o_.url.empty()) {
      UrlMode();
    } else if (o_.grid) {
      Grid();
    } else {
      Walk();
    }
    return std::move(r_);
  }

 private:
  const TuneOptions& o_;
  Clock::time_point start_;
  TuneResult r_;
  Knobs best_;
  double best_score_ = 0;
  bool has_kv_cache_dtype_ = false;
  bool has_quantization_ = false;
  bool encoder_ = false;  // batched and a BERT encoder (its config's platform): the precision step

 public:
  Status fatal_ = OkStatus();  // a usage error found once the model is known (an SLO its kind has not)
};

}  // namespace

Status ValidateTuneOptions(const TuneOptions& o) {
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--slo-p99-ms", o.slos.p99_ms},
                                {"--slo-ttft-ms", o.slos.ttft_ms},
                                {"--slo-tpot-ms", o.slos.tpot_ms}}) {
    if (!std::isfinite(v) || v < 0) return InvalidArgumentError("{} {}: must be a number > 0 (ms)", flag, v);
  }
  if (!o.slos.any())
    return InvalidArgumentError(
        "give an SLO: --slo-p99-ms (end-to-end, every model), --slo-ttft-ms / --slo-tpot-ms (decoders)");
  if (o.queue_delays_us.empty() || o.batch_sizes.empty() || o.instance_counts.empty() ||
      o.max_num_seqs.empty() || o.max_num_batched_tokens.empty())
    return InvalidArgumentError("the knob value lists must not be empty");
  if (!o.url.empty() && o.grid)
    return InvalidArgumentError("--grid needs servers tune starts itself, not --url");
  // The flags tune gives every `stoke serve` itself (ServeArgs, Knobs::Flags): twice would be a usage error
  // there, and stoke.toml could not hold both. --config: its keys can go in --serve-args.
  for (const std::string& a : o.serve_args) {
    const std::string name = a.substr(0, a.find('='));
    for (const char* own :
         {"--model", "--port", "--grpc-port", "--drain-seconds", "--device", "--config", "--max-batch-size",
          "--max-queue-delay-us", "--instances", "--max-num-seqs", "--max-num-batched-tokens",
          "--no-chunked-prefill", "--cuda-graphs", "--target-step-ms"}) {
      if (name == own)
        return InvalidArgumentError("--serve-args '{}': tune sets {} itself{}", a, own,
                                    std::string(own) == "--device" ? " (give tune --device)" : "");
    }
  }
  return OkStatus();
}

StatusOr<TuneResult> RunTune(const TuneOptions& opts) {
  RETURN_IF_ERROR(ValidateTuneOptions(opts));
  std::error_code ec;
  std::filesystem::create_directories(opts.out_dir + "/logs", ec);
  if (ec) return InvalidArgumentError("--out {}: {}", opts.out_dir, ec.message());
  Tuner t(opts);
  TuneResult r = t.Run();
  if (r.measurements.empty() || !r.measurements[0].ok) {
    if (!t.fatal_.ok()) return t.fatal_;
    return UnavailableError("the baseline could not be measured: {}",
                            r.measurements.empty() ? "no measurement" : r.measurements[0].error);
  }
  return r;
}

}  // namespace stoke::tune
