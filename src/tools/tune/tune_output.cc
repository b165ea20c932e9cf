#include "tools/tune/tune_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "tools/bench/svg_chart.h"

namespace stoke::tune {

namespace {

using bench::XmlEscape;

nlohmann::json KnobsJson(const Knobs& k) {
  return {{"max_batch_size", k.max_batch_size > 0 ? nlohmann::json(k.max_batch_size) : nlohmann::json("own")},
          {"max_queue_delay_us",
           k.max_queue_delay_us >= 0 ? nlohmann::json(k.max_queue_delay_us) : nlohmann::json("own")},
          {"instances", k.instances > 0 ? nlohmann::json(k.instances) : nlohmann::json("own")}};
}

std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

double KnobValue(const std::string& knob, const Knobs& k) {
  if (knob == "max_batch_size") return k.max_batch_size;
  if (knob == "max_queue_delay_us") return static_cast<double>(k.max_queue_delay_us);
  return k.instances;
}

}  // namespace

std::string TuneToml(const TuneOptions& o, const TuneResult& r) {
  std::string t = fmt::format(
      "# Written by stoke tune ({}) on {}: SLO p99 {} ms, {} {}, workload {}.\n"
      "# Serve it with: stoke serve --config stoke.toml   (flags on the command line win)\n",
      r.mode, r.started_at, o.slo_p99_ms, o.mode == bench::LoadMode::kConcurrency ? "concurrency" : "rate",
      o.load, o.workload.name);
  if (r.chosen_index >= 0) {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    t += fmt::format("# Chosen: {} -> goodput {:.1f} req/s, p99 {:.1f} ms (baseline goodput {:.1f} req/s).\n",
                     r.chosen.Describe(), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (r.confirmation.ran || !r.confirmation.verdict.empty())
    t += "# Confirmation: " + r.confirmation.verdict + "\n";
  // A model file's path made absolute, so the file serves from any working directory.
  std::error_code ec;
  std::string model = o.model;
  if (std::filesystem::exists(model, ec)) model = std::filesystem::absolute(model, ec).string();
  t += "model = " + TomlString(model) + "\n";
  if (!o.device.empty()) t += "device = " + TomlString(o.device) + "\n";
  if (r.chosen.max_batch_size > 0) t += fmt::format("max-batch-size = {}\n", r.chosen.max_batch_size);
  if (r.chosen.max_queue_delay_us >= 0)
    t += fmt::format("max-queue-delay-us = {}\n", r.chosen.max_queue_delay_us);
  if (r.chosen.instances > 0) t += fmt::format("instances = {}\n", r.chosen.instances);
  return t;
}

nlohmann::json TuneJson(const TuneOptions& o, const TuneResult& r) {
  nlohmann::json j;
  j["schema"] = "stoke.tune.v1";
  j["mode"] = r.mode;
  j["model"] = r.model;
  j["served_name"] = r.served_name;
  j["device"] = r.device;
  j["started_at"] = r.started_at;
  j["slo_p99_ms"] = o.slo_p99_ms;
  j["load"] = {{"mode", o.mode == bench::LoadMode::kConcurrency ? "concurrency" : "rate"}, {"value", o.load}};
  j["workload"] = o.workload.name;
  j["point"] = {{"warmup_s", o.warmup_s}, {"window_s", o.window_s}, {"windows", o.windows}};
  j["budget_s"] = o.budget_s;
  j["budget_exhausted"] = r.budget_exhausted;
  j["min_gain"] = o.min_gain;
  j["baseline_knobs"] = KnobsJson(r.baseline_knobs);
  j["measurements"] = nlohmann::json::array();
  for (const Measurement& m : r.measurements) {
    j["measurements"].push_back({{"index", m.index},
                                 {"step", m.step},
                                 {"knobs", KnobsJson(m.knobs)},
                                 {"ok", m.ok},
                                 {"error", m.error},
                                 {"requests_per_s", m.requests_per_s},
                                 {"goodput_rps", m.goodput_rps},
                                 {"p50_ms", m.p50_ms},
                                 {"p99_ms", m.p99_ms},
                                 {"succeeded", m.succeeded},
                                 {"errors", m.errors},
                                 {"valid", m.valid},
                                 {"accepted", m.accepted},
                                 {"why", m.why},
                                 {"warmup_s", m.warmup_s},
                                 {"measured_s", m.measured_s},
                                 {"elapsed_s", m.elapsed_s}});
  }
  j["steps"] = nlohmann::json::array();
  for (const StepReport& s : r.steps) {
    j["steps"].push_back({{"knob", s.knob},
                          {"points", s.points},
                          {"skipped", s.skipped},
                          {"stopped", s.stopped},
                          {"best", KnobsJson(s.best)}});
  }
  j["doctor"] = r.doctor;
  j["chosen"] = KnobsJson(r.chosen);
  j["chosen_index"] = r.chosen_index;
  if (r.chosen_index >= 0)
    j["chosen_goodput_rps"] = r.measurements[static_cast<size_t>(r.chosen_index)].goodput_rps;
  const Confirmation& c = r.confirmation;
  j["confirmation"] = {{"ran", c.ran},
                       {"baseline_goodput", c.baseline},
                       {"best_goodput", c.best},
                       {"gain", std::isfinite(c.gain) ? nlohmann::json(c.gain) : nlohmann::json(nullptr)},
                       {"spread", c.spread},
                       {"verdict", c.verdict}};
  j["measurement_count"] = r.measurements.size();
  j["measuring_s"] = r.measuring_s;
  return j;
}

std::string TuneText(const TuneOptions& o, const TuneResult& r) {
  std::string t = fmt::format("stoke tune ({}): {} measurements, {:.1f} s measuring, SLO p99 {} ms\n", r.mode,
                              r.measurements.size(), r.measuring_s, o.slo_p99_ms);
  for (const StepReport& s : r.steps)
    t += fmt::format("  {:<20} {}{}\n", s.knob, s.skipped ? "skipped: " : "", s.stopped);
  if (r.chosen_index >= 0) {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    t += fmt::format("  chosen: {} (goodput {:.1f} req/s, p99 {:.1f} ms; baseline {:.1f} req/s)\n",
                     r.chosen.Describe(), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (!r.confirmation.verdict.empty()) t += "  confirmation: " + r.confirmation.verdict + "\n";
  return t;
}

std::string TuneHtml(const TuneOptions& o, const TuneResult& r) {
  std::string h =
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>stoke tune</title><style>"
      "body{font-family:sans-serif;max-width:1000px;margin:1em auto;color:#222}"
      "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px "
      "6px;text-align:right}"
      "td.l,th.l{text-align:left}tr.rej td{color:#b00}tr.chosen td{font-weight:bold;background:#efe}"
      ".chart{margin:0.5em 0}</style></head><body>";
  h += fmt::format(
      "<h1>stoke tune: {}</h1><p>{} mode, started {}; SLO p99 {} ms; {} {}; {} measurements, {:.1f} s "
      "of measuring time.</p>",
      XmlEscape(r.model), r.mode, XmlEscape(r.started_at), o.slo_p99_ms,
      o.mode == bench::LoadMode::kConcurrency ? "concurrency" : "rate", o.load, r.measurements.size(),
      r.measuring_s);
  if (r.chosen_index >= 0) {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    h += fmt::format(
        "<p id=\"chosen\"><b>Chosen:</b> {} &mdash; goodput {:.1f} req/s, p99 {:.1f} ms (baseline {:.1f} "
        "req/s).</p>",
        XmlEscape(r.chosen.Describe()), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (!r.confirmation.verdict.empty())
    h += "<p id=\"confirmation\"><b>Confirmation:</b> " + XmlEscape(r.confirmation.verdict) + "</p>";
  if (r.doctor.is_array() && !r.doctor.empty())
    h += "<p><b>Doctor on the baseline:</b> " + XmlEscape(r.doctor[0].value("bottleneck", "")) + " &mdash; " +
         XmlEscape(r.doctor[0].value("summary", "")) + "</p>";
  // Per step: goodput vs the knob (chosen point marked), p99 vs the knob with the SLO line.
  h += "<h2>Steps</h2>";
  for (const StepReport& s : r.steps) {
    h += fmt::format("<h3 class=\"step\">{}</h3><p class=\"why\">{}{}</p>", XmlEscape(s.knob),
                     s.skipped ? "Skipped: " : "Stopped: ", XmlEscape(s.stopped));
    if (s.points.empty()) continue;
    bench::ChartSeries good{.name = "goodput"}, p99{.name = "p99"},
        slo{.name = "SLO", .markers = false, .dashed = true};
    bench::ChartSeries kept{.name = "kept"};
    std::vector<int> pts = s.points;  // with the point the step started from, in knob order
    if (s.from_point >= 0) pts.push_back(s.from_point);
    auto knob_x = [&](int i) {  // the baseline's "own" values as its server reported them
      return KnobValue(s.knob, i == 0 ? r.baseline_knobs : r.measurements[static_cast<size_t>(i)].knobs);
    };
    std::sort(pts.begin(), pts.end(), [&](int a, int b) { return knob_x(a) < knob_x(b); });
    std::vector<double> ticks;
    for (int i : pts) {
      const Measurement& m = r.measurements[static_cast<size_t>(i)];
      const double x = knob_x(i);
      ticks.push_back(x);
      good.x.push_back(x);
      good.y.push_back(m.goodput_rps);
      good.invalid.push_back(!m.accepted);
      p99.x.push_back(x);
      p99.y.push_back(m.p99_ms);
      p99.invalid.push_back(!m.accepted);
      slo.x.push_back(x);
      slo.y.push_back(o.slo_p99_ms);
      if (i == s.best_point) {
        kept.x.push_back(x);
        kept.y.push_back(m.goodput_rps);
      }
    }
    const bool log_x = s.knob != "max_queue_delay_us";
    h += "<div class=\"chart\">" +
         bench::LineChartSvg({.title = "goodput vs " + s.knob + " (crossed: rejected; kept: carried on)",
                              .x_label = s.knob,
                              .y_label = "goodput (req/s)",
                              .log_x = log_x,
                              .x_ticks = ticks},
                             {good, kept}) +
         "</div><div class=\"chart\">" +
         bench::LineChartSvg({.title = "p99 vs " + s.knob,
                              .x_label = s.knob,
                              .y_label = "p99 (ms)",
                              .log_x = log_x,
                              .x_ticks = ticks},
                             {p99, slo}) +
         "</div>";
  }
  if (r.mode == "grid") {  // goodput vs batch size, one line per (delay, instances)
    std::map<std::pair<int64_t, int>, bench::ChartSeries> lines;
    for (const Measurement& m : r.measurements) {
      if (m.step != "grid") continue;
      bench::ChartSeries& l = lines[{m.knobs.max_queue_delay_us, m.knobs.instances}];
      l.name = fmt::format("delay {} us, {} inst", m.knobs.max_queue_delay_us, m.knobs.instances);
      l.x.push_back(m.knobs.max_batch_size);
      l.y.push_back(m.goodput_rps);
      l.invalid.push_back(!m.accepted);
    }
    std::vector<bench::ChartSeries> v;
    for (auto& [k, l] : lines) v.push_back(std::move(l));
    h += "<h2>Grid</h2><div class=\"chart\">" +
         bench::LineChartSvg({.title = "goodput vs max_batch_size (every combination)",
                              .x_label = "max_batch_size",
                              .y_label = "goodput (req/s)",
                              .log_x = true,
                              .width = 900,
                              .height = 400},
                             v) +
         "</div>";
  }
  h += "<h2>Every measurement</h2><table><tr><th>#</th><th class=\"l\">step</th><th class=\"l\">knobs</th>"
       "<th>req/s</th><th>p50 ms</th><th>p99 ms</th><th>goodput/s</th><th class=\"l\">verdict</th></tr>";
  for (const Measurement& m : r.measurements) {
    h += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1f}</td>"
        "<td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td><td class=\"l\">{}</td></tr>",
        m.index == r.chosen_index ? "chosen" : (m.accepted ? "" : "rej"), m.index, XmlEscape(m.step),
        XmlEscape(m.knobs.Describe()), m.requests_per_s, m.p50_ms, m.p99_ms, m.goodput_rps,
        m.accepted ? "accepted" : XmlEscape("rejected: " + m.why));
  }
  h += "</table></body></html>\n";
  return h;
}

}  // namespace stoke::tune
