// The doctor's outputs: the text a person reads on stdout, the JSON for machines (--json) and a
// self-contained HTML page (--html: inline CSS, no scripts, no external resources).
//
// JSON (schema "stoke.doctor.v1"):
//   {"schema", "url", "model", "api", "load", "started_at",
//    "verdicts": [{"bottleneck", "confidence", "confidence_label", "summary",
//                  "evidence": [{"signal", "value", "op", "threshold", "unit", "note"}], "next_step",
//                  "why"}],
//    "signals": {...every Signals field, null where unknown...}, "thresholds": {...}, "notes": [...],
//    "slowest_requests": <GET /v1/debug/requests, or null>}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tools/doctor/doctor_runner.h"

namespace stoke::doctor {

nlohmann::json SignalsJson(const Signals& s);
nlohmann::json ReportJson(const DoctorReport& r);
std::string ReportText(const DoctorReport& r);
std::string ReportHtml(const DoctorReport& r);

}  // namespace stoke::doctor
