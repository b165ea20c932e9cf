// libnvidia-ml.so.1 opened with dlopen at run time and initialised (nvmlInit_v2); nothing of NVML is needed
// at build time (telemetry/nvml_api.h declares what is used). A missing library, a missing required symbol or
// a failing nvmlInit_v2 is an error whose message says which: the caller turns it into "GPU telemetry off:
// ...". Optional entry points (per-metric queries, GPM) may be null: the sampler skips what the driver lacks.
//
// Which file: the STOKE_NVML_LIBRARY environment variable if set (tests point it at a fake NVML or at a path
// that does not exist), else "libnvidia-ml.so.1" (the unversioned name exists only with dev packages).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "telemetry/nvml_api.h"

namespace stoke {

inline constexpr const char* kNvmlLibraryEnv = "STOKE_NVML_LIBRARY";
inline constexpr const char* kNvmlDefaultLibrary = "libnvidia-ml.so.1";

class NvmlLibrary {
 public:
  // path "": $STOKE_NVML_LIBRARY, else libnvidia-ml.so.1.
  static StatusOr<std::unique_ptr<NvmlLibrary>> Load(const std::string& path = "");
  ~NvmlLibrary();  // nvmlShutdown, dlclose
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::string& path() const { return path_; }
  // "NVML error 3 (Not Supported)".
  std::string ErrorString(nvml::Return r) const;

  // Required (non-null after Load).
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::DeviceGetCountFn device_get_count = nullptr;
  nvml::DeviceGetHandleByIndexFn device_get_handle_by_index = nullptr;
  // Optional (null when the library lacks them).
  nvml::SystemGetDriverVersionFn system_get_driver_version = nullptr;
  nvml::DeviceGetNameFn device_get_name = nullptr;
  nvml::DeviceGetUuidFn device_get_uuid = nullptr;
  nvml::DeviceGetPciInfoFn device_get_pci_info = nullptr;
  nvml::DeviceGetMinorNumberFn device_get_minor_number = nullptr;
  nvml::DeviceGetMemoryInfoFn device_get_memory_info = nullptr;
  nvml::DeviceGetMemoryInfoV2Fn device_get_memory_info_v2 = nullptr;
  nvml::DeviceGetClockInfoFn device_get_clock_info = nullptr;
  nvml::DeviceGetPowerUsageFn device_get_power_usage = nullptr;
  nvml::DeviceGetEnforcedPowerLimitFn device_get_enforced_power_limit = nullptr;
  nvml::DeviceGetTotalEnergyConsumptionFn device_get_total_energy_consumption = nullptr;
  nvml::DeviceGetTemperatureVFn device_get_temperature_v = nullptr;
  nvml::DeviceGetTemperatureFn device_get_temperature = nullptr;
  nvml::DeviceGetUtilizationRatesFn device_get_utilization_rates = nullptr;
  nvml::DeviceGetPcieThroughputFn device_get_pcie_throughput = nullptr;
  nvml::DeviceGetClocksEventReasonsFn device_get_clocks_event_reasons = nullptr;  // or the old Throttle name
  nvml::DeviceGetTotalEccErrorsFn device_get_total_ecc_errors = nullptr;
  nvml::DeviceGetFieldValuesFn device_get_field_values = nullptr;
  nvml::GpmQueryDeviceSupportFn gpm_query_device_support = nullptr;
  nvml::GpmSampleAllocFn gpm_sample_alloc = nullptr;
  nvml::GpmSampleFreeFn gpm_sample_free = nullptr;
  nvml::GpmSampleGetFn gpm_sample_get = nullptr;
  nvml::GpmMetricsGetFn gpm_metrics_get = nullptr;

 private:
  NvmlLibrary() = default;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::string path_;
};

}  // namespace stoke
