// stoke bench compare A.json B.json: for each load point present in both runs, the ratio B / A of the
// headline numbers with its spread, taken from the window-to-window variation inside each run: each run's
// relative standard error is (stddev / mean of its windows) / sqrt(windows), and the ratio's relative spread
// is the root sum of squares of the two. A change smaller than twice its spread is called noise.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/bench_types.h"

namespace stoke::bench {

struct CompareRow {
  LoadMode mode = LoadMode::kConcurrency;
  double load = 0;
  std::string metric;  // "requests_per_s", "latency_p99_ms", ...
  bool higher_is_better = true;
  double a = 0, b = 0;
  double ratio = 0;   // b / a (NaN when a == 0)
  double spread = 0;  // absolute spread of the ratio (one standard error)
  bool significant = false;
  bool a_valid = true, b_valid = true;
};

struct Comparison {
  std::vector<CompareRow> rows;
  std::vector<std::string> unmatched;  // "A only: c=8", ...
};

Comparison CompareReports(const BenchReport& a, const BenchReport& b);
std::string ComparisonTable(const Comparison& c, const std::string& a_name, const std::string& b_name);
nlohmann::json ComparisonJson(const Comparison& c, const std::string& a_name, const std::string& b_name);

}  // namespace stoke::bench
