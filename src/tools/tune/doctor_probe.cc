#include "tools/tune/doctor_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tools/doctor/doctor_runner.h"

namespace stoke::tune {

nlohmann::json DoctorVerdictsJson(const std::vector<doctor::Verdict>& verdicts) {
  nlohmann::json out = nlohmann::json::array();
  for (const doctor::Verdict& v : verdicts) {
    bool gpu_evidence = false;
    nlohmann::json ev = nlohmann::json::array();
    for (const doctor::Evidence& e : v.evidence) {
      gpu_evidence = gpu_evidence || e.signal.starts_with("gpu.");
      ev.push_back({{"signal", e.signal},
                    {"value", std::isfinite(e.value) ? nlohmann::json(e.value) : nlohmann::json()},
                    {"op", e.op},
                    {"threshold", e.threshold}});
    }
    out.push_back({{"bottleneck", v.bottleneck},
                   {"confidence", v.confidence},
                   {"summary", v.summary},
                   {"next_step", v.next_step},
                   {"gpu_evidence", gpu_evidence},
                   {"evidence", ev}});
  }
  return out;
}

DoctorProbe::DoctorProbe(std::string url, std::string model, double delay_s, double duration_s) {
  thread_ = std::thread([this, url = std::move(url), model = std::move(model), delay_s, duration_s] {
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
    doctor::DoctorOptions d;
    d.url = url;
    d.model = model;
    d.drive_load = false;  // bench drives the load; the doctor only watches
    d.duration_s = duration_s;
    d.trace = "off";  // a trace would slow the point it diagnoses
    d.scrape_interval_s = std::clamp(duration_s / 4, 0.5, 1.0);  // light: it shares the machine with the point
    StatusOr<doctor::DoctorReport> rep = doctor::RunDoctor(d);
    if (!rep.ok()) {
      result_ = {{"error", rep.status().message()}};
      return;
    }
    result_ = DoctorVerdictsJson(rep->verdicts);
  });
}

DoctorProbe::~DoctorProbe() {
  if (thread_.joinable()) thread_.join();
}

nlohmann::json DoctorProbe::Join() {
  if (thread_.joinable()) thread_.join();
  return result_;
}

}  // namespace stoke::tune
