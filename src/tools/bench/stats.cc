#include "tools/bench/stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <ctime>

namespace stoke::bench {

double PercentileSorted(std::span<const double> sorted, double pct) {
  if (sorted.empty()) return 0;
  double rank = pct / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary Summarize(std::vector<double>& values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / values.size();
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.stddev = values.size() > 1 ? std::sqrt(sq / (values.size() - 1)) : 0;
  s.min = values.front();
  s.max = values.back();
  s.p50 = PercentileSorted(values, 50);
  s.p90 = PercentileSorted(values, 90);
  s.p95 = PercentileSorted(values, 95);
  s.p99 = PercentileSorted(values, 99);
  return s;
}

Histogram LogHistogram(const std::vector<double>& values, int bins_per_decade) {
  Histogram h;
  double lo = INFINITY, hi = 0;
  for (double v : values) {
    if (v > 0) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (hi <= 0) return h;
  double l0 = std::floor(std::log10(lo) * bins_per_decade) / bins_per_decade;
  double l1 = std::ceil(std::log10(hi) * bins_per_decade) / bins_per_decade;
  if (l1 <= l0) l1 = l0 + 1.0 / bins_per_decade;
  int bins = std::max(1, static_cast<int>(std::lround((l1 - l0) * bins_per_decade)));
  for (int i = 0; i <= bins; ++i)
    h.edges.push_back(std::pow(10.0, l0 + static_cast<double>(i) / bins_per_decade));
  h.counts.assign(bins, 0);
  for (double v : values) {
    if (v <= 0) continue;
    int b = static_cast<int>(std::floor((std::log10(v) - l0) * bins_per_decade));
    h.counts[std::clamp(b, 0, bins - 1)]++;
  }
  return h;
}

bool WindowsStable(const std::vector<WindowStats>& windows, int count, double tolerance) {
  if (count <= 0 || static_cast<int>(windows.size()) < count) return false;
  double tmin = INFINITY, tmax = 0, lmin = INFINITY, lmax = 0;
  for (size_t i = windows.size() - count; i < windows.size(); ++i) {
    const WindowStats& w = windows[i];
    if (w.completed == 0) return false;
    tmin = std::min(tmin, w.requests_per_s);
    tmax = std::max(tmax, w.requests_per_s);
    lmin = std::min(lmin, w.p99_ms);
    lmax = std::max(lmax, w.p99_ms);
  }
  return tmin > 0 && lmin > 0 && tmax / tmin <= 1 + tolerance && lmax / lmin <= 1 + tolerance;
}

double RelativeSpread(const std::vector<double>& values) {
  if (values.size() < 2) return 0;
  double mean = 0;
  for (double v : values) mean += v;
  mean /= values.size();
  if (mean == 0) return 0;
  double sq = 0;
  for (double v : values) sq += (v - mean) * (v - mean);
  return std::sqrt(sq / (values.size() - 1)) / std::fabs(mean);
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace stoke::bench
