// The doctor's verdict on each tuning point, at no extra measuring time: while stoke bench measures the
// point, a thread runs `stoke doctor` in its observe mode (--load none, no trace) over the measured window:
// it scrapes /metrics and /v1/gpu, reads /v1/debug/requests, and diagnoses the load bench is driving.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tools/doctor/signals.h"

namespace stoke::tune {

// The verdicts as tune stores them: [{"bottleneck", "confidence", "summary", "next_step", "gpu_evidence",
// "evidence": [{"signal", "value", "op", "threshold"}]}] (gpu_evidence: some evidence is a GPU counter).
nlohmann::json DoctorVerdictsJson(const std::vector<doctor::Verdict>& verdicts);

class DoctorProbe {
 public:
  // Starts observing `delay_s` from now for `duration_s` (the point's warm-up, then its measured window).
  DoctorProbe(std::string url, std::string model, double delay_s, double duration_s);
  ~DoctorProbe();
  DoctorProbe(const DoctorProbe&) = delete;
  DoctorProbe& operator=(const DoctorProbe&) = delete;
  // Waits for the doctor; its verdicts, or {"error": "..."} when it could not diagnose.
  nlohmann::json Join();

 private:
  std::thread thread_;
  nlohmann::json result_;
};

}  // namespace stoke::tune
