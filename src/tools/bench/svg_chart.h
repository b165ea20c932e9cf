// Inline SVG line charts for the HTML report: no JavaScript, no external files, readable in any browser and
// in a screenshot. Linear or log axes with "nice" ticks, a legend, optional shaded x-ranges (the load points
// on the server-metrics charts) and crossed-out markers for points the generator marked invalid.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace stoke::bench {

struct ChartSeries {
  std::string name;
  std::vector<double> x, y;   // NaN y values break the line
  std::vector<bool> invalid;  // per point (optional): drawn as a red cross
  bool markers = true;
  bool dashed = false;
  bool step = false;  // draw as a step function (CDFs)
};

struct ChartBand {  // a shaded x-range with a label on top
  double x0 = 0, x1 = 0;
  std::string label;
};

struct ChartOptions {
  std::string title;
  std::string x_label, y_label;
  bool log_x = false, log_y = false;
  bool y_from_zero = true;      // linear y axes start at 0
  std::vector<double> x_ticks;  // explicit x ticks (e.g. the concurrency values); empty = automatic
  std::vector<ChartBand> bands;
  int width = 620, height = 300;
};

// The series' colours come from a fixed palette, in order.
std::string LineChartSvg(const ChartOptions& opts, const std::vector<ChartSeries>& series);

// Cumulative fraction at each histogram upper edge (for CDF charts); x = edges[1..], y in [0, 1].
ChartSeries CdfFromHistogram(const std::string& name, const std::vector<double>& edges,
                             const std::vector<int64_t>& counts);

std::string XmlEscape(const std::string& s);
// "1.5k", "250", "0.12", "3e-05": short tick labels.
std::string ShortNumber(double v);

}  // namespace stoke::bench
