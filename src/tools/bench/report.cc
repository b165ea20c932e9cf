#include "tools/bench/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "base/file_util.h"
#include "tools/bench/html_report.h"

namespace stoke::bench {

using nlohmann::json;

namespace {

json SummaryJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"stddev", s.stddev}, {"min", s.min}, {"max", s.max},
          {"p50", s.p50},     {"p90", s.p90},   {"p95", s.p95},       {"p99", s.p99}};
}

double Num(const json& j, const char* key, double def = 0) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return it != j.end() && it->is_null() ? std::numeric_limits<double>::quiet_NaN() : def;
  }
  return it->get<double>();
}
std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

Summary SummaryFrom(const json& j) {
  Summary s;
  s.count = static_cast<int64_t>(Num(j, "count"));
  s.mean = Num(j, "mean");
  s.stddev = Num(j, "stddev");
  s.min = Num(j, "min");
  s.max = Num(j, "max");
  s.p50 = Num(j, "p50");
  s.p90 = Num(j, "p90");
  s.p95 = Num(j, "p95");
  s.p99 = Num(j, "p99");
  return s;
}

json HistJson(const Histogram& h) {
  return {{"edges", h.edges}, {"counts", h.counts}};
}
Histogram HistFrom(const json& j) {
  Histogram h;
  if (j.contains("edges") && j["edges"].is_array()) h.edges = j["edges"].get<std::vector<double>>();
  if (j.contains("counts") && j["counts"].is_array()) h.counts = j["counts"].get<std::vector<int64_t>>();
  if (h.counts.size() + 1 != h.edges.size()) h = {};
  return h;
}

Api ApiFrom(const std::string& s) {
  for (Api a : kAllApis) {
    if (s == ApiName(a)) return a;
  }
  return Api::kOpenAiChat;
}

std::string Ms(double v) {
  if (std::isnan(v)) return "-";
  if (v >= 100) return fmt::format("{:.0f}", v);
  if (v >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

std::string CsvEscape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string ErrorsText(const PointResult& p) {
  std::string s;
  for (const auto& [k, n] : p.errors) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, n);
  return s;
}

}  // namespace

const char* LoadModeName(LoadMode m) {
  return m == LoadMode::kConcurrency ? "concurrency" : "rate";
}
const char* ArrivalName(Arrival a) {
  return a == Arrival::kPoisson ? "poisson" : "constant";
}
std::string LoadLabel(LoadMode m, double load) {
  return m == LoadMode::kConcurrency ? fmt::format("c={}", load) : fmt::format("{:g} req/s", load);
}

json ReportToJson(const BenchReport& report) {
  const RunInfo& r = report.run;
  json run = {{"command", r.command},
              {"url", r.url},
              {"model", r.model},
              {"api", ApiName(r.api)},
              {"mode", LoadModeName(r.mode)},
              {"arrival", ArrivalName(r.arrival)},
              {"workload", r.workload},
              {"stream", r.stream},
              {"slo_ms", {{"ttft", r.slo.ttft_ms}, {"tpot", r.slo.tpot_ms}, {"e2e", r.slo.e2e_ms}}},
              {"label", r.label},
              {"started_at", r.started_at},
              {"git_commit", r.git_commit},
              {"host", r.host},
              {"window_s", r.window_s},
              {"warmup_s", r.warmup_s},
              {"ramp_up_s", r.ramp_up_s},
              {"max_duration_s", r.max_duration_s},
              {"stability", r.stability},
              {"seed", r.seed}};
  json points = json::array();
  for (const PointResult& p : report.points) {
    json windows = json::array();
    for (const WindowStats& w : p.windows) {
      windows.push_back({{"start_s", w.start_s},
                         {"duration_s", w.duration_s},
                         {"completed", w.completed},
                         {"requests_per_s", w.requests_per_s},
                         {"output_tokens_per_s", w.output_tokens_per_s},
                         {"p50_ms", w.p50_ms},
                         {"p99_ms", w.p99_ms},
                         {"ttft_p50_ms", w.ttft_p50_ms},
                         {"ttft_p99_ms", w.ttft_p99_ms},
                         {"tpot_p50_ms", w.tpot_p50_ms}});
    }
    const GeneratorHealth& g = p.generator;
    points.push_back({
        {"mode", LoadModeName(p.mode)},
        {"load", p.load},
        {"valid", p.valid},
        {"invalid_reasons", p.invalid_reasons},
        {"stable", p.stable},
        {"warmup_s", p.warmup_s},
        {"measured_s", p.measured_s},
        {"t_start_s", p.t_start_s},
        {"t_end_s", p.t_end_s},
        {"windows", windows},
        {"requests",
         {{"sent", p.sent},
          {"succeeded", p.succeeded},
          {"errors", p.errors},
          {"error_examples", p.error_examples}}},
        {"throughput",
         {{"requests_per_s", p.requests_per_s},
          {"input_tokens_per_s", p.input_tokens_per_s},
          {"output_tokens_per_s", p.output_tokens_per_s},
          {"mean_input_tokens", p.mean_input_tokens},
          {"mean_output_tokens", p.mean_output_tokens}}},
        {"latency_ms", SummaryJson(p.latency_ms)},
        {"ttft_ms", SummaryJson(p.ttft_ms)},
        {"tpot_ms", SummaryJson(p.tpot_ms)},
        {"itl_ms", SummaryJson(p.itl_ms)},
        {"histograms_ms",
         {{"latency", HistJson(p.latency_hist)},
          {"ttft", HistJson(p.ttft_hist)},
          {"itl", HistJson(p.itl_hist)}}},
        {"goodput", {{"requests_per_s", p.goodput_rps}, {"fraction", p.goodput_fraction}}},
        {"generator",
         {{"send_lag_ms", SummaryJson(g.send_lag_ms)},
          {"late_sends", g.late_sends},
          {"late_threshold_ms", g.late_threshold_ms},
          {"dropped_sends", g.dropped_sends},
          {"cpu_percent", g.cpu_percent},
          {"reused_requests", g.reused_requests}}},
    });
  }
  json server = {{"available", report.server.available},
                 {"note", report.server.note},
                 {"t_s", report.server.t_s},
                 {"series", report.server.series}};
  return {{"schema", r.schema}, {"run", run}, {"points", points}, {"server_metrics", server}};
}

StatusOr<BenchReport> ReportFromJson(const json& j) {
  if (!j.is_object() || Str(j, "schema") != "stoke.bench.v1") {
    return InvalidArgumentError("not a stoke bench report (schema stoke.bench.v1)");
  }
  BenchReport rep;
  const json& run = Obj(j, "run");
  RunInfo& r = rep.run;
  r.command = Str(run, "command");
  r.url = Str(run, "url");
  r.model = Str(run, "model");
  r.api = ApiFrom(Str(run, "api"));
  r.mode = Str(run, "mode") == "rate" ? LoadMode::kRate : LoadMode::kConcurrency;
  r.arrival = Str(run, "arrival") == "constant" ? Arrival::kConstant : Arrival::kPoisson;
  r.workload = Str(run, "workload");
  r.stream = run.value("stream", true);
  const json& slo = Obj(run, "slo_ms");
  r.slo = {Num(slo, "ttft"), Num(slo, "tpot"), Num(slo, "e2e")};
  r.label = Str(run, "label");
  r.started_at = Str(run, "started_at");
  r.git_commit = Str(run, "git_commit");
  r.host = Str(run, "host");
  r.window_s = Num(run, "window_s");
  r.warmup_s = Num(run, "warmup_s");
  r.ramp_up_s = Num(run, "ramp_up_s");
  r.max_duration_s = Num(run, "max_duration_s");
  r.stability = Num(run, "stability");
  r.seed = static_cast<uint64_t>(Num(run, "seed"));
  if (!j.contains("points") || !j["points"].is_array()) return InvalidArgumentError("report has no 'points'");
  for (const json& pj : j["points"]) {
    if (!pj.is_object()) return InvalidArgumentError("report: a point is not an object");
    PointResult p;
    p.mode = Str(pj, "mode") == "rate" ? LoadMode::kRate : LoadMode::kConcurrency;
    p.load = Num(pj, "load");
    p.valid = pj.value("valid", false);
    if (pj.contains("invalid_reasons") && pj["invalid_reasons"].is_array()) {
      p.invalid_reasons = pj["invalid_reasons"].get<std::vector<std::string>>();
    }
    p.stable = pj.value("stable", false);
    p.warmup_s = Num(pj, "warmup_s");
    p.measured_s = Num(pj, "measured_s");
    p.t_start_s = Num(pj, "t_start_s");
    p.t_end_s = Num(pj, "t_end_s");
    if (pj.contains("windows") && pj["windows"].is_array()) {
      for (const json& w : pj["windows"]) {
        p.windows.push_back({Num(w, "start_s"), Num(w, "duration_s"),
                             static_cast<int64_t>(Num(w, "completed")), Num(w, "requests_per_s"),
                             Num(w, "output_tokens_per_s"), Num(w, "p50_ms"), Num(w, "p99_ms"),
                             Num(w, "ttft_p50_ms"), Num(w, "ttft_p99_ms"), Num(w, "tpot_p50_ms")});
      }
    }
    const json& req = Obj(pj, "requests");
    p.sent = static_cast<int64_t>(Num(req, "sent"));
    p.succeeded = static_cast<int64_t>(Num(req, "succeeded"));
    for (const auto& [k, v] : Obj(req, "errors").items()) {
      if (v.is_number()) p.errors[k] = v.get<int64_t>();
    }
    for (const auto& [k, v] : Obj(req, "error_examples").items()) {
      if (v.is_string()) p.error_examples[k] = v.get<std::string>();
    }
    const json& tp = Obj(pj, "throughput");
    p.requests_per_s = Num(tp, "requests_per_s");
    p.input_tokens_per_s = Num(tp, "input_tokens_per_s");
    p.output_tokens_per_s = Num(tp, "output_tokens_per_s");
    p.mean_input_tokens = Num(tp, "mean_input_tokens");
    p.mean_output_tokens = Num(tp, "mean_output_tokens");
    p.latency_ms = SummaryFrom(Obj(pj, "latency_ms"));
    p.ttft_ms = SummaryFrom(Obj(pj, "ttft_ms"));
    p.tpot_ms = SummaryFrom(Obj(pj, "tpot_ms"));
    p.itl_ms = SummaryFrom(Obj(pj, "itl_ms"));
    const json& hists = Obj(pj, "histograms_ms");
    p.latency_hist = HistFrom(Obj(hists, "latency"));
    p.ttft_hist = HistFrom(Obj(hists, "ttft"));
    p.itl_hist = HistFrom(Obj(hists, "itl"));
    const json& gp = Obj(pj, "goodput");
    p.goodput_rps = Num(gp, "requests_per_s");
    p.goodput_fraction = Num(gp, "fraction");
    const json& gen = Obj(pj, "generator");
    p.generator.send_lag_ms = SummaryFrom(Obj(gen, "send_lag_ms"));
    p.generator.late_sends = static_cast<int64_t>(Num(gen, "late_sends"));
    p.generator.late_threshold_ms = Num(gen, "late_threshold_ms");
    p.generator.dropped_sends = static_cast<int64_t>(Num(gen, "dropped_sends"));
    p.generator.cpu_percent = Num(gen, "cpu_percent");
    p.generator.reused_requests = static_cast<int64_t>(Num(gen, "reused_requests"));
    rep.points.push_back(std::move(p));
  }
  const json& sm = Obj(j, "server_metrics");
  rep.server.available = sm.value("available", false);
  rep.server.note = Str(sm, "note");
  if (sm.contains("t_s") && sm["t_s"].is_array()) {
    for (const json& v : sm["t_s"]) rep.server.t_s.push_back(v.is_number() ? v.get<double>() : NAN);
  }
  for (const auto& [k, v] : Obj(sm, "series").items()) {
    if (!v.is_array()) continue;
    std::vector<double>& col = rep.server.series[k];
    for (const json& x : v) col.push_back(x.is_number() ? x.get<double>() : NAN);
    col.resize(rep.server.t_s.size(), NAN);
  }
  return rep;
}

StatusOr<BenchReport> ReadReportFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("{}: not valid JSON", path);
  StatusOr<BenchReport> r = ReportFromJson(j);
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

std::string ReportCsv(const BenchReport& report) {
  std::string out =
      "mode,load,valid,stable,sent,succeeded,errors,requests_per_s,input_tokens_per_s,output_tokens_per_s,"
      "latency_p50_ms,latency_p90_ms,latency_p95_ms,latency_p99_ms,latency_max_ms,ttft_p50_ms,ttft_p99_ms,"
      "tpot_p50_ms,tpot_p99_ms,itl_p50_ms,itl_p99_ms,goodput_rps,goodput_fraction,send_lag_p99_ms,"
      "generator_cpu_percent,invalid_reasons\n";
  for (const PointResult& p : report.points) {
    std::string reasons;
    for (const auto& r : p.invalid_reasons) reasons += (reasons.empty() ? "" : "; ") + r;
    out += fmt::format(
        "{},{},{},{},{},{},{},{:.4f},{:.2f},{:.2f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:"
        ".3f},"
        "{:.3f},{:.3f},{:.4f},{:.4f},{:.3f},{:.1f},{}\n",
        LoadModeName(p.mode), p.load, p.valid, p.stable, p.sent, p.succeeded, CsvEscape(ErrorsText(p)),
        p.requests_per_s, p.input_tokens_per_s, p.output_tokens_per_s, p.latency_ms.p50, p.latency_ms.p90,
        p.latency_ms.p95, p.latency_ms.p99, p.latency_ms.max, p.ttft_ms.p50, p.ttft_ms.p99, p.tpot_ms.p50,
        p.tpot_ms.p99, p.itl_ms.p50, p.itl_ms.p99, p.goodput_rps, p.goodput_fraction,
        p.generator.send_lag_ms.p99, p.generator.cpu_percent, CsvEscape(reasons));
  }
  return out;
}

std::string ReportTable(const BenchReport& report) {
  const bool tokens = ApiStreamsTokens(report.run.api) && report.run.stream;
  const bool slo = report.run.slo.any();
  std::string out = fmt::format("{:>12} {:>9} {:>10} {:>8} {:>8} {:>8}", "load", "req/s", "out tok/s",
                                "p50 ms", "p90 ms", "p99 ms");
  if (tokens) out += fmt::format(" {:>9} {:>9} {:>9} {:>8}", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p99");
  if (slo) out += fmt::format(" {:>6}", "good%");
  out += fmt::format(" {:>7} {:>6}  {}\n", "lag p99", "cpu%", "notes");
  for (const PointResult& p : report.points) {
    std::string row = fmt::format("{:>12} {:>9.2f} {:>10.1f} {:>8} {:>8} {:>8}", LoadLabel(p.mode, p.load),
                                  p.requests_per_s, p.output_tokens_per_s, Ms(p.latency_ms.p50),
                                  Ms(p.latency_ms.p90), Ms(p.latency_ms.p99));
    if (tokens) {
      row += fmt::format(" {:>9} {:>9} {:>9} {:>8}", Ms(p.ttft_ms.p50), Ms(p.ttft_ms.p99), Ms(p.tpot_ms.p50),
                         Ms(p.itl_ms.p99));
    }
    if (slo) row += fmt::format(" {:>6.1f}", 100 * p.goodput_fraction);
    row += fmt::format(" {:>7} {:>6.0f}  ", Ms(p.generator.send_lag_ms.p99), p.generator.cpu_percent);
    std::string notes;
    if (!p.valid) {
      notes = "INVALID:";
      for (const auto& r : p.invalid_reasons) notes += " " + r + ";";
    } else if (!p.stable && report.run.stability > 0) {
      notes = "unstable;";
    }
    if (!p.errors.empty()) notes += (notes.empty() ? "" : " ") + std::string("errors: ") + ErrorsText(p);
    out += row + notes + "\n";
  }
  return out;
}

Status WriteReportFiles(const BenchReport& report, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError("cannot create {}: {}", dir, ec.message());
  RETURN_IF_ERROR(WriteStringToFile(dir + "/bench.json", ReportToJson(report).dump(1) + "\n"));
  RETURN_IF_ERROR(WriteStringToFile(dir + "/bench.csv", ReportCsv(report)));
  RETURN_IF_ERROR(WriteStringToFile(dir + "/report.html", RenderHtmlReport(report)));
  return OkStatus();
}

ProgressPrinter::ProgressPrinter(FILE* out, bool quiet)
    : out_(out), tty_(isatty(fileno(out))), quiet_(quiet) {}

void ProgressPrinter::BeginPoint(int index, int total, const std::string& label) {
  prefix_ = fmt::format("[{}/{}] {}", index + 1, total, label);
}

void ProgressPrinter::OnEvent(const ProgressEvent& e) {
  if (quiet_) return;
  using Phase = ProgressEvent::Phase;
  std::string line;
  if (e.phase == Phase::kWarmup) {
    line = fmt::format("{}: warming up", prefix_);
  } else if (e.phase == Phase::kWindow && e.window != nullptr) {
    constexpr int kWidth = 24;
    int filled = e.max_s > 0 ? std::clamp(static_cast<int>(kWidth * e.elapsed_s / e.max_s), 0, kWidth) : 0;
    std::string bar;
    for (int i = 0; i < kWidth; ++i) bar += i < filled ? "#" : ".";
    line = fmt::format("{} [{}] {:.0f}/{:.0f}s window {}: {:.2f} req/s, p50 {} ms, p99 {} ms, {} in flight{}",
                       prefix_, bar, e.elapsed_s, e.max_s, e.windows, e.window->requests_per_s,
                       Ms(e.window->p50_ms), Ms(e.window->p99_ms), e.in_flight, e.stable ? ", stable" : "");
  } else if (e.phase == Phase::kDrain) {
    line = fmt::format("{}: draining {} in flight", prefix_, e.in_flight);
  } else if (e.phase == Phase::kDone) {
    if (tty_) std::fputs("\r\033[K", out_);
    std::fflush(out_);
    return;
  } else {
    return;
  }
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace stoke::bench
