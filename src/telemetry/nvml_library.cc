#include "telemetry/nvml_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <utility>

namespace stoke {
namespace {

template <typename Fn>
void Resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
}

}  // namespace

StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Load(const std::string& path_in) {
  std::string path = path_in;
  if (path.empty()) {
    const char* env = std::getenv(kNvmlLibraryEnv);
    path = env != nullptr && *env != '\0' ? env : kNvmlDefaultLibrary;
  }
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->path_ = path;
  dlerror();
  lib->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib->handle_ == nullptr) {
    const char* why = dlerror();
    return NotFoundError("cannot load {}: {}", path, why != nullptr ? why : "dlopen failed");
  }
  void* h = lib->handle_;
  Resolve(h, "nvmlInit_v2", &lib->init);
  Resolve(h, "nvmlShutdown", &lib->shutdown);
  Resolve(h, "nvmlErrorString", &lib->error_string);
  Resolve(h, "nvmlDeviceGetCount_v2", &lib->device_get_count);
  Resolve(h, "nvmlDeviceGetHandleByIndex_v2", &lib->device_get_handle_by_index);
  const std::pair<bool, const char*> required[] = {
      {lib->init != nullptr, "nvmlInit_v2"},
      {lib->shutdown != nullptr, "nvmlShutdown"},
      {lib->error_string != nullptr, "nvmlErrorString"},
      {lib->device_get_count != nullptr, "nvmlDeviceGetCount_v2"},
      {lib->device_get_handle_by_index != nullptr, "nvmlDeviceGetHandleByIndex_v2"}};
  for (const auto& [present, name] : required) {
    if (!present) return NotFoundError("{} lacks {}", path, name);
  }
  Resolve(h, "nvmlSystemGetDriverVersion", &lib->system_get_driver_version);
  Resolve(h, "nvmlDeviceGetName", &lib->device_get_name);
  Resolve(h, "nvmlDeviceGetUUID", &lib->device_get_uuid);
  Resolve(h, "nvmlDeviceGetPciInfo_v3", &lib->device_get_pci_info);
  Resolve(h, "nvmlDeviceGetMinorNumber", &lib->device_get_minor_number);
  Resolve(h, "nvmlDeviceGetMemoryInfo", &lib->device_get_memory_info);
  Resolve(h, "nvmlDeviceGetMemoryInfo_v2", &lib->device_get_memory_info_v2);
  Resolve(h, "nvmlDeviceGetClockInfo", &lib->device_get_clock_info);
  Resolve(h, "nvmlDeviceGetPowerUsage", &lib->device_get_power_usage);
  Resolve(h, "nvmlDeviceGetEnforcedPowerLimit", &lib->device_get_enforced_power_limit);
  Resolve(h, "nvmlDeviceGetTotalEnergyConsumption", &lib->device_get_total_energy_consumption);
  Resolve(h, "nvmlDeviceGetTemperatureV", &lib->device_get_temperature_v);
  Resolve(h, "nvmlDeviceGetTemperature", &lib->device_get_temperature);
  Resolve(h, "nvmlDeviceGetUtilizationRates", &lib->device_get_utilization_rates);
  Resolve(h, "nvmlDeviceGetPcieThroughput", &lib->device_get_pcie_throughput);
  Resolve(h, "nvmlDeviceGetCurrentClocksEventReasons", &lib->device_get_clocks_event_reasons);
  if (lib->device_get_clocks_event_reasons == nullptr) {
    Resolve(h, "nvmlDeviceGetCurrentClocksThrottleReasons", &lib->device_get_clocks_event_reasons);
  }
  Resolve(h, "nvmlDeviceGetTotalEccErrors", &lib->device_get_total_ecc_errors);
  Resolve(h, "nvmlDeviceGetFieldValues", &lib->device_get_field_values);
  Resolve(h, "nvmlGpmQueryDeviceSupport", &lib->gpm_query_device_support);
  Resolve(h, "nvmlGpmSampleAlloc", &lib->gpm_sample_alloc);
  Resolve(h, "nvmlGpmSampleFree", &lib->gpm_sample_free);
  Resolve(h, "nvmlGpmSampleGet", &lib->gpm_sample_get);
  Resolve(h, "nvmlGpmMetricsGet", &lib->gpm_metrics_get);

  const nvml::Return r = lib->init();
  if (r != nvml::kSuccess) return UnavailableError("{}: nvmlInit_v2: {}", path, lib->ErrorString(r));
  lib->initialized_ = true;
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_ && shutdown != nullptr) shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

std::string NvmlLibrary::ErrorString(nvml::Return r) const {
  const char* s = error_string != nullptr ? error_string(r) : nullptr;
  return fmt::format("NVML error {} ({})", r, s != nullptr ? s : "?");
}

}  // namespace stoke
