// GPU telemetry against a missing NVML and a fake one (testing/fake_nvml.cc, scripted through FAKE_NVML_*
// environment variables; its values are listed at the top of that file).
#include "telemetry/gpu_telemetry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "telemetry/nvml_library.h"

namespace stoke {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Sets the fake's script for one test and clears it afterwards.
class FakeNvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv(kNvmlLibraryEnv, STOKE_FAKE_NVML_PATH, 1);
    unsetenv("FAKE_NVML_DEVICES");
    unsetenv("FAKE_NVML_GPM");
    unsetenv("FAKE_NVML_FAIL");
  }
  void TearDown() override {
    for (const char* v : {kNvmlLibraryEnv, "FAKE_NVML_DEVICES", "FAKE_NVML_GPM", "FAKE_NVML_FAIL"})
      unsetenv(v);
  }
  static std::unique_ptr<GpuTelemetry> Make(MetricsRegistry* r, int interval_ms = 1000) {
    GpuTelemetryOptions o;
    o.interval = std::chrono::milliseconds(interval_ms);
    return GpuTelemetry::Create(o, r);
  }
};

// The value of the exposition line that starts with `prefix` (name + '{'), which must contain every label.
std::optional<double> Find(const std::string& text, const std::string& name,
                           const std::vector<std::string>& labels) {
  size_t pos = 0;
  while ((pos = text.find(name + "{", pos)) != std::string::npos) {
    if (pos != 0 && text[pos - 1] != '\n') {
      ++pos;
      continue;
    }
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol - pos);
    bool all = true;
    for (const auto& l : labels) all &= line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
    pos = eol;
  }
  return std::nullopt;
}

TEST(NvmlLibraryTest, MissingLibraryIsAnErrorNamingThePath) {
  auto lib = NvmlLibrary::Load("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(std::string(lib.status().message()), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
}

TEST_F(FakeNvmlTest, MissingLibraryMeansUnavailableWithTheReason) {
  setenv(kNvmlLibraryEnv, "/nonexistent/libnvidia-ml.so.1", 1);
  MetricsRegistry r;
  auto t = Make(&r);
  EXPECT_FALSE(t->available());
  EXPECT_THAT(t->reason(), HasSubstr("/nonexistent/libnvidia-ml.so.1"));
  t->SampleOnce();  // no-op
  t->Start();       // no thread
  t->Stop();
  const std::string text = r.ExposeText();
  EXPECT_THAT(text, HasSubstr("\nstoke_gpu_telemetry_available 0"));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_")));
  auto j = nlohmann::json::parse(t->SnapshotJson());
  EXPECT_EQ(j["available"], false);
  EXPECT_THAT(j["reason"].get<std::string>(), HasSubstr("/nonexistent"));
  EXPECT_TRUE(j["devices"].empty());
}

TEST_F(FakeNvmlTest, DisabledLoadsNothing) {
  MetricsRegistry r;
  auto t = GpuTelemetry::Create({.enabled = false}, &r);
  EXPECT_FALSE(t->available());
  EXPECT_THAT(t->reason(), HasSubstr("disabled"));
  EXPECT_THAT(r.ExposeText(), HasSubstr("stoke_gpu_telemetry_available 0"));
}

TEST_F(FakeNvmlTest, InitFailureMeansUnavailable) {
  setenv("FAKE_NVML_FAIL", "init", 1);
  auto t = Make(nullptr);
  EXPECT_FALSE(t->available());
  EXPECT_THAT(t->reason(), HasSubstr("nvmlInit_v2"));
  EXPECT_THAT(t->reason(), HasSubstr("Driver Not Loaded"));
}

TEST_F(FakeNvmlTest, NoGpuMeansUnavailable) {
  setenv("FAKE_NVML_DEVICES", "0", 1);
  auto t = Make(nullptr);
  EXPECT_FALSE(t->available());
  EXPECT_THAT(t->reason(), HasSubstr("no GPU"));
}

TEST_F(FakeNvmlTest, DeviceMetricsWithDcgmNamesAndLabels) {
  MetricsRegistry r;
  auto t = Make(&r);
  ASSERT_TRUE(t->available()) << t->reason();
  t->SampleOnce();
  const std::string text = r.ExposeText();
  const std::vector<std::string> labels = {"gpu=\"0\"",
                                           "UUID=\"GPU-fake-0000\"",
                                           "modelName=\"NVIDIA Fake H200\"",
                                           "pci_bus_id=\"00000000:19:00.0\"",
                                           "device=\"nvidia0\"",
                                           "Hostname=\""};
  EXPECT_THAT(text, HasSubstr("\nstoke_gpu_telemetry_available 1"));
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_USED", labels), 10240.0) << text;
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_TOTAL", labels), 81920.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_RESERVED", labels), 512.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_FREE", labels), 81920.0 - 512 - 10240);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_SM_CLOCK", labels), 1500.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_MEM_CLOCK", labels), 2619.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_POWER_USAGE", labels), 250.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_POWER_USAGE_INSTANT", labels), 260.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", labels), 700.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels), 123456789.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_GPU_TEMP", labels), 45.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_MEMORY_TEMP", labels), 50.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_GPU_UTIL", labels), 87.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_MEM_COPY_UTIL", labels), 31.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", labels), 1000.0);  // no GPM: the NVML counter
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", labels), 2000.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", labels), 36.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_POWER_VIOLATION", labels), 2e9);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", labels), 7.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", labels), 3.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", labels), 0.0);
  EXPECT_EQ(Find(text, "stoke_gpu_clocks_event_reason", {"gpu=\"0\"", "reason=\"sw_power_cap\""}), 1.0);
  EXPECT_EQ(Find(text, "stoke_gpu_clocks_event_reason", {"gpu=\"0\"", "reason=\"sw_thermal_slowdown\""}),
            1.0);
  EXPECT_EQ(Find(text, "stoke_gpu_clocks_event_reason", {"gpu=\"0\"", "reason=\"gpu_idle\""}), 0.0);
  EXPECT_EQ(Find(text, "stoke_gpu_clocks_event_reason", {"gpu=\"0\"", "reason=\"hw_slowdown\""}), 0.0);
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_")));  // GPM unsupported
  EXPECT_THAT(text, HasSubstr("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"));

  const GpuSnapshot s = t->Snapshot();
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_FALSE(s.devices[0].gpm_supported);
  EXPECT_THAT(s.devices[0].gpm_note, HasSubstr("not supported"));
  EXPECT_EQ(s.driver_version, "999.99-fake");
  EXPECT_EQ(s.samples, 1);
}

TEST_F(FakeNvmlTest, GpmMetricsNeedTwoSamplesAndSkipFailedIds) {
  setenv("FAKE_NVML_GPM", "1", 1);
  MetricsRegistry r;
  auto t = Make(&r);
  ASSERT_TRUE(t->available()) << t->reason();
  t->SampleOnce();
  std::string text = r.ExposeText();
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_")));  // one sample: no interval yet
  EXPECT_THAT(text,
              Not(HasSubstr("DCGM_FI_DEV_PCIE_TX_THROUGHPUT")));  // GPM has PCIe: the 20 ms call is skipped
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  t->SampleOnce();
  text = r.ExposeText();
  const std::vector<std::string> gpu0 = {"gpu=\"0\"", "UUID=\"GPU-fake-0000\""};
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu0), 0.8) << text;
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_SM_ACTIVE", gpu0), 0.6);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_SM_OCCUPANCY", gpu0), 0.25);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu0), 0.4);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", gpu0), 0.35);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_DRAM_ACTIVE", gpu0), 0.55);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", gpu0), 0.12);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_PCIE_TX_BYTES", gpu0), 100.0 * 1024 * 1024);
  EXPECT_EQ(Find(text, "DCGM_FI_PROF_PCIE_RX_BYTES", gpu0), 200.0 * 1024 * 1024);
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE")));  // per-metric failure: absent
  const GpuSnapshot s = t->Snapshot();
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_TRUE(s.devices[0].gpm_supported);
  EXPECT_GT(s.devices[0].gpm_interval_s, 0.1);
  EXPECT_LT(s.devices[0].gpm_interval_s, 600.0);  // seconds: a sane interval, whatever the machine's load

  // A tick sooner than 100 ms after the last GPM sample keeps the last interval's values.
  t->SampleOnce();
  EXPECT_EQ(Find(r.ExposeText(), "DCGM_FI_PROF_SM_ACTIVE", gpu0), 0.6);

  // GPM failing later: the PROF series leave /metrics.
  setenv("FAKE_NVML_FAIL", "gpm_metrics", 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  t->SampleOnce();
  text = r.ExposeText();
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_SM_ACTIVE{")));
  EXPECT_TRUE(Find(text, "DCGM_FI_DEV_FB_USED", gpu0).has_value());
}

TEST_F(FakeNvmlTest, FailingQueriesLeaveTheirMetricsAbsent) {
  MetricsRegistry r;
  auto t = Make(&r);
  ASSERT_TRUE(t->available());
  t->SampleOnce();
  ASSERT_THAT(r.ExposeText(), HasSubstr("DCGM_FI_DEV_POWER_USAGE{"));
  setenv("FAKE_NVML_FAIL", "power,temperature,reasons,fields", 1);
  t->SampleOnce();
  const std::string text = r.ExposeText();
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_POWER_USAGE{")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_GPU_TEMP{")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_CLOCKS_EVENT_REASONS{")));
  EXPECT_THAT(text, Not(HasSubstr("stoke_gpu_clocks_event_reason{")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_POWER_USAGE_INSTANT{")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_MEMORY_TEMP{")));
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", {"gpu=\"0\""}), 700.0);  // the rest still there
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_GPU_UTIL", {"gpu=\"0\""}), 87.0);
  const GpuSnapshot s = t->Snapshot();
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_EQ(s.devices[0].values.count("DCGM_FI_DEV_POWER_USAGE"), 0u);
  EXPECT_FALSE(s.devices[0].clocks_event_reasons.has_value());
  // Recovery: the series come back.
  unsetenv("FAKE_NVML_FAIL");
  t->SampleOnce();
  EXPECT_EQ(Find(r.ExposeText(), "DCGM_FI_DEV_POWER_USAGE", {"gpu=\"0\""}), 250.0);
}

TEST_F(FakeNvmlTest, TwoGpusAreLabelledApart) {
  setenv("FAKE_NVML_DEVICES", "2", 1);
  MetricsRegistry r;
  auto t = Make(&r);
  ASSERT_TRUE(t->available());
  t->SampleOnce();
  const std::string text = r.ExposeText();
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_USED", {"gpu=\"0\"", "UUID=\"GPU-fake-0000\""}), 10240.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_FB_USED", {"gpu=\"1\"", "UUID=\"GPU-fake-0001\"", "device=\"nvidia1\""}),
            11264.0);
  EXPECT_EQ(Find(text, "DCGM_FI_DEV_SM_CLOCK", {"gpu=\"1\""}), 1501.0);
}

TEST_F(FakeNvmlTest, SnapshotJsonAndTable) {
  setenv("FAKE_NVML_GPM", "1", 1);
  auto t = Make(nullptr);  // no registry (stoke gpu)
  ASSERT_TRUE(t->available());
  t->SampleOnce();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  t->SampleOnce();
  auto j = nlohmann::json::parse(t->SnapshotJson());
  EXPECT_EQ(j["available"], true);
  EXPECT_EQ(j["driver_version"], "999.99-fake");
  EXPECT_EQ(j["samples"], 2);
  ASSERT_EQ(j["devices"].size(), 1u);
  const auto& d = j["devices"][0];
  EXPECT_EQ(d["gpu"], 0);
  EXPECT_EQ(d["uuid"], "GPU-fake-0000");
  EXPECT_EQ(d["model_name"], "NVIDIA Fake H200");
  EXPECT_EQ(d["gpm_supported"], true);
  EXPECT_EQ(d["metrics"]["DCGM_FI_DEV_FB_USED"], 10240.0);
  EXPECT_EQ(d["metrics"]["DCGM_FI_PROF_SM_ACTIVE"], 0.6);
  EXPECT_FALSE(d["metrics"].contains("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE"));
  EXPECT_EQ(d["clocks_event_reasons"], nlohmann::json({"sw_power_cap", "sw_thermal_slowdown"}));
  const std::string table = GpuSnapshotTable(t->Snapshot());
  EXPECT_THAT(table, HasSubstr("GPU 0: NVIDIA Fake H200"));
  EXPECT_THAT(table, HasSubstr("GPM: on"));
  EXPECT_THAT(table, HasSubstr("DCGM_FI_PROF_SM_ACTIVE"));
  EXPECT_THAT(table, HasSubstr("sw_power_cap"));
}

// The sampler thread ticks every interval and never faster; Stop() ends it. No bound on how soon ticks come
// (a busy CI machine may delay the thread): the test waits for them, and checks only the "never faster" side,
// which no amount of load can break.
TEST_F(FakeNvmlTest, SamplerThreadTicksEachInterval) {
  MetricsRegistry r;
  auto t = Make(&r, 100);
  ASSERT_TRUE(t->available());
  const auto t0 = std::chrono::steady_clock::now();
  t->Start();
  const auto deadline = t0 + std::chrono::seconds(60);
  while (t->Snapshot().samples < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  t->Stop();
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n = t->Snapshot().samples;
  EXPECT_GE(n, 3) << "the sampler thread did not tick in 60 s";
  // One sample at start, then one per 100 ms at most.
  EXPECT_LE(n, 1 + static_cast<int64_t>(elapsed_ms / 100)) << n << " samples in " << elapsed_ms << " ms";
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(t->Snapshot().samples, n);  // stopped
  EXPECT_THAT(r.ExposeText(), HasSubstr("DCGM_FI_DEV_GPU_UTIL{"));
}

TEST(ClocksEventReasonNamesTest, DecodesKnownAndUnknownBits) {
  EXPECT_THAT(ClocksEventReasonNames(0), ElementsAre());
  EXPECT_THAT(ClocksEventReasonNames(0x1), ElementsAre("gpu_idle"));
  EXPECT_THAT(ClocksEventReasonNames(0x4 | 0x8 | 0x80),
              ElementsAre("sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown"));
  EXPECT_THAT(ClocksEventReasonNames(0x1000 | 0x40), ElementsAre("hw_thermal_slowdown", "0x1000"));
}

}  // namespace
}  // namespace stoke
