// What `stoke tune --out DIR` writes: stoke.toml (the chosen knobs as `stoke serve --config` keys; not in
// --url mode), tune.json (schema stoke.tune.v2: every measurement with the doctor's verdict on it, the steps
// with the verdict each started from and why each stopped or was skipped, the confirmation, --url's advice)
// and report.html (self-contained; inline SVG charts from stoke bench's svg_chart: per step, goodput vs the
// knob with the point kept, and each SLO's p99 vs the knob with the SLO line).
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
