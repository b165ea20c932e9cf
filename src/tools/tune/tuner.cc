#include "tools/tune/tuner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "tools/bench/bench_runner.h"
#include "tools/bench/http_client.h"
#include "tools/doctor/doctor_runner.h"
#include "tools/tune/server_process.h"

namespace stoke::tune {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> ServeArgs(const TuneOptions& o, const Knobs& k) {
  std::vector<std::string> a = {"--model",     o.model, "--port",          "0",
                                "--grpc-port", "-1",    "--drain-seconds", "1"};
  if (!o.device.empty()) a.insert(a.end(), {"--device", o.device});
  if (k.max_batch_size > 0) a.insert(a.end(), {"--max-batch-size", std::to_string(k.max_batch_size)});
  if (k.max_queue_delay_us >= 0)
    a.insert(a.end(), {"--max-queue-delay-us", std::to_string(k.max_queue_delay_us)});
  if (k.instances > 0) a.insert(a.end(), {"--instances", std::to_string(k.instances)});
  a.insert(a.end(), o.serve_args.begin(), o.serve_args.end());
  return a;
}

StatusOr<std::string> FirstModel(const bench::HttpEndpoint& ep) {
  ASSIGN_OR_RETURN(bench::SimpleResponse r, bench::HttpFetch(ep, "GET", "/v1/models", "", 10));
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return UnavailableError("GET /v1/models: HTTP {}, no model listed", r.status);
  return j["data"][0].value("id", "");
}

// The model's own batching config as the server reports it (Triton-shaped /v2/models/M/config).
Knobs ReadConfigKnobs(const bench::HttpEndpoint& ep, const std::string& model) {
  Knobs k;
  StatusOr<bench::SimpleResponse> r = bench::HttpFetch(ep, "GET", "/v2/models/" + model + "/config", "", 10);
  if (!r.ok() || r->status != 200) return k;
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object()) return k;
  k.max_batch_size = j.value("max_batch_size", 0);
  if (j.contains("dynamic_batching") && j["dynamic_batching"].is_object())
    k.max_queue_delay_us = j["dynamic_batching"].value("max_queue_delay_microseconds", int64_t{0});
  if (j.contains("instance_group") && j["instance_group"].is_array() && !j["instance_group"].empty())
    k.instances = j["instance_group"][0].value("count", 1);
  return k;
}

class Tuner {
 public:
  explicit Tuner(const TuneOptions& o) : o_(o), start_(Clock::now()) {}

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double PointCost() const { return o_.warmup_s + o_.window_s * o_.windows + 2; }
  bool BudgetLeft() const { return Elapsed() + PointCost() <= o_.budget_s; }

  // Starts a server with `k`, measures one point, stops it. `after` runs while the server is still up.
  Measurement Measure(
      const std::string& step, const Knobs& k,
      const std::function<void(const std::string& url, const std::string& model)>& after = {}) {
    Measurement m;
    m.index = static_cast<int>(r_.measurements.size());
    m.step = step;
    m.knobs = k;
    ServerProcess server;
    const std::string log = fmt::format("{}/logs/serve-{:03d}.log", o_.out_dir, m.index);
    Status s = server.Start(o_.stoke_exe, ServeArgs(o_, k), log, 120);
    if (s.ok()) s = Bench(server.url(), &m);
    if (s.ok() && after) after(server.url(), r_.served_name);
    server.Stop();
    if (!s.ok()) {
      m.error = s.message();
      m.why = "failed: " + s.message().substr(0, 200);
    }
    m.elapsed_s = Elapsed();
    r_.measuring_s += m.warmup_s + m.measured_s;
    Print(m);
    r_.measurements.push_back(m);
    return m;
  }

  Status Bench(const std::string& url, Measurement* m) {
    ASSIGN_OR_RETURN(bench::HttpEndpoint ep, bench::ParseHttpUrl(url));
    if (r_.served_name.empty()) {
      ASSIGN_OR_RETURN(r_.served_name, FirstModel(ep));
      StatusOr<bench::SimpleResponse> cfg =
          bench::HttpFetch(ep, "GET", "/v2/models/" + r_.served_name + "/config", "", 10);
      if (!cfg.ok() || cfg->status != 200) {
        const std::string name = r_.served_name;
        r_.served_name.clear();
        return InvalidArgumentError(
            "{} ('{}') is not a batched model (no /v2/models/{}/config): stoke tune walks encoders and model "
            "files; decoders: not yet",
            o_.model, name, name);
      }
      r_.baseline_knobs = ReadConfigKnobs(ep, r_.served_name);
    }
    bench::BenchOptions b;
    b.url = url;
    b.model = r_.served_name;
    b.api = bench::Api::kKserveHttp;
    b.mode = o_.mode;
    b.loads = {o_.load};
    b.workload = o_.workload;
    b.point.mode = o_.mode;
    b.point.warmup_s = o_.warmup_s;
    b.point.window_s = o_.window_s;
    b.point.max_duration_s = o_.window_s * o_.windows;
    b.point.stability = 0;  // a fixed measuring time: what the options say, never the machine's speed
    b.point.drain_timeout_s = 30;
    b.point.slo.e2e_ms = o_.slo_p99_ms;
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
    m->succeeded = p.succeeded;
    for (const auto& [kind, n] : p.errors) m->errors += n;
    m->valid = p.valid;
    m->warmup_s = p.warmup_s;
    m->measured_s = p.measured_s;
    if (!p.valid) {
      m->why = "invalid: " + (p.invalid_reasons.empty() ? std::string("?") : p.invalid_reasons[0]);
    } else if (m->errors > 0) {
      m->why = fmt::format("{} failed requests", m->errors);
    } else if (m->succeeded == 0) {
      m->why = "no request finished";
    } else if (m->p99_ms > o_.slo_p99_ms) {
      m->why = fmt::format("p99 {:.1f} ms > SLO {:.1f} ms", m->p99_ms, o_.slo_p99_ms);
    } else {
      m->accepted = true;
    }
    return OkStatus();
  }

  void Print(const Measurement& m) const {
    if (o_.progress == nullptr) return;
    fmt::print(o_.progress, "tune #{:<3} {:<18} {:<40} ", m.index, m.step, m.knobs.Describe());
    if (m.ok) {
      fmt::print(o_.progress, "{:8.1f} req/s  p50 {:7.1f} ms  p99 {:7.1f} ms  goodput {:8.1f}/s  {}",
                 m.requests_per_s, m.p50_ms, m.p99_ms, m.goodput_rps,
                 m.accepted ? "accepted" : "rejected: " + m.why);
    } else {
      fmt::print(o_.progress, "{}", m.why);
    }
    fmt::print(o_.progress, "  [{:.0f} s / budget {:.0f} s]\n", m.elapsed_s, o_.budget_s);
    std::fflush(o_.progress);
  }

  // One step of the walk: `values` of one knob applied to `base`; updates best_/best_score_.
  void Step(const std::string& knob, const std::vector<Knobs>& candidates,
            const std::vector<std::string>& names, bool ordered = true) {
    StepReport st;
    st.knob = knob;
    st.from_point = r_.chosen_index;
    std::vector<int> idx;
    const int b = WalkValues(
        candidates.size(), best_score_, o_.min_gain,
        [&](size_t i) -> std::optional<double> {
          if (!BudgetLeft()) {
            r_.budget_exhausted = true;
            return std::nullopt;
          }
          Measurement m = Measure(knob, candidates[i]);
          st.points.push_back(m.index);
          idx.push_back(m.index);
          return m.score();
        },
        [&](size_t i) { return names[i]; }, &st.stopped, ordered);
    if (b >= 0) {
      best_ = candidates[static_cast<size_t>(b)];
      best_score_ = r_.measurements[static_cast<size_t>(idx[static_cast<size_t>(b)])].score();
      r_.chosen_index = idx[static_cast<size_t>(b)];
    }
    st.best = best_;
    st.best_point = r_.chosen_index;
    r_.steps.push_back(st);
  }

  void Skip(const std::string& knob, const std::string& why) {
    r_.steps.push_back({.knob = knob, .points = {}, .skipped = true, .stopped = why, .best = best_});
    if (o_.progress) fmt::print(o_.progress, "tune {}: skipped: {}\n", knob, why);
  }

  // Resolved knobs: the model's own values made explicit (for the next step's candidates).
  Knobs Explicit(Knobs k) const {
    if (k.max_batch_size <= 0) k.max_batch_size = std::max(1, r_.baseline_knobs.max_batch_size);
    if (k.max_queue_delay_us < 0)
      k.max_queue_delay_us = std::max<int64_t>(0, r_.baseline_knobs.max_queue_delay_us);
    if (k.instances <= 0) k.instances = std::max(1, r_.baseline_knobs.instances);
    return k;
  }

  void Walk() {
    r_.mode = "walk";
    // 1. baseline, and the doctor's verdict on it (while that server is up).
    double doctor_s = 0;
    Measurement base = Measure("baseline", Knobs{}, [&](const std::string& url, const std::string& model) {
      if (!o_.doctor) return;
      doctor::DoctorOptions d;
      d.url = url;
      d.model = model;
      d.api = "kserve-http";
      d.duration_s = o_.window_s;
      d.concurrency = {o_.mode == bench::LoadMode::kConcurrency ? o_.load : 8};
      d.progress = nullptr;
      StatusOr<doctor::DoctorReport> rep = doctor::RunDoctor(d);
      // Its one load point: a warm-up of min(1 s, 0.2 x duration) then the window (doctor_runner.cc).
      doctor_s = d.duration_s + std::min(1.0, 0.2 * d.duration_s);
      if (!rep.ok()) {
        r_.doctor = {{"error", rep.status().message()}};
        return;
      }
      r_.doctor = nlohmann::json::array();
      for (const doctor::Verdict& v : rep->verdicts) {
        // Only GPU counters make "bandwidth/compute bound" a reason to skip instances: the doctor's blind
        // compute_bound (instances saturated, no counters) says nothing about what another instance adds.
        bool gpu_evidence = false;
        nlohmann::json ev = nlohmann::json::array();
        for (const doctor::Evidence& e : v.evidence) {
          gpu_evidence = gpu_evidence || e.signal.starts_with("gpu.");
          ev.push_back({{"signal", e.signal},
                        {"value", std::isfinite(e.value) ? nlohmann::json(e.value) : nlohmann::json()},
                        {"op", e.op},
                        {"threshold", e.threshold}});
        }
        r_.doctor.push_back({{"bottleneck", v.bottleneck},
                             {"confidence", v.confidence},
                             {"summary", v.summary},
                             {"next_step", v.next_step},
                             {"gpu_evidence", gpu_evidence},
                             {"evidence", ev}});
      }
    });
    r_.measuring_s += doctor_s;
    if (o_.progress && r_.doctor.is_array() && !r_.doctor.empty())
      fmt::print(o_.progress, "tune doctor on the baseline: {} ({})\n",
                 r_.doctor[0]["bottleneck"].get<std::string>(), r_.doctor[0]["summary"].get<std::string>());
    r_.chosen_index = base.index;
    best_score_ = base.score();
    best_ = Knobs{};
    if (!base.ok) return;

    // 2. max batch size, with the first queue delay.
    {
      std::vector<Knobs> c;
      std::vector<std::string> names, skipped;
      const Knobs own = Explicit(Knobs{});
      for (int bs : o_.batch_sizes) {
        Knobs k = own;
        k.max_batch_size = bs;
        k.max_queue_delay_us = o_.queue_delays_us[0];
        if (k == own || bs == own.max_batch_size) {  // the baseline measured this batch size
          skipped.push_back(fmt::format("{} (the baseline's)", bs));
          continue;
        }
        if (o_.mode == bench::LoadMode::kConcurrency && bs > 1 && bs / 2 >= o_.load) {
          skipped.push_back(fmt::format("{} (>= 2x the {} requests in flight)", bs, o_.load));
          continue;
        }
        c.push_back(k);
        names.push_back(fmt::format("batch {}", bs));
      }
      Step("max_batch_size", c, names);
      if (!skipped.empty())
        r_.steps.back().stopped += fmt::format("; not measured: {}", fmt::join(skipped, ", "));
    }
    // 3. the other queue delays with the best batch.
    if (o_.queue_delays_us.size() > 1 && Explicit(best_).max_batch_size > 1) {
      std::vector<Knobs> c;
      std::vector<std::string> names;
      for (int64_t d : o_.queue_delays_us) {
        Knobs k = Explicit(best_);
        if (k.max_queue_delay_us == d) continue;
        k.max_queue_delay_us = d;
        c.push_back(k);
        names.push_back(fmt::format("delay {} us", d));
      }
      Step("max_queue_delay_us", c, names, /*ordered=*/false);  // delays: no monotone axis
    } else if (o_.queue_delays_us.size() > 1) {
      Skip("max_queue_delay_us", "the best max_batch_size is 1: no batch to wait for");
    }
    // 4. instances, unless the doctor says more instances cannot help.
    std::string why_not;
    if (r_.doctor.is_array()) {
      for (const auto& v : r_.doctor) {
        const std::string b = v.value("bottleneck", "");
        if ((b == "bandwidth_bound" || b == "compute_bound") && v.value("gpu_evidence", false))
          why_not = fmt::format(
              "the doctor names the baseline {} ({}): more instances share the same saturated "
              "GPU and will not help",
              b, v.value("summary", ""));
      }
    }
    if (!why_not.empty()) {
      Skip("instances", why_not);
    } else {
      std::vector<Knobs> c;
      std::vector<std::string> names;
      const Knobs cur = Explicit(best_);
      for (int n : o_.instance_counts) {
        if (n <= cur.instances) continue;
        Knobs k = cur;
        k.instances = n;
        c.push_back(k);
        names.push_back(fmt::format("{} instances", n));
      }
      Step("instances", c, names);
    }
    // 5. precision.
    Skip("precision", o_.device == "cuda"
                          ? "not yet: the precision step (with its output-consistency gate) is "
                            "not built for classic models"
                          : "no lower precision for this backend (CPU)");
    r_.chosen = best_;
    Confirm();
  }

  void Confirm() {
    Confirmation& c = r_.confirmation;
    if (best_ == Knobs{}) {
      c.verdict = "no change: nothing beat the baseline by 5 %";
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
    auto mean = [](const std::vector<double>& v) {
      return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    };
    auto sem = [&](const std::vector<double>& v) {  // standard error of the mean, relative
      if (v.size() < 2) return 0.0;
      const double m = mean(v);
      double ss = 0;
      for (double x : v) ss += (x - m) * (x - m);
      return m > 0 ? std::sqrt(ss / (v.size() - 1)) / m / std::sqrt(double(v.size())) : 0.0;
    };
    const double mb = mean(c.baseline), mw = mean(c.best);
    c.spread = std::sqrt(sem(c.baseline) * sem(c.baseline) + sem(c.best) * sem(c.best));
    if (mb <= 0) {
      c.gain = mw > 0 ? INFINITY : 0;
      c.verdict =
          mw > 0 ? fmt::format(
                       "the baseline meets the SLO in no round; the best gives {:.1f} req/s of goodput", mw)
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

  void Grid() {
    r_.mode = "grid";
    Measurement base = Measure("baseline", Knobs{});
    if (!base.ok) return;
    double best = -1;
    for (int bs : o_.batch_sizes)
      for (int64_t d : o_.queue_delays_us)
        for (int n : o_.instance_counts) {
          if (!BudgetLeft()) {
            r_.budget_exhausted = true;
            break;
          }
          Measurement m = Measure("grid", Knobs{bs, d, n});
          if (m.score() > best) {
            best = m.score();
            r_.chosen = m.knobs;
            r_.chosen_index = m.index;
          }
        }
  }

  TuneResult Run() {
    r_.model = o_.model;
    r_.device = o_.device.empty() ? "model's own" : o_.device;
    r_.started_at = bench::NowIso8601();
    if (o_.grid) {
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
};

}  // namespace

std::string Knobs::Describe() const {
  return fmt::format("batch {}, delay {}, instances {}",
                     max_batch_size > 0 ? std::to_string(max_batch_size) : "own",
                     max_queue_delay_us >= 0 ? std::to_string(max_queue_delay_us) + " us" : "own",
                     instances > 0 ? std::to_string(instances) : "own");
}

int WalkValues(size_t count, double reference, double min_gain,
               const std::function<std::optional<double>(size_t)>& measure,
               const std::function<std::string(size_t)>& name, std::string* stopped, bool ordered) {
  int best = -1;
  double best_score = reference;
  // The climb compares each value with the one before it on the axis (a step may start below the previous
  // step's best: batch 1 after a baseline of 32); the step's best is adopted only if it beats `reference`.
  bool have_prev = false;
  double prev = 0;
  std::string prev_name;
  for (size_t i = 0; i < count; ++i) {
    std::optional<double> s = measure(i);
    if (!s) {
      *stopped = fmt::format("the budget is spent before {}", name(i));
      return best;
    }
    if (*s > 0 && *s >= best_score * (1 + min_gain)) {
      best = static_cast<int>(i);
      best_score = *s;
    }
    if (ordered && have_prev && prev > 0 && *s < prev * (1 + min_gain)) {
      *stopped = fmt::format("{} gains {:+.1f} % goodput over {} (< {:.0f} %)", name(i), 100 * (*s / prev - 1),
                             prev_name, 100 * min_gain);
      if (best < 0 && reference > 0)
        *stopped += fmt::format("; no value beat the previous step's best ({:.1f}/s) by {:.0f} %", reference,
                                100 * min_gain);
      return best;
    }
    have_prev = true;
    prev = *s;
    prev_name = name(i);
  }
  *stopped = count == 0 ? "no value to try" : "every value measured";
  if (best < 0 && best_score <= 0 && count > 0) *stopped = "no value meets the SLO";
  if (best < 0 && reference > 0 && count > 0)
    *stopped += fmt::format("; no value beat the previous step's best ({:.1f}/s) by {:.0f} %", reference,
                            100 * min_gain);
  return best;
}

StatusOr<TuneResult> RunTune(const TuneOptions& opts) {
  if (opts.slo_p99_ms <= 0) return InvalidArgumentError("--slo-p99-ms must be > 0");
  if (opts.queue_delays_us.empty() || opts.batch_sizes.empty() || opts.instance_counts.empty())
    return InvalidArgumentError("the knob value lists must not be empty");
  std::error_code ec;
  std::filesystem::create_directories(opts.out_dir + "/logs", ec);
  if (ec) return InvalidArgumentError("--out {}: {}", opts.out_dir, ec.message());
  Tuner t(opts);
  TuneResult r = t.Run();
  if (r.measurements.empty() || !r.measurements[0].ok)
    return UnavailableError("the baseline could not be measured: {}",
                            r.measurements.empty() ? "no measurement" : r.measurements[0].error);
  return r;
}

}  // namespace stoke::tune
