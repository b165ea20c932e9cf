// A whole `stoke doctor` run, over the server's public APIs only (like stoke bench, whose HTTP client,
// Prometheus parser and load generator it reuses):
//
//   1. discover the model and API: GET /v1/models, then GET /v2/models/M (200: KServe, with its config at
//      /v2/models/M/config) else OpenAI completions
//   2. --load auto: a short closed-loop sweep with bench's engine; every point but the last is only measured
//      (throughput, latency); --load none: observe whatever traffic there is
//   3. over the window (the last load point, or --duration): scrape /metrics and GET /v1/gpu every
//      `scrape_interval_s`; after it, GET /v1/debug/requests (the slowest requests' ledgers) if the server
//      has it
//   4. meanwhile (--trace, on by default where the server has GET /v1/debug/trace): a short trace inside the
//      window, read for kernels per request, kernel durations and the gaps between them (trace_signals.h)
//   5. ExtractSignals -> Diagnose
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "tools/bench/workload.h"
#include "tools/doctor/signals.h"

namespace stoke::doctor {

struct DoctorOptions {
  std::string url;    // http://HOST:PORT
  std::string model;  // "" = discover
  std::string api;    // "" = discover; else a stoke bench --api name
  double duration_s = 10;
  bool drive_load = true;                    // --load auto
  std::vector<double> concurrency = {1, 8};  // the sweep; the last point is the diagnosed window
  bench::WorkloadSpec workload;              // LLM prompts/outputs (bench's "short" by default)
  bool kserve_binary = false;
  // --bytes-input: the contents KServe BYTES inputs are drawn from (an image model's JPEG/PNG photos).
  std::shared_ptr<const std::vector<std::string>> kserve_bytes;
  double scrape_interval_s = 0.5;
  // The GPU timeline: "auto" takes a trace when the server answers GET /v1/debug/trace, "on" also notes
  // when it cannot, "off" never. The trace lasts trace_seconds (at most half the diagnosed window) and
  // starts after the window's warm-up.
  std::string trace = "auto";
  double trace_seconds = 2;
  // The device's rates for the step split (ApplyDeviceRates): GB/s a stream reads and bf16 GEMM TFLOP/s,
  // e.g. from `stoke bench step`'s device_roofline; 0 = not known (the split stays in bytes and FLOPs).
  double hbm_gbps = 0, tensor_tflops = 0;
  Thresholds thresholds;
  std::FILE* progress = nullptr;  // one line per phase; nullptr = silent
};

struct DoctorReport {
  std::string url, model, api, load, started_at;
  Signals signals;
  std::vector<Verdict> verdicts;
  Thresholds thresholds;
  std::vector<std::string> notes;  // what could not be read, and why
  nlohmann::json slowest;          // GET /v1/debug/requests (null when absent)
};

StatusOr<DoctorReport> RunDoctor(const DoctorOptions& opts);

}  // namespace stoke::doctor
