#include "tools/bench/compare.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "tools/bench/report.h"
#include "tools/bench/stats.h"

namespace stoke::bench {
namespace {

struct Metric {
  const char* name;
  bool higher_is_better;
  bool tokens_only;
  std::function<double(const PointResult&)> value;
  std::function<double(const WindowStats&)> window;
};

const std::vector<Metric>& Metrics() {
  static const std::vector<Metric> kMetrics = {
      {"requests_per_s", true, false, [](const PointResult& p) { return p.requests_per_s; },
       [](const WindowStats& w) { return w.requests_per_s; }},
      {"output_tokens_per_s", true, true, [](const PointResult& p) { return p.output_tokens_per_s; },
       [](const WindowStats& w) { return w.output_tokens_per_s; }},
      {"latency_p50_ms", false, false, [](const PointResult& p) { return p.latency_ms.p50; },
       [](const WindowStats& w) { return w.p50_ms; }},
      {"latency_p99_ms", false, false, [](const PointResult& p) { return p.latency_ms.p99; },
       [](const WindowStats& w) { return w.p99_ms; }},
      {"ttft_p50_ms", false, true, [](const PointResult& p) { return p.ttft_ms.p50; },
       [](const WindowStats& w) { return w.ttft_p50_ms; }},
      {"ttft_p99_ms", false, true, [](const PointResult& p) { return p.ttft_ms.p99; },
       [](const WindowStats& w) { return w.ttft_p99_ms; }},
      {"tpot_p50_ms", false, true, [](const PointResult& p) { return p.tpot_ms.p50; },
       [](const WindowStats& w) { return w.tpot_p50_ms; }},
  };
  return kMetrics;
}

// Relative standard error of a point's value, from its windows.
double RelativeError(const PointResult& p, const std::function<double(const WindowStats&)>& f) {
  std::vector<double> v;
  for (const WindowStats& w : p.windows) {
    if (w.completed > 0) v.push_back(f(w));
  }
  if (v.size() < 2) return 0;
  return RelativeSpread(v) / std::sqrt(static_cast<double>(v.size()));
}

}  // namespace

Comparison CompareReports(const BenchReport& a, const BenchReport& b) {
  Comparison c;
  const bool tokens =
      ApiStreamsTokens(a.run.api) && a.run.stream && ApiStreamsTokens(b.run.api) && b.run.stream;
  for (const PointResult& pa : a.points) {
    const PointResult* pb = nullptr;
    for (const PointResult& q : b.points) {
      if (q.mode == pa.mode && std::fabs(q.load - pa.load) <= 1e-9 * std::max(1.0, pa.load)) pb = &q;
    }
    if (pb == nullptr) {
      c.unmatched.push_back("A only: " + LoadLabel(pa.mode, pa.load));
      continue;
    }
    for (const Metric& m : Metrics()) {
      if (m.tokens_only && !tokens) continue;
      CompareRow row;
      row.mode = pa.mode;
      row.load = pa.load;
      row.metric = m.name;
      row.higher_is_better = m.higher_is_better;
      row.a = m.value(pa);
      row.b = m.value(*pb);
      row.a_valid = pa.valid;
      row.b_valid = pb->valid;
      row.ratio = row.a != 0 ? row.b / row.a : NAN;
      double ea = RelativeError(pa, m.window), eb = RelativeError(*pb, m.window);
      row.spread = std::isnan(row.ratio) ? NAN : std::fabs(row.ratio) * std::sqrt(ea * ea + eb * eb);
      row.significant = !std::isnan(row.ratio) && std::fabs(row.ratio - 1) > 2 * row.spread;
      c.rows.push_back(row);
    }
  }
  for (const PointResult& pb : b.points) {
    bool found = false;
    for (const PointResult& q : a.points) {
      found |= q.mode == pb.mode && std::fabs(q.load - pb.load) <= 1e-9 * std::max(1.0, pb.load);
    }
    if (!found) c.unmatched.push_back("B only: " + LoadLabel(pb.mode, pb.load));
  }
  return c;
}

std::string ComparisonTable(const Comparison& c, const std::string& a_name, const std::string& b_name) {
  std::string out = fmt::format("A = {}\nB = {}\n", a_name, b_name);
  out += fmt::format("{:>12} {:<20} {:>12} {:>12} {:>8} {:>8}  {}\n", "load", "metric", "A", "B", "B/A", "±",
                     "verdict");
  for (const CompareRow& r : c.rows) {
    std::string verdict;
    if (!r.a_valid || !r.b_valid) {
      verdict = "invalid point (not comparable)";
    } else if (std::isnan(r.ratio)) {
      verdict = "-";
    } else if (!r.significant) {
      verdict = "within noise";
    } else {
      bool better = (r.ratio > 1) == r.higher_is_better;
      verdict = fmt::format("{} ({:+.1f}%)", better ? "better" : "worse", 100 * (r.ratio - 1));
    }
    out += fmt::format("{:>12} {:<20} {:>12.3f} {:>12.3f} {:>8.3f} {:>8.3f}  {}\n", LoadLabel(r.mode, r.load),
                       r.metric, r.a, r.b, r.ratio, r.spread, verdict);
  }
  for (const std::string& u : c.unmatched) out += u + "\n";
  return out;
}

nlohmann::json ComparisonJson(const Comparison& c, const std::string& a_name, const std::string& b_name) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CompareRow& r : c.rows) {
    rows.push_back({{"mode", LoadModeName(r.mode)},
                    {"load", r.load},
                    {"metric", r.metric},
                    {"higher_is_better", r.higher_is_better},
                    {"a", r.a},
                    {"b", r.b},
                    {"ratio", r.ratio},
                    {"spread", r.spread},
                    {"significant", r.significant},
                    {"a_valid", r.a_valid},
                    {"b_valid", r.b_valid}});
  }
  return {{"a", a_name}, {"b", b_name}, {"rows", rows}, {"unmatched", c.unmatched}};
}

}  // namespace stoke::bench
