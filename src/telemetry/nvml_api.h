// The few NVML types, constants and entry-point signatures stoke uses, declared here from the documented
// NVML API (https://docs.nvidia.com/deploy/nvml-api/) so that no NVML header or library is needed at build
// time: libnvidia-ml.so.1 is opened with dlopen at run time (telemetry/nvml_library.h). Layouts are for
// x86-64 / aarch64 LP64 and are checked with static_asserts below (facts: /work/shared/reference/
// gpu-telemetry.md §1-§2). Everything lives in stoke::nvml to keep the names apart from a real nvml.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoke::nvml {

using Return = int32_t;  // nvmlReturn_t
struct DeviceSt;
using Device = DeviceSt*;  // nvmlDevice_t (opaque)
struct GpmSampleSt;
using GpmSample = GpmSampleSt*;  // nvmlGpmSample_t (opaque pointer; same ABI old and new headers)

inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorNoData = 21;
inline constexpr Return kErrorUnknown = 999;

// nvmlClockType_t, nvmlPcieUtilCounter_t, nvmlTemperatureSensors_t, nvmlMemoryErrorType_t,
// nvmlEccCounterType_t, nvmlValueType_t.
inline constexpr uint32_t kClockGraphics = 0, kClockSm = 1, kClockMem = 2;
inline constexpr uint32_t kPcieTx = 0, kPcieRx = 1;
inline constexpr uint32_t kTemperatureGpu = 0;
inline constexpr uint32_t kEccCorrected = 0, kEccUncorrected = 1;
inline constexpr uint32_t kEccVolatile = 0, kEccAggregate = 1;
inline constexpr int32_t kValueDouble = 0, kValueU32 = 1, kValueUL = 2, kValueU64 = 3, kValueI64 = 4,
                         kValueI32 = 5, kValueU16 = 6;

// Field ids (nvmlDeviceGetFieldValues) used, all < 250 (ids above ~250 were renumbered between headers).
inline constexpr uint32_t kFiPerfPolicyPower = 74;      // ns throttled by the power cap, cumulative
inline constexpr uint32_t kFiPerfPolicyThermal = 75;    // ns, thermal
inline constexpr uint32_t kFiPerfPolicySyncBoost = 76;  // ns, sync boost
inline constexpr uint32_t kFiMemoryTemp = 82;           // °C
inline constexpr uint32_t kFiPcieReplayCounter = 94;
inline constexpr uint32_t kFiPowerInstant = 186;  // mW

// Clock event ("throttle") reason bits (nvmlClocksEventReason*).
inline constexpr uint64_t kReasonGpuIdle = 0x1, kReasonAppClocks = 0x2, kReasonSwPowerCap = 0x4,
                          kReasonHwSlowdown = 0x8, kReasonSyncBoost = 0x10, kReasonSwThermal = 0x20,
                          kReasonHwThermal = 0x40, kReasonHwPowerBrake = 0x80, kReasonDisplayClock = 0x100;

// GPM metric ids (nvmlGpmMetricId_t).
inline constexpr uint32_t kGpmGraphicsUtil = 1, kGpmSmUtil = 2, kGpmSmOccupancy = 3, kGpmIntegerUtil = 4,
                          kGpmAnyTensorUtil = 5, kGpmDfmaTensorUtil = 6, kGpmHmmaTensorUtil = 7,
                          kGpmImmaTensorUtil = 9, kGpmDramBwUtil = 10, kGpmFp64Util = 11, kGpmFp32Util = 12,
                          kGpmFp16Util = 13, kGpmPcieTxPerSec = 20, kGpmPcieRxPerSec = 21,
                          kGpmNvlinkTotalRxPerSec = 60, kGpmNvlinkTotalTxPerSec = 61;

inline constexpr unsigned kDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kDeviceUuidBufferSize = 96;     // >= NVML_DEVICE_UUID_V2_BUFFER_SIZE (96)
inline constexpr unsigned kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

struct Utilization {  // nvmlUtilization_t
  uint32_t gpu;
  uint32_t memory;
};
struct Memory {  // nvmlMemory_t (v1; "used" includes the driver's reserve)
  uint64_t total, free, used;
};
struct MemoryV2 {  // nvmlMemory_v2_t
  uint32_t version;
  uint64_t total, reserved, free, used;
};
inline constexpr uint32_t kMemoryV2Version = sizeof(MemoryV2) | (2u << 24);  // 0x02000028
struct TemperatureV1 {                                                       // nvmlTemperature_v1_t
  uint32_t version;
  uint32_t sensor;
  int32_t temperature;
};
inline constexpr uint32_t kTemperatureV1Version = sizeof(TemperatureV1) | (1u << 24);  // 0x0100000C
struct PciInfo {                                                                       // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  uint32_t domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
union Value {  // nvmlValue_t
  double d;
  uint32_t ui;
  unsigned long ul;
  uint64_t ull;
  int64_t sll;
  int32_t si;
  uint16_t us;
};
struct FieldValue {  // nvmlFieldValue_t
  uint32_t field_id;
  uint32_t scope_id;
  int64_t timestamp;
  int64_t latency_usec;
  int32_t value_type;
  Return status;
  Value value;
};
struct GpmMetric {  // nvmlGpmMetric_t
  uint32_t metric_id;
  Return status;
  double value;
  const char* short_name;
  const char* long_name;
  const char* unit;
};
// nvmlGpmMetricsGet_t. The header's array grew 98 -> 210 -> 333 with the version still 1; declare the largest
// but never ask for more than 210 metrics (drivers reject numMetrics > 210 with "invalid argument").
inline constexpr int kGpmMetricsArray = 333;
inline constexpr int kGpmMaxMetricsPerCall = 210;
struct GpmMetricsGet {
  uint32_t version;  // 1
  uint32_t num_metrics;
  GpmSample sample1;
  GpmSample sample2;
  GpmMetric metrics[kGpmMetricsArray];
};
inline constexpr uint32_t kGpmMetricsGetVersion = 1;
struct GpmSupport {  // nvmlGpmSupport_t
  uint32_t version;  // 1
  uint32_t is_supported_device;
};
inline constexpr uint32_t kGpmSupportVersion = 1;

static_assert(sizeof(Utilization) == 8);
static_assert(sizeof(Memory) == 24);
static_assert(sizeof(MemoryV2) == 40 && offsetof(MemoryV2, total) == 8 && offsetof(MemoryV2, used) == 32);
static_assert(sizeof(TemperatureV1) == 12);
static_assert(sizeof(PciInfo) == 68 && offsetof(PciInfo, bus_id) == 36);
static_assert(sizeof(Value) == 8);
static_assert(sizeof(FieldValue) == 40 && offsetof(FieldValue, value_type) == 24 &&
              offsetof(FieldValue, status) == 28 && offsetof(FieldValue, value) == 32);
static_assert(sizeof(GpmMetric) == 40 && offsetof(GpmMetric, value) == 8);
static_assert(offsetof(GpmMetricsGet, sample1) == 8 && offsetof(GpmMetricsGet, metrics) == 24 &&
              sizeof(GpmMetricsGet) == 24 + 40 * kGpmMetricsArray);
static_assert(sizeof(GpmSupport) == 8);
static_assert(sizeof(GpmSample) == 8);

// Entry points (C calling convention; signatures as in nvml.h).
extern "C" {
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using SystemGetDriverVersionFn = Return (*)(char*, unsigned);
using DeviceGetCountFn = Return (*)(unsigned*);
using DeviceGetHandleByIndexFn = Return (*)(unsigned, Device*);
using DeviceGetNameFn = Return (*)(Device, char*, unsigned);
using DeviceGetUuidFn = Return (*)(Device, char*, unsigned);
using DeviceGetPciInfoFn = Return (*)(Device, PciInfo*);
using DeviceGetMinorNumberFn = Return (*)(Device, unsigned*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device, MemoryV2*);
using DeviceGetClockInfoFn = Return (*)(Device, uint32_t, unsigned*);
using DeviceGetPowerUsageFn = Return (*)(Device, unsigned*);
using DeviceGetEnforcedPowerLimitFn = Return (*)(Device, unsigned*);
using DeviceGetTotalEnergyConsumptionFn = Return (*)(Device, unsigned long long*);
using DeviceGetTemperatureVFn = Return (*)(Device, TemperatureV1*);
using DeviceGetTemperatureFn = Return (*)(Device, uint32_t, unsigned*);
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetPcieThroughputFn = Return (*)(Device, uint32_t, unsigned*);
using DeviceGetClocksEventReasonsFn = Return (*)(Device, unsigned long long*);
using DeviceGetTotalEccErrorsFn = Return (*)(Device, uint32_t, uint32_t, unsigned long long*);
using DeviceGetFieldValuesFn = Return (*)(Device, int, FieldValue*);
using GpmQueryDeviceSupportFn = Return (*)(Device, GpmSupport*);
using GpmSampleAllocFn = Return (*)(GpmSample*);
using GpmSampleFreeFn = Return (*)(GpmSample);
using GpmSampleGetFn = Return (*)(Device, GpmSample);
using GpmMetricsGetFn = Return (*)(GpmMetricsGet*);
}

}  // namespace stoke::nvml
