// What `stoke tune --out DIR` writes: stoke.toml (the chosen knobs as `stoke serve --config` keys), tune.json
// (schema stoke.tune.v1: every measurement, the steps and why each stopped, the doctor's verdict, the
// confirmation) and report.html (self-contained; inline SVG charts from stoke bench's svg_chart: per step,
// goodput vs the knob with the chosen point, and p99 vs the knob with the SLO line).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tools/tune/tuner.h"

namespace stoke::tune {

std::string TuneToml(const TuneOptions& o, const TuneResult& r);
nlohmann::json TuneJson(const TuneOptions& o, const TuneResult& r);
std::string TuneHtml(const TuneOptions& o, const TuneResult& r);
// The summary printed on stdout at the end.
std::string TuneText(const TuneOptions& o, const TuneResult& r);

}  // namespace stoke::tune
