#include "tools/bench/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace stoke::bench {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

// Plot area margins, pixels.
constexpr double kLeft = 62, kRight = 16, kTop = 34, kBottom = 64;

// Ticks at 1, 2, 5 x 10^k covering [lo, hi].
std::vector<double> NiceTicks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!(hi > lo)) return {lo};
  double raw = (hi - lo) / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> ticks;
  int e0 = static_cast<int>(std::floor(std::log10(lo))), e1 = static_cast<int>(std::ceil(std::log10(hi)));
  bool few = e1 - e0 <= 2;
  for (int e = e0; e <= e1; ++e) {
    for (double m : few ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      double t = m * std::pow(10.0, e);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
    }
  }
  return ticks;
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double Map(double v, double p0, double p1) const {
    double f =
        log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return p0 + f * (p1 - p0);
  }
};

Axis MakeAxis(std::vector<double> values, bool log, bool from_zero) {
  Axis a;
  a.log = log;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (std::isnan(v) || std::isinf(v) || (log && v <= 0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) {
    lo = log ? 1 : 0;
    hi = log ? 10 : 1;
  }
  if (log) {
    if (hi <= lo) hi = lo * 10;
    a.lo = std::pow(10.0, std::floor(std::log10(lo) * 4) / 4);  // quarter decades of headroom
    a.hi = std::pow(10.0, std::ceil(std::log10(hi) * 4) / 4);
    if (a.hi <= a.lo) a.hi = a.lo * 10;
    return a;
  }
  if (from_zero && lo > 0) lo = 0;
  if (hi <= lo) hi = lo + (lo == 0 ? 1 : std::fabs(lo));
  double pad = (hi - lo) * 0.05;
  a.lo = lo < 0 || !from_zero ? lo - pad : lo;
  a.hi = hi + pad;
  return a;
}

}  // namespace

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string ShortNumber(double v) {
  double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:g}k", v / 1e3);
  if (a >= 1e-3) return fmt::format("{:.4g}", v);
  return fmt::format("{:.1e}", v);
}

ChartSeries CdfFromHistogram(const std::string& name, const std::vector<double>& edges,
                             const std::vector<int64_t>& counts) {
  ChartSeries s;
  s.name = name;
  s.markers = false;
  s.step = true;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0 || edges.size() != counts.size() + 1) return s;
  s.x.push_back(edges.front());
  s.y.push_back(0);
  int64_t run = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    run += counts[i];
    s.x.push_back(edges[i + 1]);
    s.y.push_back(static_cast<double>(run) / total);
  }
  return s;
}

std::string LineChartSvg(const ChartOptions& o, const std::vector<ChartSeries>& series) {
  const double w = o.width, h = o.height;
  const double px0 = kLeft, px1 = w - kRight, py0 = h - kBottom, py1 = kTop;
  std::vector<double> xs, ys;
  for (const ChartSeries& s : series) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
  }
  for (const ChartBand& b : o.bands) {
    xs.push_back(b.x0);
    xs.push_back(b.x1);
  }
  xs.insert(xs.end(), o.x_ticks.begin(), o.x_ticks.end());
  Axis ax = MakeAxis(xs, o.log_x, false);
  if (!o.log_x && !o.x_ticks.empty()) {  // explicit ticks: no padding beyond them
    ax.lo = std::min(ax.lo, *std::min_element(o.x_ticks.begin(), o.x_ticks.end()));
  }
  Axis ay = MakeAxis(ys, o.log_y, o.y_from_zero);

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{2}\" y=\"18\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\">{3}</text>\n",
      w, h, w / 2, XmlEscape(o.title));
  // Shaded bands first, under everything.
  for (size_t i = 0; i < o.bands.size(); ++i) {
    const ChartBand& b = o.bands[i];
    double x0 = ax.Map(std::max(b.x0, ax.lo), px0, px1), x1 = ax.Map(std::min(b.x1, ax.hi), px0, px1);
    svg += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" opacity=\"0.35\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"9\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n",
        x0, py1, std::max(0.5, x1 - x0), py0 - py1, i % 2 ? "#dfe8f3" : "#eef3f9", (x0 + x1) / 2, py1 - 3,
        XmlEscape(b.label));
  }
  // Grid and ticks.
  std::vector<double> yt = o.log_y ? LogTicks(ay.lo, ay.hi) : NiceTicks(ay.lo, ay.hi, 5);
  for (double t : yt) {
    if (t < ay.lo || t > ay.hi) continue;
    double y = ay.Map(t, py0, py1);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e3e3e3\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#333\">{}</text>\n",
        px0, y, px1, y, px0 - 5, y + 4, ShortNumber(t));
  }
  std::vector<double> xt = !o.x_ticks.empty() ? o.x_ticks
                           : o.log_x          ? LogTicks(ax.lo, ax.hi)
                                              : NiceTicks(ax.lo, ax.hi, 6);
  for (double t : xt) {
    if (t < ax.lo * (1 - 1e-9) - 1e-12 || t > ax.hi * (1 + 1e-9) + 1e-12) continue;
    double x = ax.Map(t, px0, px1);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#333\">{}</text>\n",
        x, py0, x, py1, x, py0 + 15, ShortNumber(t));
  }
  svg += fmt::format(
      "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#333\"/>"
      "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{3:.1f}\" stroke=\"#333\"/>\n"
      "<text x=\"{4:.1f}\" y=\"{5:.1f}\" text-anchor=\"middle\" fill=\"#333\">{6}</text>\n"
      "<text x=\"14\" y=\"{7:.1f}\" text-anchor=\"middle\" fill=\"#333\" transform=\"rotate(-90 14 "
      "{7:.1f})\">{8}"
      "</text>\n",
      px0, py0, px1, py1, (px0 + px1) / 2, py0 + 32, XmlEscape(o.x_label), (py0 + py1) / 2,
      XmlEscape(o.y_label));

  // Series.
  auto inside = [&](double x, double y) {
    return !std::isnan(x) && !std::isnan(y) && !std::isinf(y) && (!o.log_x || x > 0) && (!o.log_y || y > 0);
  };
  for (size_t si = 0; si < series.size(); ++si) {
    const ChartSeries& s = series[si];
    const char* color = kPalette[si % kPaletteSize];
    std::string path;
    bool pen_down = false;
    double last_y = 0;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!inside(s.x[i], s.y[i])) {
        pen_down = false;
        continue;
      }
      double x = ax.Map(s.x[i], px0, px1), y = ay.Map(std::clamp(s.y[i], ay.lo, ay.hi), py0, py1);
      if (!pen_down) {
        path += fmt::format("M{:.1f},{:.1f}", x, y);
      } else if (s.step) {
        path += fmt::format("H{:.1f}V{:.1f}", x, y);
      } else {
        path += fmt::format("L{:.1f},{:.1f}", x, y);
      }
      pen_down = true;
      last_y = y;
    }
    (void)last_y;
    if (!path.empty()) {
      svg += fmt::format(
          "<path class=\"series\" d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{}/>\n", path,
          color, s.dashed ? " stroke-dasharray=\"5,3\"" : "");
    }
    if (s.markers) {
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!inside(s.x[i], s.y[i])) continue;
        double x = ax.Map(s.x[i], px0, px1), y = ay.Map(std::clamp(s.y[i], ay.lo, ay.hi), py0, py1);
        if (i < s.invalid.size() && s.invalid[i]) {
          svg += fmt::format(
              "<path d=\"M{0:.1f},{1:.1f}l8,8m0,-8l-8,8\" stroke=\"#d00\" stroke-width=\"2\"/>"
              "<title>invalid point</title>\n",
              x - 4, y - 4);
        } else {
          svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x, y, color);
        }
      }
    }
  }
  // Legend along the bottom.
  double lx = px0;
  const double ly = h - 12;
  for (size_t si = 0; si < series.size(); ++si) {
    const char* color = kPalette[si % kPaletteSize];
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"3\"{}/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#222\">{}</text>\n",
        lx, ly - 4, lx + 16, ly - 4, color, series[si].dashed ? " stroke-dasharray=\"5,3\"" : "", lx + 20, ly,
        XmlEscape(series[si].name));
    lx += 30 + 6.2 * static_cast<double>(series[si].name.size());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace stoke::bench
