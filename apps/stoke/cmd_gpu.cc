// stoke gpu: one snapshot of GPU telemetry (NVML + GPM, as `stoke serve` exports it on /metrics).
//
//   stoke gpu                      a table per GPU: dcgm-exporter names, values, units
//   stoke gpu --json               the same as GET /v1/gpu on a server (one JSON object)
//   stoke gpu --interval-ms 500    time between the two samples (GPM values average over it; >= 100)
//
// NVML is opened at run time (libnvidia-ml.so.1, or $STOKE_NVML_LIBRARY). Exit 0 with telemetry, 1 without it
// (the reason goes to stderr; --json still prints {"available": false, "reason": ...}), 2 on usage errors.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "apps/stoke/command.h"
#include "telemetry/gpu_telemetry.h"

namespace stoke {
namespace {

struct GpuOptions {
  bool json = false;
  int interval_ms = 1000;
};

int RunGpu(const GpuOptions& o) {
  GpuTelemetryOptions to;
  to.interval = std::chrono::milliseconds(o.interval_ms);
  auto t = GpuTelemetry::Create(to, nullptr);
  if (t->available()) {
    t->SampleOnce();  // first GPM sample (and the device values)
    std::this_thread::sleep_for(to.interval);
    t->SampleOnce();  // second: GPM metrics over the interval
  }
  const GpuSnapshot s = t->Snapshot();
  if (o.json) {
    fmt::print("{}\n", GpuSnapshotJson(s));
  } else if (s.available) {
    fmt::print("{}", GpuSnapshotTable(s));
  }
  if (!s.available) {
    fmt::print(stderr, "stoke gpu: GPU telemetry off: {}\n", s.reason);
    return 1;
  }
  return 0;
}

CommandRegistrar kGpu("gpu", "Print one snapshot of GPU telemetry (NVML, GPM) as a table or JSON",
                      [](CLI::App* cmd) {
                        auto o = std::make_shared<GpuOptions>();
                        cmd->add_flag("--json", o->json, "One JSON object (as GET /v1/gpu)");
                        cmd->add_option("--interval-ms", o->interval_ms,
                                        "Milliseconds between the two samples (GPM averages over it)")
                            ->check(CLI::Range(100, 60000))
                            ->capture_default_str();
                        return [o](const Backends&) -> int { return RunGpu(*o); };
                      });

}  // namespace
}  // namespace stoke
