// A fake libnvidia-ml for tests: exports the nvml* entry points stoke uses (same C signatures as nvml.h,
// types from telemetry/nvml_api.h) and answers with fixed, scripted values. Loaded through
// STOKE_NVML_LIBRARY=<path to libfake_nvml.so>. Scripted by environment variables, read on every call:
//   FAKE_NVML_DEVICES  number of GPUs (default 1, at most 4)
//   FAKE_NVML_GPM      "1": GPM supported (Hopper-like), else unsupported
//   FAKE_NVML_FAIL     comma-separated queries that fail with NVML_ERROR_NOT_SUPPORTED: init, memory, clocks,
//                      power, limit, energy, temperature, utilization, pcie, reasons, ecc, fields,
//                      gpm_sample, gpm_metrics
//   Scenario overrides (stoke doctor's tests script GPU bottlenecks with them):
//   FAKE_NVML_UTIL                  GPU-Util % (default 87)
//   FAKE_NVML_GPM_VALUES            "id=value,..." GPM metric values replacing those of kGpm (e.g.
//   "2=3,10=2") FAKE_NVML_REASONS               clocks event reason bitmask, e.g. 0x4 (default 0x24)
//   FAKE_NVML_POWER_VIOLATION_RATE  the power-cap violation counter rises this many ns per ns from the first
//                                   read (0..1, the throttled share of time; default 0: constant)
// Values (GPU i): memory 80 GiB total, 512 MiB reserved, 10 GiB + i GiB used; SM 1500+i MHz, memory 2619 MHz;
// power 250 W (limit 700 W, instant field 260 W); 45 C (memory 50 C); util 87 % / 31 %; PCIe 1000/2000 KB/s;
// reasons 0x24 (sw_power_cap | sw_thermal_slowdown); ECC 3 corrected, 0 uncorrected; power-cap violation
// 2e9 ns; GPM (needs two distinct samples taken in order): id -> value in kGpm below; id 9 (IMMA) fails
// per-metric with NOT_SUPPORTED.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "telemetry/nvml_api.h"

using namespace stoke::nvml;  // NOLINT: a test fake, C entry points below

namespace {

struct FakeDevice {
  int index;
};
FakeDevice g_devices[4] = {{0}, {1}, {2}, {3}};
std::atomic<uint64_t> g_sample_clock{0};

struct FakeGpmSample {
  uint64_t taken = 0;  // 0: never taken; else the order it was taken in
  int device = -1;
};

int NumDevices() {
  const char* e = std::getenv("FAKE_NVML_DEVICES");
  int n = e != nullptr ? std::atoi(e) : 1;
  return n < 0 ? 0 : (n > 4 ? 4 : n);
}

bool Fails(const char* what) {
  const char* e = std::getenv("FAKE_NVML_FAIL");
  if (e == nullptr) return false;
  const std::string list = std::string(",") + e + ",";
  return list.find(std::string(",") + what + ",") != std::string::npos;
}

bool GpmOn() {
  const char* e = std::getenv("FAKE_NVML_GPM");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

int Index(Device d) {
  for (int i = 0; i < NumDevices(); ++i) {
    if (reinterpret_cast<Device>(&g_devices[i]) == d) return i;
  }
  return -1;
}

// FAKE_NVML_GPM_VALUES="id=value,...": true and *out when `id` is listed.
bool GpmOverride(uint32_t id, double* out) {
  const char* e = std::getenv("FAKE_NVML_GPM_VALUES");
  if (e == nullptr) return false;
  const std::string list = std::string(",") + e;
  const std::string key = "," + std::to_string(id) + "=";
  const size_t p = list.find(key);
  if (p == std::string::npos) return false;
  *out = std::strtod(list.c_str() + p + key.size(), nullptr);
  return true;
}

double EnvDouble(const char* name, double fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != '\0' ? std::strtod(e, nullptr) : fallback;
}

// The power-cap violation counter: 2e9 ns, plus FAKE_NVML_POWER_VIOLATION_RATE x the time since the first
// read.
unsigned long long PowerViolationNs() {
  using Clock = std::chrono::steady_clock;
  static const Clock::time_point start = Clock::now();
  const double rate = EnvDouble("FAKE_NVML_POWER_VIOLATION_RATE", 0);
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  return 2000000000ull + static_cast<unsigned long long>(rate * ns);
}

double GpmValue(uint32_t id, Return* status) {
  *status = kSuccess;
  if (double v = 0; GpmOverride(id, &v)) return v;
  switch (id) {
    case 1:
      return 80;
    case 2:
      return 60;
    case 3:
      return 25;
    case 4:
      return 5;
    case 5:
      return 40;
    case 6:
      return 0;
    case 7:
      return 35;
    case 9:
      *status = kErrorNotSupported;
      return 0;
    case 10:
      return 55;
    case 11:
      return 1;
    case 12:
      return 12;
    case 13:
      return 2;
    case 20:
      return 100;  // MiB/s
    case 21:
      return 200;
    case 60:
      return 0;
    case 61:
      return 0;
    default:
      return 0;
  }
}

}  // namespace

#define DEV_OR_RETURN(d)    \
  const int idx = Index(d); \
  (void)idx;                \
  if (idx < 0) return kErrorInvalidArgument

extern "C" {

__attribute__((visibility("default"))) Return nvmlInit_v2() {
  return Fails("init") ? kErrorDriverNotLoaded : kSuccess;
}
__attribute__((visibility("default"))) Return nvmlShutdown() {
  return kSuccess;
}
__attribute__((visibility("default"))) const char* nvmlErrorString(Return r) {
  switch (r) {
    case kSuccess:
      return "Success";
    case kErrorInvalidArgument:
      return "Invalid Argument";
    case kErrorNotSupported:
      return "Not Supported";
    case kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}
__attribute__((visibility("default"))) Return nvmlSystemGetDriverVersion(char* buf, unsigned n) {
  if (buf == nullptr || n < 8) return kErrorInvalidArgument;
  std::snprintf(buf, n, "%s", "999.99-fake");
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetCount_v2(unsigned* n) {
  if (n == nullptr) return kErrorInvalidArgument;
  *n = static_cast<unsigned>(NumDevices());
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetHandleByIndex_v2(unsigned i, Device* d) {
  if (d == nullptr || i >= static_cast<unsigned>(NumDevices())) return kErrorInvalidArgument;
  *d = reinterpret_cast<Device>(&g_devices[i]);
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetName(Device d, char* buf, unsigned n) {
  DEV_OR_RETURN(d);
  std::snprintf(buf, n, "NVIDIA Fake H200");
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetUUID(Device d, char* buf, unsigned n) {
  DEV_OR_RETURN(d);
  std::snprintf(buf, n, "GPU-fake-%04d", idx);
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetPciInfo_v3(Device d, PciInfo* p) {
  DEV_OR_RETURN(d);
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->bus_id, sizeof(p->bus_id), "00000000:%02X:00.0", idx + 0x19);
  p->bus = idx + 0x19;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetMinorNumber(Device d, unsigned* minor) {
  DEV_OR_RETURN(d);
  *minor = static_cast<unsigned>(idx);
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetMemoryInfo_v2(Device d, MemoryV2* m) {
  DEV_OR_RETURN(d);
  if (Fails("memory")) return kErrorNotSupported;
  if (m->version != kMemoryV2Version) return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  const uint64_t gib = uint64_t{1} << 30;
  m->total = 80 * gib;
  m->reserved = 512ull << 20;
  m->used = (10 + idx) * gib;
  m->free = m->total - m->reserved - m->used;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetMemoryInfo(Device d, Memory* m) {
  DEV_OR_RETURN(d);
  if (Fails("memory")) return kErrorNotSupported;
  const uint64_t gib = uint64_t{1} << 30;
  m->total = 80 * gib;
  m->used = (10 + idx) * gib + (512ull << 20);
  m->free = m->total - m->used;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetClockInfo(Device d, uint32_t type, unsigned* mhz) {
  DEV_OR_RETURN(d);
  if (Fails("clocks")) return kErrorNotSupported;
  if (type == kClockSm || type == kClockGraphics) {
    *mhz = 1500 + idx;
  } else if (type == kClockMem) {
    *mhz = 2619;
  } else {
    return kErrorInvalidArgument;
  }
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetPowerUsage(Device d, unsigned* mw) {
  DEV_OR_RETURN(d);
  if (Fails("power")) return kErrorNotSupported;
  *mw = 250000;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetEnforcedPowerLimit(Device d, unsigned* mw) {
  DEV_OR_RETURN(d);
  if (Fails("limit")) return kErrorNotSupported;
  *mw = 700000;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetTotalEnergyConsumption(Device d,
                                                                                  unsigned long long* mj) {
  DEV_OR_RETURN(d);
  if (Fails("energy")) return kErrorNotSupported;
  *mj = 123456789ull;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetTemperatureV(Device d, TemperatureV1* t) {
  DEV_OR_RETURN(d);
  if (Fails("temperature")) return kErrorNotSupported;
  if (t->version != kTemperatureV1Version || t->sensor != kTemperatureGpu) return kErrorInvalidArgument;
  t->temperature = 45;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetTemperature(Device d, uint32_t sensor,
                                                                       unsigned* c) {
  DEV_OR_RETURN(d);
  if (Fails("temperature")) return kErrorNotSupported;
  *c = 45;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetUtilizationRates(Device d, Utilization* u) {
  DEV_OR_RETURN(d);
  if (Fails("utilization")) return kErrorNotSupported;
  u->gpu = static_cast<unsigned>(EnvDouble("FAKE_NVML_UTIL", 87));
  u->memory = 31;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetPcieThroughput(Device d, uint32_t counter,
                                                                          unsigned* kbs) {
  DEV_OR_RETURN(d);
  if (Fails("pcie")) return kErrorNotSupported;
  *kbs = counter == kPcieTx ? 1000 : 2000;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetCurrentClocksEventReasons(
    Device d, unsigned long long* bits) {
  DEV_OR_RETURN(d);
  if (Fails("reasons")) return kErrorNotSupported;
  const char* e = std::getenv("FAKE_NVML_REASONS");
  *bits = e != nullptr ? std::strtoull(e, nullptr, 0) : (kReasonSwPowerCap | kReasonSwThermal);
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetTotalEccErrors(Device d, uint32_t error_type,
                                                                          uint32_t counter_type,
                                                                          unsigned long long* n) {
  DEV_OR_RETURN(d);
  if (Fails("ecc")) return kErrorNotSupported;
  *n = error_type == kEccCorrected ? 3 : 0;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlDeviceGetFieldValues(Device d, int n, FieldValue* values) {
  DEV_OR_RETURN(d);
  if (Fails("fields")) return kErrorNotSupported;
  for (int i = 0; i < n; ++i) {
    FieldValue& f = values[i];
    f.status = kSuccess;
    switch (f.field_id) {
      case kFiPerfPolicyPower:
        f.value_type = kValueU64;
        f.value.ull = PowerViolationNs();
        break;
      case kFiPerfPolicyThermal:
      case kFiPerfPolicySyncBoost:
        f.value_type = kValueU64;
        f.value.ull = 0;
        break;
      case kFiMemoryTemp:
        f.value_type = kValueU32;
        f.value.ui = 50;
        break;
      case kFiPcieReplayCounter:
        f.value_type = kValueU32;
        f.value.ui = 7;
        break;
      case kFiPowerInstant:
        f.value_type = kValueU32;
        f.value.ui = 260000;
        break;
      default:
        f.status = kErrorNotSupported;
        break;
    }
  }
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlGpmQueryDeviceSupport(Device d, GpmSupport* s) {
  DEV_OR_RETURN(d);
  if (s == nullptr || s->version != kGpmSupportVersion) return 25;
  s->is_supported_device = GpmOn() ? 1 : 0;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlGpmSampleAlloc(GpmSample* s) {
  if (s == nullptr) return kErrorInvalidArgument;
  *s = reinterpret_cast<GpmSample>(new FakeGpmSample());
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlGpmSampleFree(GpmSample s) {
  delete reinterpret_cast<FakeGpmSample*>(s);
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlGpmSampleGet(Device d, GpmSample s) {
  DEV_OR_RETURN(d);
  if (!GpmOn()) return kErrorNotSupported;
  if (s == nullptr) return kErrorInvalidArgument;
  if (Fails("gpm_sample")) return kErrorNotSupported;
  auto* fs = reinterpret_cast<FakeGpmSample*>(s);
  fs->taken = ++g_sample_clock;
  fs->device = idx;
  return kSuccess;
}
__attribute__((visibility("default"))) Return nvmlGpmMetricsGet(GpmMetricsGet* req) {
  if (req == nullptr || req->version != kGpmMetricsGetVersion) return 25;
  if (req->num_metrics == 0 || req->num_metrics > static_cast<uint32_t>(kGpmMaxMetricsPerCall))
    return kErrorInvalidArgument;
  auto* s1 = reinterpret_cast<FakeGpmSample*>(req->sample1);
  auto* s2 = reinterpret_cast<FakeGpmSample*>(req->sample2);
  if (s1 == nullptr || s2 == nullptr || s1 == s2 || s1->taken == 0 || s2->taken <= s1->taken ||
      s1->device != s2->device)
    return kErrorInvalidArgument;
  if (Fails("gpm_metrics")) return kErrorNotSupported;
  for (uint32_t i = 0; i < req->num_metrics; ++i) {
    GpmMetric& m = req->metrics[i];
    m.value = GpmValue(m.metric_id, &m.status);
  }
  return kSuccess;
}

}  // extern "C"
