#include "telemetry/gpu_telemetry.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "base/logging.h"
#include "telemetry/nvml_library.h"
#include "telemetry/trace.h"

namespace stoke {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr const char* kAvailableName = "stoke_gpu_telemetry_available";
constexpr const char* kReasonName = "stoke_gpu_clocks_event_reason";

// Every exported DCGM name with its help text and unit (the unit also labels `stoke gpu`'s table).
struct MetricDef {
  const char* name;
  const char* unit;
  const char* help;
};
constexpr MetricDef kMetrics[] = {
    {"DCGM_FI_DEV_GPU_UTIL", "%",
     "GPU utilization (%): share of the last sample period with >= 1 kernel running."},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", "%",
     "Memory utilization (%): share of the sample period DRAM was read or written."},
    {"DCGM_FI_DEV_FB_TOTAL", "MiB", "Framebuffer memory total (MiB)."},
    {"DCGM_FI_DEV_FB_FREE", "MiB", "Framebuffer memory free (MiB)."},
    {"DCGM_FI_DEV_FB_USED", "MiB", "Framebuffer memory used (MiB)."},
    {"DCGM_FI_DEV_FB_RESERVED", "MiB", "Framebuffer memory reserved by the driver (MiB)."},
    {"DCGM_FI_DEV_SM_CLOCK", "MHz", "SM clock frequency (MHz)."},
    {"DCGM_FI_DEV_MEM_CLOCK", "MHz", "Memory clock frequency (MHz)."},
    {"DCGM_FI_DEV_POWER_USAGE", "W", "Power draw (W; a 1 s average on Ampere and newer)."},
    {"DCGM_FI_DEV_POWER_USAGE_INSTANT", "W", "Instantaneous power draw (W)."},
    {"DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "W", "Enforced power limit (W)."},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", "Energy consumed since the driver was loaded (mJ)."},
    {"DCGM_FI_DEV_GPU_TEMP", "C", "GPU temperature (C)."},
    {"DCGM_FI_DEV_MEMORY_TEMP", "C", "Memory temperature (C)."},
    {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "KB/s",
     "PCIe transmit throughput over a 20 ms window (KB/s; only without GPM)."},
    {"DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "KB/s",
     "PCIe receive throughput over a 20 ms window (KB/s; only without GPM)."},
    {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "bitmask",
     "Clock event (throttle) reasons bitmask (nvmlClocksEventReason*)."},
    {"DCGM_FI_DEV_POWER_VIOLATION", "ns", "Time clocks were held down by the power cap, cumulative (ns)."},
    {"DCGM_FI_DEV_THERMAL_VIOLATION", "ns", "Time clocks were held down by thermal limits, cumulative (ns)."},
    {"DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "ns", "Time clocks were held down by sync boost, cumulative (ns)."},
    {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "count", "PCIe replay counter."},
    {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "count",
     "Corrected (single-bit) ECC errors since the driver was loaded."},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "count",
     "Uncorrected (double-bit) ECC errors since the driver was loaded."},
    {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "ratio", "GPM: ratio of time the graphics/compute engine was active."},
    {"DCGM_FI_PROF_SM_ACTIVE", "ratio",
     "GPM: ratio of cycles an SM had >= 1 warp resident, averaged over SMs."},
    {"DCGM_FI_PROF_SM_OCCUPANCY", "ratio", "GPM: resident warps over the maximum, averaged over SMs."},
    {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", "GPM: ratio of cycles any tensor pipe was active."},
    {"DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "ratio",
     "GPM: ratio of cycles the FP16/BF16 tensor (HMMA) pipe was active."},
    {"DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "ratio",
     "GPM: ratio of cycles the integer tensor (IMMA) pipe was active."},
    {"DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "ratio",
     "GPM: ratio of cycles the FP64 tensor (DFMA) pipe was active."},
    {"DCGM_FI_PROF_DRAM_ACTIVE", "ratio",
     "GPM: DRAM bandwidth used over the peak (about 0.8 is the practical max)."},
    {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "ratio", "GPM: ratio of cycles the FP64 (non-tensor) pipe was active."},
    {"DCGM_FI_PROF_PIPE_FP32_ACTIVE", "ratio",
     "GPM: ratio of cycles the FP32 (FMA, non-tensor) pipe was active."},
    {"DCGM_FI_PROF_PIPE_FP16_ACTIVE", "ratio", "GPM: ratio of cycles the FP16 (non-tensor) pipe was active."},
    {"DCGM_FI_PROF_PIPE_INT_ACTIVE", "ratio", "GPM: ratio of cycles the integer pipe was active."},
    {"DCGM_FI_PROF_PCIE_TX_BYTES", "B/s", "GPM: PCIe bytes transmitted per second, headers included."},
    {"DCGM_FI_PROF_PCIE_RX_BYTES", "B/s", "GPM: PCIe bytes received per second, headers included."},
    {"DCGM_FI_PROF_NVLINK_TX_BYTES", "B/s", "GPM: NVLink bytes transmitted per second (all links)."},
    {"DCGM_FI_PROF_NVLINK_RX_BYTES", "B/s", "GPM: NVLink bytes received per second (all links)."},
};

const MetricDef* FindMetric(const std::string& name) {
  for (const MetricDef& m : kMetrics) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

// GPM metric id -> DCGM name and scale (% -> ratio, MiB/s -> bytes/s). An allow-list: the driver answers
// "success" for ids no header defines, so only these are asked for.
struct GpmDef {
  uint32_t id;
  const char* name;
  double scale;
};
constexpr GpmDef kGpmMetrics[] = {
    {nvml::kGpmGraphicsUtil, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01},
    {nvml::kGpmSmUtil, "DCGM_FI_PROF_SM_ACTIVE", 0.01},
    {nvml::kGpmSmOccupancy, "DCGM_FI_PROF_SM_OCCUPANCY", 0.01},
    {nvml::kGpmIntegerUtil, "DCGM_FI_PROF_PIPE_INT_ACTIVE", 0.01},
    {nvml::kGpmAnyTensorUtil, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01},
    {nvml::kGpmDfmaTensorUtil, "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", 0.01},
    {nvml::kGpmHmmaTensorUtil, "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 0.01},
    {nvml::kGpmImmaTensorUtil, "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", 0.01},
    {nvml::kGpmDramBwUtil, "DCGM_FI_PROF_DRAM_ACTIVE", 0.01},
    {nvml::kGpmFp64Util, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", 0.01},
    {nvml::kGpmFp32Util, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 0.01},
    {nvml::kGpmFp16Util, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.01},
    {nvml::kGpmPcieTxPerSec, "DCGM_FI_PROF_PCIE_TX_BYTES", kMiB},
    {nvml::kGpmPcieRxPerSec, "DCGM_FI_PROF_PCIE_RX_BYTES", kMiB},
    {nvml::kGpmNvlinkTotalTxPerSec, "DCGM_FI_PROF_NVLINK_TX_BYTES", kMiB},
    {nvml::kGpmNvlinkTotalRxPerSec, "DCGM_FI_PROF_NVLINK_RX_BYTES", kMiB},
};
constexpr int kNumGpm = static_cast<int>(sizeof(kGpmMetrics) / sizeof(kGpmMetrics[0]));
static_assert(kNumGpm <= nvml::kGpmMaxMetricsPerCall);

// Field values read in one call: id, DCGM name, scale.
struct FieldDef {
  uint32_t id;
  const char* name;
  double scale;
};
constexpr FieldDef kFields[] = {
    {nvml::kFiPerfPolicyPower, "DCGM_FI_DEV_POWER_VIOLATION", 1},
    {nvml::kFiPerfPolicyThermal, "DCGM_FI_DEV_THERMAL_VIOLATION", 1},
    {nvml::kFiPerfPolicySyncBoost, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", 1},
    {nvml::kFiMemoryTemp, "DCGM_FI_DEV_MEMORY_TEMP", 1},
    {nvml::kFiPcieReplayCounter, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1},
    {nvml::kFiPowerInstant, "DCGM_FI_DEV_POWER_USAGE_INSTANT", 1e-3},  // mW -> W
};
constexpr int kNumFields = static_cast<int>(sizeof(kFields) / sizeof(kFields[0]));

constexpr std::pair<uint64_t, const char*> kReasons[] = {
    {nvml::kReasonGpuIdle, "gpu_idle"},
    {nvml::kReasonAppClocks, "applications_clocks_setting"},
    {nvml::kReasonSwPowerCap, "sw_power_cap"},
    {nvml::kReasonHwSlowdown, "hw_slowdown"},
    {nvml::kReasonSyncBoost, "sync_boost"},
    {nvml::kReasonSwThermal, "sw_thermal_slowdown"},
    {nvml::kReasonHwThermal, "hw_thermal_slowdown"},
    {nvml::kReasonHwPowerBrake, "hw_power_brake_slowdown"},
    {nvml::kReasonDisplayClock, "display_clock_setting"},
};

std::optional<double> FieldToDouble(const nvml::FieldValue& f) {
  if (f.status != nvml::kSuccess) return std::nullopt;
  double v;
  switch (f.value_type) {
    case nvml::kValueDouble:
      v = f.value.d;
      break;
    case nvml::kValueU32:
      v = f.value.ui;
      break;
    case nvml::kValueUL:
      v = static_cast<double>(f.value.ul);
      break;
    case nvml::kValueU64:
      v = static_cast<double>(f.value.ull);
      break;
    case nvml::kValueI64:
      v = static_cast<double>(f.value.sll);
      break;
    case nvml::kValueI32:
      v = f.value.si;
      break;
    case nvml::kValueU16:
      v = f.value.us;
      break;
    default:
      return std::nullopt;
  }
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::string Hostname() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "";
  return std::string(buf.data());
}

// A C string from a fixed buffer the callee may not have terminated.
std::string FromBuffer(const char* buf, size_t n) {
  size_t len = 0;
  while (len < n && buf[len] != '\0') ++len;
  return std::string(buf, len);
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct GpuTelemetry::Device {
  int index = 0;
  nvml::Device handle = nullptr;
  std::string uuid, model_name, pci_bus_id, device;
  bool gpm = false;
  std::string gpm_note;
  std::array<nvml::GpmSample, 2> samples{};  // GPM ring
  int newest = -1;                           // index of the last sample taken; -1: none valid
  SteadyClock::time_point newest_at;
  std::map<std::string, double> last_gpm;  // the last interval's values (kept when a tick comes too soon)
  double last_gpm_interval_s = 0;
};

std::vector<std::string> ClocksEventReasonNames(uint64_t bits) {
  std::vector<std::string> out;
  uint64_t known = 0;
  for (const auto& [bit, name] : kReasons) {
    known |= bit;
    if (bits & bit) out.emplace_back(name);
  }
  if (bits & ~known) out.push_back(fmt::format("{:#x}", bits & ~known));
  return out;
}

std::unique_ptr<GpuTelemetry> GpuTelemetry::Create(const GpuTelemetryOptions& options,
                                                   MetricsRegistry* registry) {
  std::unique_ptr<GpuTelemetry> t(new GpuTelemetry());
  t->options_ = options;
  t->registry_ = registry;
  t->hostname_ = Hostname();
  if (!options.enabled) {
    t->reason_ = "disabled (--no-gpu-telemetry)";
  } else {
    auto lib = NvmlLibrary::Load(options.library);
    if (!lib.ok()) {
      t->reason_ = std::string(lib.status().message());
    } else {
      t->lib_ = std::move(*lib);
      t->InitDevices();
    }
  }
  if (registry != nullptr) {
    auto g = registry->AddGauge(kAvailableName, "1 when stoke reads GPU telemetry through NVML, else 0.");
    if (g.ok()) g->Get().Set(t->available_ ? 1 : 0);
  }
  {
    std::lock_guard lock(t->snap_mu_);
    t->snapshot_.available = t->available_;
    t->snapshot_.reason = t->reason_;
    t->snapshot_.library = t->lib_ ? t->lib_->path() : "";
    t->snapshot_.driver_version = t->driver_version_;
    t->snapshot_.hostname = t->hostname_;
    t->snapshot_.interval_ms = options.interval.count();
  }
  if (!t->available_) {
    LOG_INFO("GPU telemetry off: {}", t->reason_);
  } else {
    std::string names;
    for (const auto& d : t->devices_) {
      names += fmt::format("{}{} {} (GPM {})", names.empty() ? "" : ", ", d->index, d->model_name,
                           d->gpm ? "on" : "off");
    }
    LOG_INFO("GPU telemetry: {} GPU(s) via {} (driver {}), every {} ms: {}", t->devices_.size(),
             t->lib_->path(), t->driver_version_.empty() ? "?" : t->driver_version_, options.interval.count(),
             names);
    for (const auto& d : t->devices_) {
      if (!d->gpm) {
        LOG_INFO("GPU telemetry: GPU {}: GPM unsupported ({}); device metrics only, no DCGM_FI_PROF_*",
                 d->index, d->gpm_note);
      }
    }
  }
  return t;
}

void GpuTelemetry::InitDevices() {
  NvmlLibrary& L = *lib_;
  if (L.system_get_driver_version != nullptr) {
    char buf[nvml::kDriverVersionBufferSize] = {};
    if (L.system_get_driver_version(buf, sizeof(buf)) == nvml::kSuccess) {
      driver_version_ = FromBuffer(buf, sizeof(buf));
    }
  }
  unsigned count = 0;
  if (nvml::Return r = L.device_get_count(&count); r != nvml::kSuccess) {
    reason_ = fmt::format("{}: nvmlDeviceGetCount_v2: {}", L.path(), L.ErrorString(r));
    return;
  }
  if (count == 0) {
    reason_ = fmt::format("{}: no GPU found (nvmlDeviceGetCount_v2 returned 0)", L.path());
    return;
  }
  if (count > 64) count = 64;  // bound what we allocate for on a broken answer
  std::string first_error;
  for (unsigned i = 0; i < count; ++i) {
    auto d = std::make_unique<Device>();
    d->index = static_cast<int>(i);
    if (nvml::Return r = L.device_get_handle_by_index(i, &d->handle); r != nvml::kSuccess) {
      if (first_error.empty()) first_error = fmt::format("GPU {}: {}", i, L.ErrorString(r));
      continue;
    }
    if (L.device_get_name != nullptr) {
      char buf[nvml::kDeviceNameBufferSize] = {};
      if (L.device_get_name(d->handle, buf, sizeof(buf)) == nvml::kSuccess)
        d->model_name = FromBuffer(buf, sizeof(buf));
    }
    if (L.device_get_uuid != nullptr) {
      char buf[nvml::kDeviceUuidBufferSize] = {};
      if (L.device_get_uuid(d->handle, buf, sizeof(buf)) == nvml::kSuccess)
        d->uuid = FromBuffer(buf, sizeof(buf));
    }
    if (L.device_get_pci_info != nullptr) {
      nvml::PciInfo pci{};
      if (L.device_get_pci_info(d->handle, &pci) == nvml::kSuccess)
        d->pci_bus_id = FromBuffer(pci.bus_id, sizeof(pci.bus_id));
    }
    unsigned minor = i;
    if (L.device_get_minor_number == nullptr ||
        L.device_get_minor_number(d->handle, &minor) != nvml::kSuccess) {
      minor = i;
    }
    d->device = fmt::format("nvidia{}", minor);
    // GPM: supported device, all entry points present, two samples allocated.
    if (L.gpm_query_device_support == nullptr || L.gpm_sample_alloc == nullptr ||
        L.gpm_sample_free == nullptr || L.gpm_sample_get == nullptr || L.gpm_metrics_get == nullptr) {
      d->gpm_note = "the NVML library has no GPM entry points";
    } else {
      nvml::GpmSupport support{};
      support.version = nvml::kGpmSupportVersion;
      nvml::Return r = L.gpm_query_device_support(d->handle, &support);
      if (r != nvml::kSuccess) {
        d->gpm_note = fmt::format("nvmlGpmQueryDeviceSupport: {}", L.ErrorString(r));
      } else if (support.is_supported_device == 0) {
        d->gpm_note = "nvmlGpmQueryDeviceSupport: device not supported (pre-Hopper, MIG or vGPU)";
      } else {
        d->gpm = true;
        for (auto& s : d->samples) {
          if (r = L.gpm_sample_alloc(&s); r != nvml::kSuccess) {
            s = nullptr;
            d->gpm = false;
            d->gpm_note = fmt::format("nvmlGpmSampleAlloc: {}", L.ErrorString(r));
          }
        }
      }
    }
    devices_.push_back(std::move(d));
  }
  if (devices_.empty()) {
    reason_ = fmt::format("{}: no usable GPU ({})", L.path(), first_error);
    return;
  }
  available_ = true;
}

GpuTelemetry::~GpuTelemetry() {
  Stop();
  if (lib_ != nullptr && lib_->gpm_sample_free != nullptr) {
    for (auto& d : devices_) {
      for (auto& s : d->samples) {
        if (s != nullptr) lib_->gpm_sample_free(s);
      }
    }
  }
  devices_.clear();
  lib_.reset();  // nvmlShutdown + dlclose
}

void GpuTelemetry::SampleGpm(Device& d, GpuDeviceSample* out) {
  NvmlLibrary& L = *lib_;
  const SteadyClock::time_point now = SteadyClock::now();
  // Two samples must be > 100 ms apart; a tick that comes sooner keeps the previous interval's values.
  if (d.newest >= 0 && now - d.newest_at <= std::chrono::milliseconds(100)) {
    out->values.insert(d.last_gpm.begin(), d.last_gpm.end());
    out->gpm_interval_s = d.last_gpm_interval_s;
    return;
  }
  const int slot = d.newest < 0 ? 0 : 1 - d.newest;
  nvml::Return r = L.gpm_sample_get(d.handle, d.samples[slot]);
  d.last_gpm.clear();
  d.last_gpm_interval_s = 0;
  if (r != nvml::kSuccess) {
    LOG_DEBUG("GPU telemetry: GPU {}: nvmlGpmSampleGet: {}", d.index, L.ErrorString(r));
    d.newest = -1;
    return;
  }
  const int older = d.newest;
  const SteadyClock::time_point older_at = d.newest_at;
  d.newest = slot;
  d.newest_at = now;
  if (older < 0) return;  // the first sample: no interval yet

  auto req = std::make_unique<nvml::GpmMetricsGet>();  // ~13 KB: off the stack
  req->version = nvml::kGpmMetricsGetVersion;
  req->num_metrics = kNumGpm;
  req->sample1 = d.samples[older];
  req->sample2 = d.samples[slot];
  for (int i = 0; i < kNumGpm; ++i) req->metrics[i].metric_id = kGpmMetrics[i].id;
  r = L.gpm_metrics_get(req.get());
  if (r != nvml::kSuccess) {
    LOG_DEBUG("GPU telemetry: GPU {}: nvmlGpmMetricsGet: {}", d.index, L.ErrorString(r));
    return;
  }
  for (int i = 0; i < kNumGpm; ++i) {
    const nvml::GpmMetric& m = req->metrics[i];
    if (m.status != nvml::kSuccess || m.metric_id != kGpmMetrics[i].id || !std::isfinite(m.value)) continue;
    d.last_gpm[kGpmMetrics[i].name] = m.value * kGpmMetrics[i].scale;
  }
  d.last_gpm_interval_s = std::chrono::duration<double>(now - older_at).count();
  out->values.insert(d.last_gpm.begin(), d.last_gpm.end());
  out->gpm_interval_s = d.last_gpm_interval_s;
}

void GpuTelemetry::SampleDevice(Device& d, GpuDeviceSample* out) {
  NvmlLibrary& L = *lib_;
  nvml::Device h = d.handle;
  auto& v = out->values;
  out->index = d.index;
  out->uuid = d.uuid;
  out->model_name = d.model_name;
  out->pci_bus_id = d.pci_bus_id;
  out->device = d.device;
  out->gpm_supported = d.gpm;
  out->gpm_note = d.gpm_note;

  bool have_memory = false;
  if (L.device_get_memory_info_v2 != nullptr) {
    nvml::MemoryV2 m{};
    m.version = nvml::kMemoryV2Version;
    if (L.device_get_memory_info_v2(h, &m) == nvml::kSuccess) {
      v["DCGM_FI_DEV_FB_TOTAL"] = m.total / kMiB;
      v["DCGM_FI_DEV_FB_FREE"] = m.free / kMiB;
      v["DCGM_FI_DEV_FB_USED"] = m.used / kMiB;
      v["DCGM_FI_DEV_FB_RESERVED"] = m.reserved / kMiB;
      have_memory = true;
    }
  }
  if (!have_memory && L.device_get_memory_info != nullptr) {
    nvml::Memory m{};
    if (L.device_get_memory_info(h, &m) == nvml::kSuccess) {
      v["DCGM_FI_DEV_FB_TOTAL"] = m.total / kMiB;
      v["DCGM_FI_DEV_FB_FREE"] = m.free / kMiB;
      v["DCGM_FI_DEV_FB_USED"] = m.used / kMiB;
    }
  }
  if (L.device_get_clock_info != nullptr) {
    unsigned mhz = 0;
    if (L.device_get_clock_info(h, nvml::kClockSm, &mhz) == nvml::kSuccess) v["DCGM_FI_DEV_SM_CLOCK"] = mhz;
    if (L.device_get_clock_info(h, nvml::kClockMem, &mhz) == nvml::kSuccess) v["DCGM_FI_DEV_MEM_CLOCK"] = mhz;
  }
  if (L.device_get_power_usage != nullptr) {
    unsigned mw = 0;
    if (L.device_get_power_usage(h, &mw) == nvml::kSuccess) v["DCGM_FI_DEV_POWER_USAGE"] = mw * 1e-3;
  }
  if (L.device_get_enforced_power_limit != nullptr) {
    unsigned mw = 0;
    if (L.device_get_enforced_power_limit(h, &mw) == nvml::kSuccess)
      v["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"] = mw * 1e-3;
  }
  if (L.device_get_total_energy_consumption != nullptr) {
    unsigned long long mj = 0;
    if (L.device_get_total_energy_consumption(h, &mj) == nvml::kSuccess)
      v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = static_cast<double>(mj);
  }
  bool have_temp = false;
  if (L.device_get_temperature_v != nullptr) {
    nvml::TemperatureV1 t{};
    t.version = nvml::kTemperatureV1Version;
    t.sensor = nvml::kTemperatureGpu;
    if (L.device_get_temperature_v(h, &t) == nvml::kSuccess) {
      v["DCGM_FI_DEV_GPU_TEMP"] = t.temperature;
      have_temp = true;
    }
  }
  if (!have_temp && L.device_get_temperature != nullptr) {
    unsigned c = 0;
    if (L.device_get_temperature(h, nvml::kTemperatureGpu, &c) == nvml::kSuccess)
      v["DCGM_FI_DEV_GPU_TEMP"] = c;
  }
  if (L.device_get_utilization_rates != nullptr) {
    nvml::Utilization u{};
    if (L.device_get_utilization_rates(h, &u) == nvml::kSuccess) {
      v["DCGM_FI_DEV_GPU_UTIL"] = u.gpu;
      v["DCGM_FI_DEV_MEM_COPY_UTIL"] = u.memory;
    }
  }
  if (L.device_get_clocks_event_reasons != nullptr) {
    unsigned long long bits = 0;
    if (L.device_get_clocks_event_reasons(h, &bits) == nvml::kSuccess) {
      out->clocks_event_reasons = bits;
      v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = static_cast<double>(bits);
    }
  }
  if (L.device_get_total_ecc_errors != nullptr) {
    unsigned long long n = 0;
    if (L.device_get_total_ecc_errors(h, nvml::kEccCorrected, nvml::kEccVolatile, &n) == nvml::kSuccess)
      v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] = static_cast<double>(n);
    if (L.device_get_total_ecc_errors(h, nvml::kEccUncorrected, nvml::kEccVolatile, &n) == nvml::kSuccess)
      v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = static_cast<double>(n);
  }
  if (L.device_get_field_values != nullptr) {
    std::array<nvml::FieldValue, kNumFields> fv{};
    for (int i = 0; i < kNumFields; ++i) fv[i].field_id = kFields[i].id;
    if (L.device_get_field_values(h, kNumFields, fv.data()) == nvml::kSuccess) {
      for (int i = 0; i < kNumFields; ++i) {
        if (fv[i].field_id != kFields[i].id) continue;
        if (auto x = FieldToDouble(fv[i])) v[kFields[i].name] = *x * kFields[i].scale;
      }
    }
  }
  if (d.gpm) {
    SampleGpm(d, out);
  } else if (L.device_get_pcie_throughput != nullptr) {
    // Blocks ~20 ms per call: only where GPM (which has PCIe bytes) is missing.
    unsigned kbs = 0;
    if (L.device_get_pcie_throughput(h, nvml::kPcieTx, &kbs) == nvml::kSuccess)
      v["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"] = kbs;
    if (L.device_get_pcie_throughput(h, nvml::kPcieRx, &kbs) == nvml::kSuccess)
      v["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"] = kbs;
  }
  // Nothing non-finite leaves this function.
  for (auto it = v.begin(); it != v.end();) it = std::isfinite(it->second) ? std::next(it) : v.erase(it);
}

// The tick's values as counter tracks of process "GPU <i>" (telemetry/trace.h). GPM values average the
// interval that ended now, so they are placed at its start; the device values at now.
static void TraceGpuSamples(const std::vector<GpuDeviceSample>& devices, Nanos now) {
  static const struct {
    const char* name;    // the counter track
    const char* metric;  // dcgm-exporter name
    double scale;
    bool gpm;
  } kCounters[] = {
      {"GPU util %", "DCGM_FI_DEV_GPU_UTIL", 1, false},
      {"SM clock MHz", "DCGM_FI_DEV_SM_CLOCK", 1, false},
      {"power W", "DCGM_FI_DEV_POWER_USAGE", 1, false},
      {"GR engine active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, true},
      {"SM active", "DCGM_FI_PROF_SM_ACTIVE", 1, true},
      {"SM occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", 1, true},
      {"tensor active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1, true},
      {"DRAM active", "DCGM_FI_PROF_DRAM_ACTIVE", 1, true},
      {"PCIe TX MB/s", "DCGM_FI_PROF_PCIE_TX_BYTES", 1e-6, true},
      {"PCIe RX MB/s", "DCGM_FI_PROF_PCIE_RX_BYTES", 1e-6, true},
  };
  TraceRecorder& tr = TraceRecorder::Global();
  for (const GpuDeviceSample& d : devices) {
    const TraceTrack t = tr.Track(fmt::format("GPU {}", d.index), "counters");
    const Nanos gpm_at = now - static_cast<Nanos>(d.gpm_interval_s * 1e9);
    for (const auto& c : kCounters) {
      auto it = d.values.find(c.metric);
      if (it == d.values.end() || (c.gpm && d.gpm_interval_s <= 0)) continue;
      tr.Counter(t, c.name, c.gpm ? gpm_at : now, {{"value", it->second * c.scale}});
    }
  }
}

void GpuTelemetry::SampleOnce() {
  if (!available_) return;
  std::lock_guard tick(tick_mu_);
  std::vector<GpuDeviceSample> samples(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) SampleDevice(*devices_[i], &samples[i]);
  Export(samples);
  if (TraceRecorder::Global().on()) TraceGpuSamples(samples, MonotonicNanos());
  std::lock_guard lock(snap_mu_);
  snapshot_.devices = std::move(samples);
  snapshot_.samples++;
  snapshot_.timestamp_s = UnixSeconds();
}

void GpuTelemetry::Export(const std::vector<GpuDeviceSample>& devices) {
  if (registry_ == nullptr) return;
  auto family = [&](const std::string& name, const char* help) -> GaugeFamily* {
    auto it = families_.find(name);
    if (it == families_.end()) {
      auto f = registry_->AddGauge(name, help);
      if (!f.ok()) {
        LOG_WARN("GPU telemetry: metric {}: {}", name, f.status().message());
        return nullptr;
      }
      it = families_.emplace(name, *f).first;
    }
    return &it->second;
  };
  std::map<std::string, bool> seen;
  auto put = [&](const std::string& name, const char* help, MetricLabels labels, double value,
                 const std::string& key) {
    GaugeFamily* f = family(name, help);
    if (f == nullptr) return;
    auto it = exported_.find(key);
    if (it == exported_.end()) {
      Gauge g = f->WithLabels(labels);
      it = exported_.emplace(key, std::make_pair(*f, g)).first;
    }
    it->second.second.Set(value);
    seen[key] = true;
  };
  for (const GpuDeviceSample& d : devices) {
    MetricLabels labels = {{"gpu", std::to_string(d.index)}, {"UUID", d.uuid},
                           {"pci_bus_id", d.pci_bus_id},     {"device", d.device},
                           {"modelName", d.model_name},      {"Hostname", hostname_}};
    for (const auto& [name, value] : d.values) {
      const MetricDef* def = FindMetric(name);
      put(name, def != nullptr ? def->help : name.c_str(), labels, value,
          fmt::format("{}|{}", name, d.index));
    }
    if (d.clocks_event_reasons) {
      for (const auto& [bit, reason] : kReasons) {
        MetricLabels l = labels;
        l["reason"] = reason;
        put(kReasonName,
            "1 while this clock event (throttle) reason is active (DCGM_FI_DEV_CLOCKS_EVENT_REASONS "
            "decoded).",
            l, (*d.clocks_event_reasons & bit) ? 1 : 0,
            fmt::format("{}|{}|{}", kReasonName, d.index, reason));
      }
    }
  }
  // A series not refreshed this tick (its query failed) leaves /metrics instead of going stale.
  for (auto it = exported_.begin(); it != exported_.end();) {
    if (seen.count(it->first)) {
      ++it;
    } else {
      it->second.first.Remove(it->second.second);
      it = exported_.erase(it);
    }
  }
}

void GpuTelemetry::Start() {
  if (!available_ || thread_.joinable()) return;
  {
    std::lock_guard lock(thread_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    std::unique_lock lock(thread_mu_);
    while (!stop_) {
      lock.unlock();
      SampleOnce();
      lock.lock();
      cv_.wait_for(lock, options_.interval, [this] { return stop_; });
    }
  });
}

void GpuTelemetry::Stop() {
  {
    std::lock_guard lock(thread_mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

GpuSnapshot GpuTelemetry::Snapshot() const {
  std::lock_guard lock(snap_mu_);
  return snapshot_;
}

std::string GpuSnapshotJson(const GpuSnapshot& s) {
  using nlohmann::json;
  json devices = json::array();
  for (const GpuDeviceSample& d : s.devices) {
    json metrics = json::object();
    for (const auto& [k, v] : d.values) metrics[k] = v;
    json reasons = json::array();
    if (d.clocks_event_reasons) {
      for (const auto& r : ClocksEventReasonNames(*d.clocks_event_reasons)) reasons.push_back(r);
    }
    json dev = {{"gpu", d.index},
                {"uuid", d.uuid},
                {"model_name", d.model_name},
                {"pci_bus_id", d.pci_bus_id},
                {"device", d.device},
                {"gpm_supported", d.gpm_supported},
                {"gpm_interval_s", d.gpm_interval_s},
                {"clocks_event_reasons", reasons},
                {"metrics", metrics}};
    if (!d.gpm_supported) dev["gpm_note"] = d.gpm_note;
    devices.push_back(std::move(dev));
  }
  json j = {{"available", s.available},           {"library", s.library},
            {"driver_version", s.driver_version}, {"hostname", s.hostname},
            {"interval_ms", s.interval_ms},       {"samples", s.samples},
            {"timestamp", s.timestamp_s},         {"devices", devices}};
  if (!s.available) j["reason"] = s.reason;
  return j.dump();
}

std::string GpuSnapshotTable(const GpuSnapshot& s) {
  if (!s.available) return fmt::format("GPU telemetry off: {}\n", s.reason);
  std::string out = fmt::format("NVML {} (driver {}), {} GPU(s)\n", s.library,
                                s.driver_version.empty() ? "?" : s.driver_version, s.devices.size());
  for (const GpuDeviceSample& d : s.devices) {
    out += fmt::format("\nGPU {}: {}  {}  {}  {}\n", d.index, d.model_name, d.uuid, d.pci_bus_id, d.device);
    if (d.gpm_supported) {
      out += d.gpm_interval_s > 0
                 ? fmt::format("  GPM: on (DCGM_FI_PROF_* average the last {:.3f} s)\n", d.gpm_interval_s)
                 : std::string("  GPM: on (no interval yet)\n");
    } else {
      out += fmt::format("  GPM: off ({})\n", d.gpm_note);
    }
    if (d.clocks_event_reasons) {
      const auto names = ClocksEventReasonNames(*d.clocks_event_reasons);
      out += fmt::format("  clock event reasons: {:#x} {}\n", *d.clocks_event_reasons,
                         names.empty() ? std::string("(none)") : fmt::format("({})", fmt::join(names, ", ")));
    }
    for (const MetricDef& m : kMetrics) {  // table order, not alphabetical
      auto it = d.values.find(m.name);
      if (it == d.values.end()) continue;
      out += fmt::format("  {:<40} {:>16.6g} {}\n", m.name, it->second, m.unit);
    }
  }
  return out;
}

}  // namespace stoke
