// LoadCnnOnDevice picks the device from the Backends value it is given: the CPU value never reaches a GPU,
// a fake CUDA value gets the model and the options.
#include "engine/model/cnn_backend.h"

#include <gtest/gtest.h>

#include "engine/model/backends.h"

namespace stoke {
namespace {

struct Calls {
  int creates = 0;
  std::string precision;
  std::string conv_backend;
};
Calls g_calls;
bool g_visible = true;

class NoDevice final : public CnnDeviceModel {
 public:
  std::string device_name() const override { return "fake"; }
  StatusOr<std::unique_ptr<CnnDeviceRunner>> CreateRunner() override { return UnimplementedError("fake"); }
};

StatusOr<std::shared_ptr<CnnDeviceModel>> FakeCreate(std::shared_ptr<const cnn::CnnModel>,
                                                     const CnnDeviceOptions& o) {
  ++g_calls.creates;
  g_calls.precision = o.precision;
  g_calls.conv_backend = o.conv_backend;
  return std::shared_ptr<CnnDeviceModel>(std::make_shared<NoDevice>());
}
bool FakeVisible() {
  return g_visible;
}

// The backend refuses a null model before it reaches `create`; this one is never run.
std::shared_ptr<const cnn::CnnModel> AnyModel() {
  return std::shared_ptr<const cnn::CnnModel>(reinterpret_cast<const cnn::CnnModel*>(8), [](auto*) {});
}

TEST(CnnBackendTest, CpuValueKeepsTheCpuAndRefusesCuda) {
  auto a = LoadCnnOnDevice(AnyModel(), {.device = "auto"}, CpuBackends());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, nullptr);
  auto c = LoadCnnOnDevice(AnyModel(), {.device = "cuda"}, CpuBackends());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("built without CUDA"), std::string::npos) << c.status().message();
  EXPECT_EQ(LoadCnnOnDevice(AnyModel(), {.device = "npu"}, CpuBackends()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadCnnOnDevice(AnyModel(), {.device = "cpu", .precision = "fp8"}, CpuBackends()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(CnnBackendTest, FakeCudaValueGetsTheModel) {
  Backends fake = CpuBackends();
  fake.cuda_cnn = {.create = &FakeCreate, .available = &FakeVisible};
  g_calls = {};
  g_visible = true;
  auto a = LoadCnnOnDevice(AnyModel(), {.device = "auto", .precision = "bf16"}, fake);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_NE(*a, nullptr);
  EXPECT_EQ(g_calls.creates, 1);
  EXPECT_EQ(g_calls.precision, "bf16");
  auto cpu = LoadCnnOnDevice(AnyModel(), {.device = "cpu"}, fake);  // an explicit cpu stays there
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, nullptr);
  g_visible = false;  // compiled in, no GPU: auto falls back, cuda says why
  auto a2 = LoadCnnOnDevice(AnyModel(), {.device = "auto"}, fake);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(*a2, nullptr);
  auto c = LoadCnnOnDevice(AnyModel(), {.device = "cuda"}, fake);
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("no CUDA GPU is visible"), std::string::npos);
  EXPECT_EQ(g_calls.creates, 1);
}

// --conv-backend: passed to the device; refused when unknown, and when the model stays on the CPU (the
// choice is the GPU executor's: a usage error beats a flag silently ignored).
TEST(CnnBackendTest, ConvBackendReachesTheDeviceAndIsRefusedOnTheCpu) {
  Backends fake = CpuBackends();
  fake.cuda_cnn = {.create = &FakeCreate, .available = &FakeVisible};
  g_calls = {};
  g_visible = true;
  auto a = LoadCnnOnDevice(AnyModel(), {.device = "cuda", .conv_backend = "im2col"}, fake);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(g_calls.conv_backend, "im2col");
  auto bad = LoadCnnOnDevice(AnyModel(), {.device = "cuda", .conv_backend = "winograd"}, fake);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("expected auto, cudnn or im2col"), std::string::npos);
  for (const char* backend : {"cudnn", "im2col"}) {
    auto cpu = LoadCnnOnDevice(AnyModel(), {.device = "cpu", .conv_backend = backend}, CpuBackends());
    EXPECT_EQ(cpu.status().code(), StatusCode::kInvalidArgument) << backend;
    EXPECT_NE(cpu.status().message().find("--device cuda"), std::string::npos) << cpu.status().message();
  }
  auto cpu_auto = LoadCnnOnDevice(AnyModel(), {.device = "cpu", .conv_backend = "auto"}, CpuBackends());
  ASSERT_TRUE(cpu_auto.ok());
  EXPECT_EQ(*cpu_auto, nullptr);
  EXPECT_EQ(g_calls.creates, 1);
}

}  // namespace
}  // namespace stoke
