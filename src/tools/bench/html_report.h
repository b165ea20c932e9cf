// The self-contained HTML report: one file with inline CSS and inline SVG charts (no JavaScript, nothing
// fetched), so it can be committed, mailed and opened anywhere.
//
// Sections: the run (command, commit, machine, date), the summary table (invalid points in red with the
// reason), throughput vs load, latency percentiles vs load, TTFT/ITL/latency distributions (CDFs, one curve
// per point), the server's metrics over time with the points shaded, and the generator's own health.
#pragma once

#include <string>

#include "tools/bench/bench_types.h"

namespace stoke::bench {

std::string RenderHtmlReport(const BenchReport& report);

}  // namespace stoke::bench
