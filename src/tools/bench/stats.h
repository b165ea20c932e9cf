// Small statistics used by the bench: percentiles, log-binned histograms, the window stability test and the
// generator's own CPU time.
#pragma once

#include <span>
#include <vector>

#include "tools/bench/bench_types.h"

namespace stoke::bench {

// Percentile by linear interpolation between closest ranks (numpy's default); `sorted` ascending, non-empty.
double PercentileSorted(std::span<const double> sorted, double pct);

// count/mean/stddev/min/max/p50/p90/p95/p99. Sorts `values` in place. Empty -> all zeros.
Summary Summarize(std::vector<double>& values);

// Log-spaced bins covering [min, max] of the positive values (about `bins_per_decade` bins a decade).
Histogram LogHistogram(const std::vector<double>& values, int bins_per_decade = 20);

// perf_analyzer's criterion: the last `count` windows each completed something, and both their throughput
// and their p99 latency have max/min <= 1 + tolerance.
bool WindowsStable(const std::vector<WindowStats>& windows, int count, double tolerance);

// Relative spread (stddev / mean) of a window quantity; 0 with fewer than two windows.
double RelativeSpread(const std::vector<double>& values);

// CPU seconds used by the calling thread so far.
double ThreadCpuSeconds();

}  // namespace stoke::bench
