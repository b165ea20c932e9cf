// GPU telemetry from NVML (loaded at run time, telemetry/nvml_library.h) and, where the driver supports it
// (Hopper and newer), GPM: a sampler thread reads every GPU once per interval (1 s by default) and exports
// the values on the metrics registry under dcgm-exporter's names, labelled as dcgm-exporter labels them
// (gpu, UUID, pci_bus_id, device, modelName, Hostname), so existing Grafana dashboards work unchanged:
//
//   DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",modelName="NVIDIA H200",...} 100
//   DCGM_FI_PROF_SM_ACTIVE{...} 0.967          (GPM: a ratio 0-1 averaged over the last interval)
//   stoke_gpu_clocks_event_reason{...,reason="sw_power_cap"} 1
//   stoke_gpu_telemetry_available 1
//
// Degrades instead of failing: no libnvidia-ml (or no GPU) -> one info line "GPU telemetry off: <why>" and
// stoke_gpu_telemetry_available 0; GPM unsupported -> device metrics only (an info line says so); a query
// that fails leaves its metric absent (removed from /metrics) rather than reporting a stale or made-up value.
// Snapshot()/SnapshotJson() give the same values as one JSON object (GET /v1/gpu, `stoke gpu --json`).
// Facts, struct layouts and metric meanings: /work/shared/reference/gpu-telemetry.md; docs/telemetry.md.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/metrics.h"

namespace stoke {

class NvmlLibrary;

struct GpuTelemetryOptions {
  bool enabled = true;  // false: nothing is loaded; available() is false with reason "disabled"
  std::chrono::milliseconds interval{1000};  // sampler period; GPM needs > 100 ms between samples
  std::string library;                       // "" = $STOKE_NVML_LIBRARY, else libnvidia-ml.so.1
};

// One GPU's values from one tick. `values` maps dcgm-exporter names (DCGM_FI_DEV_*, DCGM_FI_PROF_*) to values
// in DCGM's units (MiB, MHz, W, °C, %, ratios 0-1, bytes/s); a name is absent when its query failed.
struct GpuDeviceSample {
  int index = 0;
  std::string uuid, model_name, pci_bus_id, device;  // device: "nvidia<minor>"
  bool gpm_supported = false;
  std::string gpm_note;       // why GPM is off, when it is
  double gpm_interval_s = 0;  // what the DCGM_FI_PROF_* values average over (0: none yet)
  std::optional<uint64_t> clocks_event_reasons;
  std::map<std::string, double> values;
};

struct GpuSnapshot {
  bool available = false;
  std::string reason;  // why not available
  std::string library, driver_version, hostname;
  int64_t interval_ms = 0;
  int64_t samples = 0;     // ticks taken so far
  double timestamp_s = 0;  // Unix time of the last tick (0: none yet)
  std::vector<GpuDeviceSample> devices;
};

// Clock event ("throttle") reason bits -> names: "gpu_idle", "applications_clocks_setting", "sw_power_cap",
// "hw_slowdown", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
// "display_clock_setting"; unknown bits as "0x...".
std::vector<std::string> ClocksEventReasonNames(uint64_t bits);
std::string GpuSnapshotJson(const GpuSnapshot& s);
// Human-readable: one block per GPU, one metric per line with its unit.
std::string GpuSnapshotTable(const GpuSnapshot& s);

class GpuTelemetry {
 public:
  // Loads NVML and finds the GPUs (a few ms). Never fails: without NVML or GPUs the object is unavailable,
  // reason() says why, and only stoke_gpu_telemetry_available 0 is exported. registry may be null.
  static std::unique_ptr<GpuTelemetry> Create(const GpuTelemetryOptions& options, MetricsRegistry* registry);
  ~GpuTelemetry();  // Stop(), frees the GPM samples, shuts NVML down
  GpuTelemetry(const GpuTelemetry&) = delete;
  GpuTelemetry& operator=(const GpuTelemetry&) = delete;

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }

  // One tick now: reads every GPU, updates the snapshot and the registry. Thread-safe (ticks serialise).
  void SampleOnce();
  // The sampler thread: a tick right away, then one per interval, until Stop(). No-op when unavailable.
  void Start();
  void Stop();

  GpuSnapshot Snapshot() const;
  std::string SnapshotJson() const { return GpuSnapshotJson(Snapshot()); }

 private:
  struct Device;
  struct Series;
  GpuTelemetry() = default;
  void InitDevices();
  void SampleDevice(Device& d, GpuDeviceSample* out);
  void SampleGpm(Device& d, GpuDeviceSample* out);
  void Export(const std::vector<GpuDeviceSample>& devices);

  GpuTelemetryOptions options_;
  MetricsRegistry* registry_ = nullptr;
  std::unique_ptr<NvmlLibrary> lib_;
  bool available_ = false;
  std::string reason_;
  std::string hostname_, driver_version_;
  std::vector<std::unique_ptr<Device>> devices_;

  std::mutex tick_mu_;  // one tick at a time; guards devices_' GPM state and exported_
  std::map<std::string, GaugeFamily> families_;                    // guarded by tick_mu_
  std::map<std::string, std::pair<GaugeFamily, Gauge>> exported_;  // series key -> gauge; tick_mu_

  mutable std::mutex snap_mu_;
  GpuSnapshot snapshot_;  // guarded by snap_mu_

  std::mutex thread_mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by thread_mu_
  std::thread thread_;
};

}  // namespace stoke
