// The run's outputs besides the HTML: JSON (the full report, readable back for `compare` and re-rendering),
// CSV (one row per point), the terminal table, and the progress line on stderr.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/load_generator.h"

namespace stoke::bench {

nlohmann::json ReportToJson(const BenchReport& report);
StatusOr<BenchReport> ReportFromJson(const nlohmann::json& j);
StatusOr<BenchReport> ReadReportFile(const std::string& path);

std::string ReportCsv(const BenchReport& report);
// The summary table (fixed-width, one row per point; invalid points say why).
std::string ReportTable(const BenchReport& report);

// Writes bench.json, bench.csv and report.html into `dir` (created if missing).
Status WriteReportFiles(const BenchReport& report, const std::string& dir);

const char* LoadModeName(LoadMode m);            // "concurrency" | "rate"
const char* ArrivalName(Arrival a);              // "poisson" | "constant"
std::string LoadLabel(LoadMode m, double load);  // "c=4" | "5 req/s"

// Progress on stderr: a redrawn bar on a terminal, one line per window otherwise.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(FILE* out, bool quiet = false);
  void BeginPoint(int index, int total, const std::string& label);
  void OnEvent(const ProgressEvent& e);

 private:
  FILE* out_;
  bool tty_;
  bool quiet_;
  std::string prefix_;
};

}  // namespace stoke::bench
