#include "tools/bench/report.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tools/bench/compare.h"
#include "tools/bench/html_report.h"
#include "tools/bench/svg_chart.h"

namespace stoke::bench {
namespace {

PointResult Point(double load, double rps, double p99, std::vector<double> window_rps, bool valid = true) {
  PointResult p;
  p.load = load;
  p.requests_per_s = rps;
  p.output_tokens_per_s = rps * 100;
  p.latency_ms.p50 = p99 / 2;
  p.latency_ms.p99 = p99;
  p.ttft_ms.p50 = 12;
  p.ttft_ms.p99 = 20;
  p.valid = valid;
  if (!valid) p.invalid_reasons = {"send lag p99 50 ms > 10 ms"};
  p.stable = true;
  p.sent = 100;
  p.succeeded = 99;
  p.errors["http_503"] = 1;
  p.ttft_hist = {{1, 10, 100}, {3, 4}};
  p.itl_hist = {{1, 2}, {7}};
  p.latency_hist = {{10, 100, 1000}, {50, 49}};
  for (double r : window_rps) {
    WindowStats w;
    w.completed = 10;
    w.requests_per_s = r;
    w.output_tokens_per_s = r * 100;
    w.p50_ms = p99 / 2;
    w.p99_ms = p99;
    p.windows.push_back(w);
  }
  return p;
}

BenchReport Sample() {
  BenchReport r;
  r.run.command = "stoke bench --url http://x";
  r.run.url = "http://127.0.0.1:1";
  r.run.model = "m<1>";
  r.run.api = Api::kOpenAiCompletions;
  r.run.slo.ttft_ms = 100;
  r.run.stability = 0.1;
  r.points = {Point(1, 10, 50, {9.9, 10, 10.1}), Point(4, 30, 80, {29, 30, 31}),
              Point(16, 35, 400, {30, 35, 40}, /*valid=*/false)};
  r.server.available = true;
  r.server.t_s = {0, 1, 2};
  r.server.series["stoke:num_requests_running"] = {0, 4, NAN};
  r.server.series["stage_ms:queue"] = {NAN, 3, 4};
  r.points[0].t_start_s = 0;
  r.points[0].t_end_s = 1;
  return r;
}

TEST(Report, JsonRoundTrips) {
  BenchReport a = Sample();
  auto b = ReportFromJson(nlohmann::json::parse(ReportToJson(a).dump()));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->points.size(), 3u);
  EXPECT_EQ(b->run.api, Api::kOpenAiCompletions);
  EXPECT_EQ(b->run.model, "m<1>");
  EXPECT_DOUBLE_EQ(b->run.slo.ttft_ms, 100);
  EXPECT_DOUBLE_EQ(b->points[1].latency_ms.p99, 80);
  EXPECT_EQ(b->points[2].valid, false);
  EXPECT_EQ(b->points[2].invalid_reasons.size(), 1u);
  EXPECT_EQ(b->points[0].errors.at("http_503"), 1);
  EXPECT_EQ(b->points[0].windows.size(), 3u);
  EXPECT_EQ(b->points[0].ttft_hist.counts, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(std::isnan(b->server.series["stoke:num_requests_running"][2]));
  EXPECT_FALSE(ReportFromJson(nlohmann::json::parse(R"({"schema": "other"})")).ok());
}

TEST(Report, CsvAndTable) {
  BenchReport r = Sample();
  std::string csv = ReportCsv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);
  EXPECT_NE(csv.find("send lag p99 50 ms > 10 ms"), std::string::npos);
  std::string table = ReportTable(r);
  EXPECT_NE(table.find("INVALID"), std::string::npos);
  EXPECT_NE(table.find("TTFT p99"), std::string::npos);
  EXPECT_NE(table.find("c=16"), std::string::npos);
}

TEST(Report, HtmlIsSelfContainedWithCharts) {
  std::string html = RenderHtmlReport(Sample());
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://www.w3.org/1999/xhtml"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  // Throughput, tokens, latency, TTFT, TPOT; TTFT, ITL, latency CDFs; running and stage charts.
  EXPECT_GE(svgs, 10u);
  EXPECT_NE(html.find("m&lt;1&gt;"), std::string::npos);  // escaped
  EXPECT_NE(html.find("INVALID"), std::string::npos);
  EXPECT_NE(html.find("class=\"series\""), std::string::npos);
}

TEST(SvgChart, MapsPointsInsideThePlotAndMarksInvalidOnes) {
  ChartOptions o;
  o.title = "t";
  ChartSeries s;
  s.name = "a";
  s.x = {1, 2, 4};
  s.y = {10, 20, NAN};
  s.invalid = {false, true, false};
  std::string svg = LineChartSvg(o, {s});
  EXPECT_NE(svg.find("<path class=\"series\" d=\"M"), std::string::npos);
  EXPECT_NE(svg.find("invalid point"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  ChartSeries cdf = CdfFromHistogram("c", {1, 10, 100}, {1, 3});
  EXPECT_EQ(cdf.y, (std::vector<double>{0, 0.25, 1}));
}

TEST(Compare, RatiosWithSpreadAndNoise) {
  BenchReport a = Sample(), b = Sample();
  b.points[1].requests_per_s = 60;  // 2x at c=4, windows tight: significant
  for (auto& w : b.points[1].windows) w.requests_per_s *= 2;
  b.points[0].requests_per_s = 10.05;  // +0.5% at c=1: noise
  b.points.pop_back();
  b.points.push_back(Point(32, 1, 1, {1, 1, 1}));
  Comparison c = CompareReports(a, b);
  auto find = [&](double load, const char* metric) -> const CompareRow* {
    for (const auto& r : c.rows) {
      if (r.load == load && r.metric == metric) return &r;
    }
    return nullptr;
  };
  const CompareRow* r4 = find(4, "requests_per_s");
  ASSERT_NE(r4, nullptr);
  EXPECT_DOUBLE_EQ(r4->ratio, 2);
  EXPECT_GT(r4->spread, 0);
  EXPECT_TRUE(r4->significant);
  const CompareRow* r1 = find(1, "requests_per_s");
  ASSERT_NE(r1, nullptr);
  EXPECT_FALSE(r1->significant);
  EXPECT_EQ(c.unmatched.size(), 2u);  // c=16 only in A, c=32 only in B
  std::string table = ComparisonTable(c, "A.json", "B.json");
  EXPECT_NE(table.find("better (+100.0%)"), std::string::npos) << table;
  EXPECT_NE(table.find("within noise"), std::string::npos);
}

}  // namespace
}  // namespace stoke::bench
