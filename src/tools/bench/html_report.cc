#include "tools/bench/html_report.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "tools/bench/report.h"
#include "tools/bench/svg_chart.h"

namespace stoke::bench {
namespace {

constexpr const char* kCss = R"(
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       background: #fafafa; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 12px; background: #fff; }
td, th { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
tr.invalid td { background: #fde8e8; color: #900; }
.meta td { text-align: left; } .meta td:first-child { font-weight: bold; color: #555; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts svg { border: 1px solid #ddd; background: #fff; }
.note { color: #666; font-size: 12px; } .bad { color: #b00; font-weight: bold; }
code { background: #eee; padding: 1px 4px; }
)";

std::string H(const std::string& s) {
  return XmlEscape(s);
}

std::string Cell(double v, int digits = 2) {
  if (std::isnan(v)) return "<td>-</td>";
  return fmt::format("<td>{:.{}f}</td>", v, digits);
}

std::string RunSection(const BenchReport& rep) {
  const RunInfo& r = rep.run;
  std::string slo = "none";
  if (r.slo.any()) {
    slo.clear();
    if (r.slo.ttft_ms > 0) slo += fmt::format("TTFT ≤ {} ms ", r.slo.ttft_ms);
    if (r.slo.tpot_ms > 0) slo += fmt::format("TPOT ≤ {} ms ", r.slo.tpot_ms);
    if (r.slo.e2e_ms > 0) slo += fmt::format("e2e ≤ {} ms", r.slo.e2e_ms);
  }
  std::string rows;
  auto row = [&](const char* k, const std::string& v) {
    rows += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", k, v);
  };
  row("command", "<code>" + H(r.command) + "</code>");
  row("server", H(r.url) + " &middot; model " + H(r.model) + " &middot; " + ApiName(r.api) +
                    (ApiStreamsTokens(r.api) ? (r.stream ? " (streaming)" : " (not streaming)") : ""));
  row("load", fmt::format("{}{}", LoadModeName(r.mode),
                          r.mode == LoadMode::kRate ? std::string(", ") + ArrivalName(r.arrival) + " arrivals"
                                                    : std::string(" (closed loop)")));
  row("workload", H(r.workload));
  row("measurement",
      r.stability > 0
          ? fmt::format(
                "warm-up {} s, windows of {} s, stable when the last 3 agree within {:.0f}% (throughput "
                "and p99), at most {} s per point",
                r.warmup_s, r.window_s, 100 * r.stability, r.max_duration_s)
          : fmt::format("warm-up {} s, then {} s in windows of {} s (fixed duration)", r.warmup_s,
                        r.max_duration_s, r.window_s));
  if (r.ramp_up_s > 0)
    row("ramp-up", H(fmt::format("clients started over the first {} s of the warm-up", r.ramp_up_s)));
  row("SLOs", H(slo));
  row("started", H(r.started_at));
  row("commit", H(r.git_commit.empty() ? "unknown" : r.git_commit));
  row("machine", H(r.host));
  if (!r.label.empty()) row("label", H(r.label));
  return "<table class=\"meta\">\n" + rows + "</table>\n";
}

std::string SummaryTable(const BenchReport& rep) {
  const bool tokens = ApiStreamsTokens(rep.run.api) && rep.run.stream;
  std::string s =
      "<table>\n<tr><th class=\"l\">load</th><th>req/s</th><th>in tok/s</th><th>out tok/s</th>"
      "<th>p50 ms</th><th>p90 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th>";
  if (tokens)
    s += "<th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>ITL p50</th><th>ITL "
         "p99</th>";
  s += "<th>goodput req/s</th><th>good %</th><th>sent</th><th>errors</th><th class=\"l\">notes</th></tr>\n";
  for (const PointResult& p : rep.points) {
    std::string errors;
    for (const auto& [k, n] : p.errors) errors += fmt::format("{}{}: {}", errors.empty() ? "" : ", ", k, n);
    std::string notes;
    if (!p.valid) {
      notes = "<span class=\"bad\">INVALID</span>";
      for (const auto& r : p.invalid_reasons) notes += " " + H(r) + ";";
    } else if (!p.stable && rep.run.stability > 0) {
      notes = "not stable within the time limit";
    }
    s += fmt::format("<tr{}><td class=\"l\">{}</td>", p.valid ? "" : " class=\"invalid\"",
                     H(LoadLabel(p.mode, p.load)));
    s += Cell(p.requests_per_s, 3) + Cell(p.input_tokens_per_s, 1) + Cell(p.output_tokens_per_s, 1);
    s += Cell(p.latency_ms.p50) + Cell(p.latency_ms.p90) + Cell(p.latency_ms.p95) + Cell(p.latency_ms.p99) +
         Cell(p.latency_ms.max);
    if (tokens) {
      s += Cell(p.ttft_ms.p50) + Cell(p.ttft_ms.p99) + Cell(p.tpot_ms.p50) + Cell(p.tpot_ms.p99) +
           Cell(p.itl_ms.p50) + Cell(p.itl_ms.p99);
    }
    s += Cell(p.goodput_rps, 3) + Cell(100 * p.goodput_fraction, 1) + fmt::format("<td>{}</td>", p.sent);
    s += fmt::format("<td class=\"l\">{}</td><td class=\"l\">{}</td></tr>\n", H(errors), notes);
  }
  return s + "</table>\n";
}

std::string GeneratorTable(const BenchReport& rep) {
  std::string s =
      "<table>\n<tr><th class=\"l\">load</th><th>send lag p50 ms</th><th>p99 ms</th><th>max ms</th>"
      "<th>late sends</th><th>dropped</th><th>generator CPU %</th><th>windows</th><th>stable</th></tr>\n";
  for (const PointResult& p : rep.points) {
    const GeneratorHealth& g = p.generator;
    s += fmt::format("<tr{}><td class=\"l\">{}</td>", p.valid ? "" : " class=\"invalid\"",
                     H(LoadLabel(p.mode, p.load)));
    s += Cell(g.send_lag_ms.p50, 3) + Cell(g.send_lag_ms.p99, 3) + Cell(g.send_lag_ms.max, 3);
    s += fmt::format("<td>{} (&gt; {} ms)</td><td>{}</td>", g.late_sends, g.late_threshold_ms,
                     g.dropped_sends);
    s += Cell(g.cpu_percent, 1) + fmt::format("<td>{}</td><td>{}</td></tr>\n", p.windows.size(),
                                              rep.run.stability <= 0 ? "-"
                                              : p.stable             ? "yes"
                                                                     : "no");
  }
  return s + "</table>\n";
}

// x values and axis style for "metric vs load" charts.
struct LoadAxis {
  std::vector<double> x;
  std::vector<bool> invalid;
  bool log = false;
  std::string label;
};

LoadAxis MakeLoadAxis(const BenchReport& rep) {
  LoadAxis a;
  for (const PointResult& p : rep.points) {
    a.x.push_back(p.load);
    a.invalid.push_back(!p.valid);
  }
  double lo = INFINITY, hi = 0;
  for (double v : a.x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  a.log = a.x.size() >= 3 && lo > 0 && hi / lo >= 8;  // sweeps like 1, 2, 4, ..., 256
  a.label = rep.run.mode == LoadMode::kConcurrency ? "concurrency (clients)" : "offered load (requests/s)";
  return a;
}

ChartSeries VsLoad(const LoadAxis& a, const std::string& name, const std::vector<double>& y,
                   bool dashed = false) {
  ChartSeries s;
  s.name = name;
  s.x = a.x;
  s.y = y;
  s.invalid = a.invalid;
  s.dashed = dashed;
  return s;
}

template <typename F>
std::vector<double> Collect(const BenchReport& rep, F f) {
  std::vector<double> v;
  for (const PointResult& p : rep.points) v.push_back(f(p));
  return v;
}

std::string LoadCharts(const BenchReport& rep) {
  const LoadAxis a = MakeLoadAxis(rep);
  const bool tokens = ApiStreamsTokens(rep.run.api) && rep.run.stream;
  std::string out = "<div class=\"charts\">\n";
  ChartOptions o;
  o.x_label = a.label;
  o.log_x = a.log;
  o.x_ticks = a.x;

  o.title = "Throughput vs load";
  o.y_label = "requests / s";
  std::vector<ChartSeries> tp{
      VsLoad(a, "achieved req/s", Collect(rep, [](auto& p) { return p.requests_per_s; }))};
  if (rep.run.slo.any()) {
    tp.push_back(
        VsLoad(a, "goodput req/s (meets SLOs)", Collect(rep, [](auto& p) { return p.goodput_rps; }), true));
  }
  if (rep.run.mode == LoadMode::kRate) tp.push_back(VsLoad(a, "offered req/s", a.x, true));
  out += LineChartSvg(o, tp);

  if (tokens) {
    o.title = "Token throughput vs load";
    o.y_label = "tokens / s";
    out += LineChartSvg(
        o, {VsLoad(a, "output tok/s", Collect(rep, [](auto& p) { return p.output_tokens_per_s; })),
            VsLoad(a, "input tok/s", Collect(rep, [](auto& p) { return p.input_tokens_per_s; }), true)});
  }
  o.title = "End-to-end latency vs load";
  o.y_label = "milliseconds";
  out += LineChartSvg(o, {VsLoad(a, "p50", Collect(rep, [](auto& p) { return p.latency_ms.p50; })),
                          VsLoad(a, "p90", Collect(rep, [](auto& p) { return p.latency_ms.p90; })),
                          VsLoad(a, "p99", Collect(rep, [](auto& p) { return p.latency_ms.p99; }))});
  if (tokens) {
    o.title = "Time to first token vs load";
    out += LineChartSvg(o, {VsLoad(a, "TTFT p50", Collect(rep, [](auto& p) { return p.ttft_ms.p50; })),
                            VsLoad(a, "TTFT p99", Collect(rep, [](auto& p) { return p.ttft_ms.p99; }))});
    o.title = "Per-token latency vs load";
    out += LineChartSvg(o, {VsLoad(a, "TPOT p50", Collect(rep, [](auto& p) { return p.tpot_ms.p50; })),
                            VsLoad(a, "TPOT p99", Collect(rep, [](auto& p) { return p.tpot_ms.p99; })),
                            VsLoad(a, "ITL p99", Collect(rep, [](auto& p) { return p.itl_ms.p99; }), true)});
  }
  return out + "</div>\n";
}

std::string DistributionCharts(const BenchReport& rep) {
  const bool tokens = ApiStreamsTokens(rep.run.api) && rep.run.stream;
  std::string out = "<div class=\"charts\">\n";
  auto cdf_chart = [&](const std::string& title, const Histogram PointResult::*hist) {
    std::vector<ChartSeries> s;
    for (const PointResult& p : rep.points) {
      const Histogram& h = p.*hist;
      ChartSeries c = CdfFromHistogram(LoadLabel(p.mode, p.load), h.edges, h.counts);
      if (!c.x.empty()) s.push_back(std::move(c));
    }
    ChartOptions o;
    o.title = title;
    o.x_label = "milliseconds (log scale)";
    o.y_label = "fraction of requests ≤ x";
    o.log_x = true;
    return LineChartSvg(o, s);
  };
  if (tokens) {
    out += cdf_chart("TTFT distribution (CDF)", &PointResult::ttft_hist);
    out += cdf_chart("Inter-token latency distribution (CDF)", &PointResult::itl_hist);
  }
  out += cdf_chart("End-to-end latency distribution (CDF)", &PointResult::latency_hist);
  return out + "</div>\n";
}

std::string ServerCharts(const BenchReport& rep) {
  const ServerSeries& s = rep.server;
  if (!s.available || s.t_s.empty()) {
    return fmt::format("<p class=\"note\">The server's metrics were not scraped{}.</p>\n",
                       s.note.empty() ? "" : " (" + H(s.note) + ")");
  }
  std::vector<ChartBand> bands;
  for (const PointResult& p : rep.points)
    bands.push_back({p.t_start_s, p.t_end_s, LoadLabel(p.mode, p.load)});
  auto chart = [&](const std::string& title, const std::string& y_label, const std::vector<std::string>& keys,
                   const std::vector<std::string>& names) {
    std::vector<ChartSeries> series;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = s.series.find(keys[i]);
      if (it == s.series.end()) continue;
      ChartSeries c;
      c.name = names[i];
      c.x = s.t_s;
      c.y = it->second;
      c.markers = false;
      series.push_back(std::move(c));
    }
    if (series.empty()) return std::string();
    ChartOptions o;
    o.title = title;
    o.x_label = "seconds since the run started";
    o.y_label = y_label;
    o.bands = bands;
    o.width = 900;
    return LineChartSvg(o, series);
  };
  // Group the scraped keys: the known stoke/vLLM names, then stages, then GPU gauges.
  std::vector<std::string> running, waiting, kv, stage_keys, stage_names, rate_keys, rate_names, gpu, batch,
      step_keys, step_names;
  for (const auto& [k, v] : s.series) {
    if (k.starts_with("step_ms:")) {
      step_keys.push_back(k);
      step_names.push_back(k.substr(8));
    } else if (k.starts_with("stage_ms:")) {
      stage_keys.push_back(k);
      stage_names.push_back(k.substr(9));
    } else if (k.ends_with("_per_s")) {
      rate_keys.push_back(k);
      rate_names.push_back(k.substr(k.find(':') + 1));
    } else if (k.find("num_requests_running") != std::string::npos) {
      running.push_back(k);
    } else if (k.find("num_requests_waiting") != std::string::npos ||
               k.find("pending_request_count") != std::string::npos) {
      waiting.push_back(k);
    } else if (k == "mean_batch_size") {
      batch.push_back(k);
    } else if (k.find("cache_usage") != std::string::npos) {
      kv.push_back(k);
    } else if (k.find("gpu") != std::string::npos) {
      gpu.push_back(k);
    }
  }
  std::string out = "<div class=\"charts\">\n";
  std::vector<std::string> rw = running, rw_names;
  rw.insert(rw.end(), waiting.begin(), waiting.end());
  rw_names.insert(rw_names.end(), running.size(), "running");
  rw_names.insert(rw_names.end(), waiting.size(), "waiting");
  out += chart("Requests in the server", "requests", rw, rw_names);
  out += chart("KV cache usage", "fraction", kv, kv);
  out += chart("Mean batch size (dynamic batcher, each interval)", "requests per execution", batch,
               {"batch size"});
  out += chart("Mean time per request stage (each interval)", "milliseconds", stage_keys, stage_names);
  out += chart("Mean engine step time by part (each interval)", "milliseconds", step_keys, step_names);
  out += chart("Server token rates", "tokens / s", rate_keys, rate_names);
  // GPU telemetry: the GPM ratios together, PCIe together, clock event reasons together, the rest alone.
  std::vector<std::string> prof, pcie, reasons, other_gpu;
  for (const auto& k : gpu) {
    if (k.starts_with("DCGM_FI_PROF_PCIE_")) {
      pcie.push_back(k);
    } else if (k.starts_with("DCGM_FI_PROF_")) {
      prof.push_back(k);
    } else if (k.find("clocks_event_reason") != std::string::npos) {
      reasons.push_back(k);
    } else {
      other_gpu.push_back(k);
    }
  }
  auto short_names = [](const std::vector<std::string>& keys, const std::string& prefix) {
    std::vector<std::string> names;
    for (const auto& k : keys) names.push_back(k.starts_with(prefix) ? k.substr(prefix.size()) : k);
    return names;
  };
  out +=
      chart("GPU activity (GPM, ratio of the interval)", "ratio", prof, short_names(prof, "DCGM_FI_PROF_"));
  out += chart("GPU PCIe traffic (GPM)", "bytes / s", pcie, short_names(pcie, "DCGM_FI_PROF_"));
  out += chart("GPU clock event reasons (1 = active)", "active", reasons,
               short_names(reasons, "stoke_gpu_clocks_event_reason"));
  for (const auto& k : other_gpu) out += chart(k, "value", {k}, {k});
  return out + "</div>\n";
}

}  // namespace

std::string RenderHtmlReport(const BenchReport& rep) {
  std::string title =
      fmt::format("stoke bench: {} on {}", rep.run.model.empty() ? "?" : rep.run.model, rep.run.url);
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
      "charset=\"utf-8\">\n<title>{0}</title>\n<style>{1}</style>\n"
      "</head><body>\n<h1>{0}</h1>\n",
      H(title), kCss);
  int invalid = 0;
  for (const PointResult& p : rep.points) invalid += !p.valid;
  if (invalid > 0) {
    html += fmt::format(
        "<p class=\"bad\">{} of {} points are INVALID: the generator could not drive them as specified "
        "(see the notes). Their numbers are shown crossed out in the charts and must not be quoted.</p>\n",
        invalid, rep.points.size());
  }
  html += RunSection(rep);
  html += "<h2>Summary</h2>\n" + SummaryTable(rep);
  html +=
      "<p class=\"note\">Latencies are measured from the scheduled send time (open loop) or the send time "
      "(closed loop) to the last byte; TTFT to the first streamed token; TPOT = (last token − first token) "
      "/ (tokens − 1); ITL = gaps between streamed chunks as they reached the client.</p>\n";
  html += "<h2>Load</h2>\n" + LoadCharts(rep);
  html += "<h2>Distributions</h2>\n" + DistributionCharts(rep);
  html += "<h2>Server metrics over time</h2>\n" + ServerCharts(rep);
  html += "<h2>Generator health</h2>\n" + GeneratorTable(rep);
  html +=
      "<p class=\"note\">A point is invalid when the generator's p99 send lag exceeds its limit, a scheduled "
      "request could not be sent, its thread ran out of CPU, or no request succeeded.</p>\n";
  html += "</body></html>\n";
  return html;
}

}  // namespace stoke::bench
