#include "tools/tune/tune_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "tools/bench/svg_chart.h"

namespace stoke::tune {

namespace {

using bench::XmlEscape;

std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// --serve-args as stoke.toml keys, so the file serves as the points ran: "--gemm-cache g.json
// --no-prefix-cache
// --threads=4" -> gemm-cache = "g.json", no-prefix-cache = true, threads = "4". A key already written (a
// knob) or repeated is left as a comment: TOML allows a key once.
std::string ServeArgsToml(const std::vector<std::string>& args, std::set<std::string>* written) {
  std::string t;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() <= 2 || a.rfind("--", 0) != 0) {
      t += "# --serve-args " + a + ": not a --flag, left out\n";
      continue;
    }
    std::string key = a.substr(2), value = "true";
    if (const size_t eq = key.find('='); eq != std::string::npos) {
      value = TomlString(key.substr(eq + 1));
      key.resize(eq);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = TomlString(args[++i]);
    }
    t += written->insert(key).second ? "" : "# --serve-args, already set above: ";
    t += key + " = " + value + "\n";
  }
  return t;
}

std::string LoadText(const TuneOptions& o) {
  return fmt::format("{} {}", o.mode == bench::LoadMode::kConcurrency ? "concurrency" : "rate", o.load);
}

// The first verdict's name and summary, "" when the doctor was not asked or failed.
std::string VerdictText(const nlohmann::json& v) {
  if (v.is_array() && !v.empty())
    return v[0].value("bottleneck", "?") + " (" + v[0].value("summary", "") + ")";
  if (v.is_object() && v.contains("error")) return "not diagnosed: " + v.value("error", "");
  return "";
}

// Where a point sits on a step's axis: "own" values read as the server's (the baseline's reported knobs;
// chunked prefill and CUDA graphs are on unless turned off).
double AxisValue(const std::string& knob, const TuneResult& r, int i) {
  const Knobs& k = r.measurements[static_cast<size_t>(i)].knobs;
  double v = KnobValue(knob, k);
  if (knob == "chunked_prefill" || knob == "cuda_graphs") return v < 0 ? 1 : v;
  if (knob == "async_output") return v < 0 ? 1 : v;  // own: auto, on for the GPU decoders this step runs on
  if (v <= 0 && knob != "max_queue_delay_us") v = KnobValue(knob, r.baseline_knobs);
  if (knob == "max_queue_delay_us" && v < 0) v = static_cast<double>(r.baseline_knobs.max_queue_delay_us);
  return v;
}

struct LatencyAxis {
  const char* name;
  double slo;
  double (*get)(const Measurement&);
};

std::vector<LatencyAxis> LatencyAxes(const TuneOptions& o) {
  std::vector<LatencyAxis> a;
  if (o.slos.p99_ms > 0 || (o.slos.ttft_ms <= 0 && o.slos.tpot_ms <= 0))
    a.push_back({"p99", o.slos.p99_ms, [](const Measurement& m) { return m.p99_ms; }});
  if (o.slos.ttft_ms > 0)
    a.push_back({"TTFT p99", o.slos.ttft_ms, [](const Measurement& m) { return m.ttft_p99_ms; }});
  if (o.slos.tpot_ms > 0)
    a.push_back({"TPOT p99", o.slos.tpot_ms, [](const Measurement& m) { return m.tpot_p99_ms; }});
  return a;
}

std::string StepCharts(const TuneOptions& o, const TuneResult& r, const StepReport& s) {
  std::vector<int> pts = s.points;  // with the point the step started from, in knob order
  if (s.from_point >= 0) pts.push_back(s.from_point);
  std::sort(pts.begin(), pts.end(),
            [&](int a, int b) { return AxisValue(s.knob, r, a) < AxisValue(s.knob, r, b); });
  bench::ChartSeries good{.name = "goodput"}, kept{.name = "kept"};
  std::vector<double> ticks;
  for (int i : pts) {
    const Measurement& m = r.measurements[static_cast<size_t>(i)];
    const double x = AxisValue(s.knob, r, i);
    ticks.push_back(x);
    good.x.push_back(x);
    good.y.push_back(m.goodput_rps);
    good.invalid.push_back(!m.accepted);
    if (i == s.best_point) {
      kept.x.push_back(x);
      kept.y.push_back(m.goodput_rps);
    }
  }
  const bool log_x = s.knob != "max_queue_delay_us" && s.knob != "chunked_prefill" &&
                     s.knob != "cuda_graphs" && s.knob != "target_step_ms" && s.knob != "async_output";
  std::string h =
      "<div class=\"chart\">" +
      bench::LineChartSvg({.title = "goodput vs " + s.knob + " (crossed: rejected; kept: carried on)",
                           .x_label = s.knob,
                           .y_label = "goodput (req/s)",
                           .log_x = log_x,
                           .x_ticks = ticks},
                          {good, kept}) +
      "</div>";
  for (const LatencyAxis& ax : LatencyAxes(o)) {
    bench::ChartSeries lat{.name = ax.name}, slo{.name = "SLO", .markers = false, .dashed = true};
    for (int i : pts) {
      const Measurement& m = r.measurements[static_cast<size_t>(i)];
      lat.x.push_back(AxisValue(s.knob, r, i));
      lat.y.push_back(ax.get(m));
      lat.invalid.push_back(!m.accepted);
      slo.x.push_back(AxisValue(s.knob, r, i));
      slo.y.push_back(ax.slo);
    }
    std::vector<bench::ChartSeries> series = {lat};
    if (ax.slo > 0) series.push_back(slo);
    h += "<div class=\"chart\">" +
         bench::LineChartSvg({.title = std::string(ax.name) + " vs " + s.knob,
                              .x_label = s.knob,
                              .y_label = std::string(ax.name) + " (ms)",
                              .log_x = log_x,
                              .x_ticks = ticks},
                             series) +
         "</div>";
  }
  return h;
}

std::string GridChart(const TuneResult& r) {
  std::map<std::string, bench::ChartSeries> lines;  // batched: per (delay, instances); decoders: per tokens
  const bool dec = r.kind == ModelKind::kDecoder;
  for (const Measurement& m : r.measurements) {
    if (m.step != "grid") continue;
    const std::string key =
        dec ? fmt::format("tokens {}", m.knobs.max_num_batched_tokens)
            : fmt::format("delay {} us, {} inst", m.knobs.max_queue_delay_us, m.knobs.instances);
    bench::ChartSeries& l = lines[key];
    l.name = key;
    l.x.push_back(dec ? m.knobs.max_num_seqs : m.knobs.max_batch_size);
    l.y.push_back(m.goodput_rps);
    l.invalid.push_back(!m.accepted);
  }
  std::vector<bench::ChartSeries> v;
  for (auto& [k, l] : lines) v.push_back(std::move(l));
  const std::string x = dec ? "max_num_seqs" : "max_batch_size";
  return "<h2>Grid</h2><div class=\"chart\">" +
         bench::LineChartSvg({.title = "goodput vs " + x + " (every combination)",
                              .x_label = x,
                              .y_label = "goodput (req/s)",
                              .log_x = true,
                              .width = 900,
                              .height = 400},
                             v) +
         "</div>";
}

}  // namespace

std::string TuneToml(const TuneOptions& o, const TuneResult& r) {
  std::string t = fmt::format(
      "# Written by stoke tune ({}) on {}: SLO {}, {}, workload {}.\n"
      "# Serve it with: stoke serve --config stoke.toml   (flags on the command line win)\n",
      r.mode, r.started_at, o.slos.Describe(), LoadText(o), o.workload.Describe());
  if (r.chosen_index >= 0) {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    t += fmt::format("# Chosen: {} -> goodput {:.1f} req/s, p99 {:.1f} ms (baseline goodput {:.1f} req/s).\n",
                     r.chosen.Describe(r.kind), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (!r.confirmation.verdict.empty()) t += "# Confirmation: " + r.confirmation.verdict + "\n";
  // A model path made absolute, so the file serves from any working directory.
  std::error_code ec;
  std::string model = o.model;
  if (std::filesystem::exists(model, ec)) model = std::filesystem::absolute(model, ec).string();
  t += "model = " + TomlString(model) + "\n";
  if (!o.device.empty()) t += "device = " + TomlString(o.device) + "\n";
  // The knobs as flags ("--max-num-seqs", "32", "--no-chunked-prefill", ...), written as TOML keys.
  std::set<std::string> written = {"model", "device"};
  const std::vector<std::string> flags = r.chosen.Flags(r.kind);
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string key = flags[i].substr(2);
    written.insert(key);
    if (i + 1 < flags.size() && flags[i + 1].rfind("--", 0) != 0) {
      const std::string& v = flags[++i];
      const bool number = v.find_first_not_of("0123456789") == std::string::npos;
      t += key + " = " + (number ? v : TomlString(v)) + "\n";
    } else {
      t += key + " = true\n";
    }
  }
  return t + ServeArgsToml(o.serve_args, &written);
}

nlohmann::json TuneJson(const TuneOptions& o, const TuneResult& r) {
  nlohmann::json j;
  j["schema"] = "stoke.tune.v2";
  j["mode"] = r.mode;
  j["kind"] = KindName(r.kind);
  j["model"] = r.model;
  j["url"] = r.url;
  j["served_name"] = r.served_name;
  j["device"] = r.device;
  j["started_at"] = r.started_at;
  j["slo"] = {{"p99_ms", o.slos.p99_ms}, {"ttft_p99_ms", o.slos.ttft_ms}, {"tpot_p99_ms", o.slos.tpot_ms}};
  j["slo_p99_ms"] = o.slos.p99_ms;
  j["load"] = {{"mode", o.mode == bench::LoadMode::kConcurrency ? "concurrency" : "rate"}, {"value", o.load}};
  j["workload"] = o.workload.Describe();
  j["point"] = {{"warmup_s", o.warmup_s}, {"window_s", o.window_s}, {"windows", o.windows}};
  j["serve_args"] = o.serve_args;
  j["budget_s"] = o.budget_s;
  j["budget_exhausted"] = r.budget_exhausted;
  j["min_gain"] = o.min_gain;
  j["baseline_knobs"] = KnobsJson(r.baseline_knobs, r.kind);
  j["measurements"] = nlohmann::json::array();
  for (const Measurement& m : r.measurements) {
    j["measurements"].push_back({{"index", m.index},
                                 {"step", m.step},
                                 {"knobs", KnobsJson(m.knobs, r.kind)},
                                 {"ok", m.ok},
                                 {"error", m.error},
                                 {"requests_per_s", m.requests_per_s},
                                 {"goodput_rps", m.goodput_rps},
                                 {"p50_ms", m.p50_ms},
                                 {"p99_ms", m.p99_ms},
                                 {"ttft_p99_ms", m.ttft_p99_ms},
                                 {"tpot_p99_ms", m.tpot_p99_ms},
                                 {"output_tokens_per_s", m.output_tokens_per_s},
                                 {"mean_input_tokens", m.mean_input_tokens},
                                 {"succeeded", m.succeeded},
                                 {"errors", m.errors},
                                 {"valid", m.valid},
                                 {"accepted", m.accepted},
                                 {"why", m.why},
                                 {"warmup_s", m.warmup_s},
                                 {"measured_s", m.measured_s},
                                 {"elapsed_s", m.elapsed_s},
                                 {"generator_cpu_percent", m.generator_cpu_percent},
                                 {"doctor", m.doctor}});
  }
  j["steps"] = nlohmann::json::array();
  for (const StepReport& s : r.steps) {
    nlohmann::json d = s.doctor;
    j["steps"].push_back(
        {{"knob", s.knob},
         {"points", s.points},
         {"skipped", s.skipped},
         {"stopped", s.stopped},
         {"doctor_point", s.from_point},
         {"doctor", s.doctor},
         {"doctor_verdict", d.is_array() && !d.empty() ? d[0].value("bottleneck", "") : ""},
         {"doctor_reason", d.is_array() && !d.empty() ? d[0].value("summary", "") : VerdictText(d)},
         {"doctor_note", s.doctor_note},
         {"best", KnobsJson(s.best, r.kind)}});
  }
  j["doctor"] = r.doctor;
  j["chosen"] = KnobsJson(r.chosen, r.kind);
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
  if (r.mode == "url")
    j["advice"] = {
        {"step", r.advice.step},
        {"flag", r.advice.flag},
        {"why", r.advice.why},
        {"note", "the walk needs servers stoke tune starts itself: run it with --model (no --url)"}};
  j["measurement_count"] = r.measurements.size();
  j["measuring_s"] = r.measuring_s;
  return j;
}

std::string TuneText(const TuneOptions& o, const TuneResult& r) {
  std::string t =
      fmt::format("stoke tune ({}, {} model): {} measurements, {:.1f} s measuring, SLO {}\n", r.mode,
                  KindName(r.kind), r.measurements.size(), r.measuring_s, o.slos.Describe());
  if (!VerdictText(r.doctor).empty()) t += "  doctor on the baseline: " + VerdictText(r.doctor) + "\n";
  for (const StepReport& s : r.steps) {
    t += fmt::format("  {:<24} {}{}\n", s.knob, s.skipped ? "skipped: " : "", s.stopped);
    if (!s.doctor_note.empty()) t += fmt::format("  {:<24} doctor: {}\n", "", s.doctor_note);
  }
  if (r.chosen_index >= 0 && r.mode != "url") {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    t += fmt::format("  chosen: {} (goodput {:.1f} req/s, p99 {:.1f} ms; baseline {:.1f} req/s)\n",
                     r.chosen.Describe(r.kind), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (r.mode == "url") {
    t += r.advice.flag.empty() ? "  next: nothing the walk could try (see the steps above)\n"
                               : fmt::format("  next: try {} ({})\n", r.advice.flag, r.advice.why);
    t += "  (--url measures a server as it is; the walk needs servers stoke tune starts itself: run it with "
         "--model and no --url)\n";
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
      ".doctor{color:#335}.chart{margin:0.5em 0}</style></head><body>";
  h += fmt::format(
      "<h1>stoke tune: {}</h1><p>{} mode, {} model, started {}; SLO {}; {}; workload {}; {} measurements, "
      "{:.1f} s of measuring time.</p>",
      XmlEscape(r.model.empty() ? r.url : r.model), r.mode, KindName(r.kind), XmlEscape(r.started_at),
      XmlEscape(o.slos.Describe()), LoadText(o), XmlEscape(o.workload.Describe()), r.measurements.size(),
      r.measuring_s);
  if (r.chosen_index >= 0 && r.mode != "url") {
    const Measurement& m = r.measurements[static_cast<size_t>(r.chosen_index)];
    h += fmt::format(
        "<p id=\"chosen\"><b>Chosen:</b> {} &mdash; goodput {:.1f} req/s, p99 {:.1f} ms (baseline {:.1f} "
        "req/s).</p>",
        XmlEscape(r.chosen.Describe(r.kind)), m.goodput_rps, m.p99_ms, r.measurements[0].goodput_rps);
  }
  if (r.mode == "url")
    h += "<p id=\"advice\"><b>Next:</b> " +
         XmlEscape(r.advice.flag.empty() ? "nothing the walk could try"
                                         : "try " + r.advice.flag + " (" + r.advice.why + ")") +
         ". --url measures a server as it is: the walk needs servers stoke tune starts itself (run it with "
         "--model and no --url).</p>";
  if (!r.confirmation.verdict.empty())
    h += "<p id=\"confirmation\"><b>Confirmation:</b> " + XmlEscape(r.confirmation.verdict) + "</p>";
  if (!VerdictText(r.doctor).empty())
    h += "<p class=\"doctor\"><b>Doctor on the baseline:</b> " + XmlEscape(VerdictText(r.doctor)) + "</p>";
  h += "<h2>Steps</h2>";
  for (const StepReport& s : r.steps) {
    h += fmt::format("<h3 class=\"step\">{}</h3>", XmlEscape(s.knob));
    if (!VerdictText(s.doctor).empty())
      h += fmt::format("<p class=\"doctor\">Doctor before this step (point #{}): {}</p>", s.from_point,
                       XmlEscape(VerdictText(s.doctor)));
    if (!s.doctor_note.empty()) h += "<p class=\"doctor\">" + XmlEscape(s.doctor_note) + "</p>";
    h +=
        fmt::format("<p class=\"why\">{}{}</p>", s.skipped ? "Skipped: " : "Stopped: ", XmlEscape(s.stopped));
    if (!s.points.empty()) h += StepCharts(o, r, s);
  }
  if (r.mode == "grid") h += GridChart(r);
  h += "<h2>Every measurement</h2><table><tr><th>#</th><th class=\"l\">step</th><th class=\"l\">knobs</th>"
       "<th>req/s</th><th>p50 ms</th><th>p99 ms</th>";
  if (r.kind == ModelKind::kDecoder) h += "<th>TTFT p99 ms</th><th>TPOT p99 ms</th><th>out tok/s</th>";
  h += "<th>goodput/s</th><th class=\"l\">verdict</th><th class=\"l\">doctor</th></tr>";
  for (const Measurement& m : r.measurements) {
    h += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1f}</td>"
        "<td>{:.1f}</td><td>{:.1f}</td>",
        m.index == r.chosen_index ? "chosen" : (m.accepted ? "" : "rej"), m.index, XmlEscape(m.step),
        XmlEscape(m.knobs.Describe(r.kind)), m.requests_per_s, m.p50_ms, m.p99_ms);
    if (r.kind == ModelKind::kDecoder)
      h += fmt::format("<td>{:.1f}</td><td>{:.2f}</td><td>{:.1f}</td>", m.ttft_p99_ms, m.tpot_p99_ms,
                       m.output_tokens_per_s);
    const std::string d = m.doctor.is_array() && !m.doctor.empty() ? m.doctor[0].value("bottleneck", "") : "";
    h += fmt::format("<td>{:.1f}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>", m.goodput_rps,
                     m.accepted ? "accepted" : XmlEscape("rejected: " + m.why), XmlEscape(d));
  }
  h += "</table></body></html>\n";
  return h;
}

}  // namespace stoke::tune
