// The Backends value is the only way a loader finds a device: a CPU value keeps everything on the CPU (and
// says "built without CUDA" for --device cuda), and a value holding test function pointers is what
// LoadDecoder, ResolveDecoderDevice, LoadBertOnDevice and NewSyntheticRunner call, with no registry between.
#include "engine/model/backends.h"
#include "engine/model/device_choice.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

fs::path WriteTinyHfFolder(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("stoke_backends_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  testing::TinyLlama(3).WriteHfFolder(dir);
  return dir;
}

// ---- a fake CUDA decoder backend: what it was asked, and whether a "GPU" is visible ----

struct FakeDecoderCalls {
  int creates = 0;
  int gpu_index = -1;  // DecoderOptions::gpu_index of the last create
  int num_layers = 0;  // of the weights it was handed
  // --quantization: what the options asked, and whether the weights arrived already rounded (never: the
  // device quantises its own copies).
  WeightQuantization asked = WeightQuantization::kNone;
  WeightQuantization weights = WeightQuantization::kNone;
};
FakeDecoderCalls g_decoder_calls;
bool g_gpu_visible = true;

bool FakeAvailable() {
  return g_gpu_visible;
}

// Builds a CPU model from the weights it is given, so the test can check what reached it.
StatusOr<std::unique_ptr<DecoderModel>> FakeCreateDecoder(LlamaWeights weights,
                                                          const DecoderOptions& options) {
  ++g_decoder_calls.creates;
  g_decoder_calls.gpu_index = options.gpu_index;
  g_decoder_calls.num_layers = weights.config.num_layers;
  g_decoder_calls.asked = options.quantization;
  g_decoder_calls.weights = weights.quantization;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuLlama> model, CpuLlama::Create(std::move(weights), nullptr, false));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

Backends FakeCudaBackends() {
  Backends b = CpuBackends();
  b.cuda_decoder = {.create = &FakeCreateDecoder, .available = &FakeAvailable};
  return b;
}

TEST(BackendsTest, CpuValueHasNoCuda) {
  const Backends cpu = CpuBackends();
  EXPECT_FALSE(cpu.cuda_compiled());
  EXPECT_FALSE(cpu.cuda_usable());
  EXPECT_EQ(ResolveDecoderDevice("auto", cpu), "cpu");
  EXPECT_EQ(ResolveDecoderDevice("cpu", cpu), "cpu");
  EXPECT_EQ(ResolveDecoderDevice("cuda", cpu), "cuda");  // passed through; LoadDecoder says why not
}

// The one device rule every model kind's loader calls.
TEST(BackendsTest, ResolveBackendDeviceSaysWhyCudaCannotBeUsed) {
  auto resolve = [](const std::string& device, bool compiled, bool (*available)()) {
    return ResolveBackendDevice(device, compiled, available, "--device cuda:", "--device cpu");
  };
  g_gpu_visible = true;
  EXPECT_EQ(*resolve("auto", true, &FakeAvailable), "cuda");
  EXPECT_EQ(*resolve("auto", true, nullptr), "cuda");  // no availability check: always
  EXPECT_EQ(*resolve("cuda", true, &FakeAvailable), "cuda");
  EXPECT_EQ(*resolve("cpu", true, &FakeAvailable), "cpu");
  EXPECT_EQ(*resolve("auto", false, nullptr), "cpu");
  const auto unbuilt = resolve("cuda", false, nullptr);
  ASSERT_FALSE(unbuilt.ok());
  EXPECT_EQ(unbuilt.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(unbuilt.status().message().rfind("--device cuda: this stoke was built without CUDA", 0), 0u)
      << unbuilt.status().ToString();
  g_gpu_visible = false;
  EXPECT_EQ(*resolve("auto", true, &FakeAvailable), "cpu");
  const auto hidden = resolve("cuda", true, &FakeAvailable);
  ASSERT_FALSE(hidden.ok());
  EXPECT_EQ(hidden.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(hidden.status().message().find("no CUDA GPU is visible"), std::string::npos);
  EXPECT_NE(hidden.status().message().find("use --device cpu"), std::string::npos);
  g_gpu_visible = true;
  EXPECT_EQ(resolve("tpu", true, &FakeAvailable).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(resolve("", true, &FakeAvailable).status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendsTest, CpuValueRefusesDeviceCudaAndRunsAutoOnTheCpu) {
  const fs::path dir = WriteTinyHfFolder("cpu");
  DecoderOptions o;
  o.device = "cuda";
  auto cuda = LoadDecoder(dir.string(), o, CpuBackends());
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("built without CUDA"), std::string::npos)
      << cuda.status().ToString();

  o.device = "auto";
  auto autod = LoadDecoder(dir.string(), o, CpuBackends());
  ASSERT_TRUE(autod.ok()) << autod.status().ToString();
  EXPECT_EQ((*autod)->device_name().rfind("cpu", 0), 0u) << (*autod)->device_name();

  o.device = "tpu";
  EXPECT_EQ(LoadDecoder(dir.string(), o, CpuBackends()).status().code(), StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST(BackendsTest, LoadDecoderUsesTheDecoderBackendItIsGiven) {
  const fs::path dir = WriteTinyHfFolder("fake");
  const Backends fake = FakeCudaBackends();
  g_decoder_calls = {};
  g_gpu_visible = true;
  EXPECT_TRUE(fake.cuda_compiled());
  EXPECT_TRUE(fake.cuda_usable());
  EXPECT_EQ(ResolveDecoderDevice("auto", fake), "cuda");

  DecoderOptions o;
  o.device = "auto";
  o.gpu_index = 5;
  auto model = LoadDecoder(dir.string(), o, fake);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(g_decoder_calls.creates, 1);
  EXPECT_EQ(g_decoder_calls.gpu_index, 5);
  EXPECT_EQ(g_decoder_calls.num_layers, 2);  // TinyLlama's weights reached the backend

  // The same options with the CPU value never reach the fake: nothing was registered anywhere.
  auto cpu = LoadDecoder(dir.string(), o, CpuBackends());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(g_decoder_calls.creates, 1);

  o.device = "cpu";  // an explicit cpu stays on the CPU even with a usable backend
  ASSERT_TRUE(LoadDecoder(dir.string(), o, fake).ok());
  EXPECT_EQ(g_decoder_calls.creates, 1);
  fs::remove_all(dir);
}

// --quantization fp8: the CPU rounds the weights at load (weight_quant.h); a CUDA backend gets them as
// they are in the file, with the option, and quantises on its device.
TEST(BackendsTest, Fp8WeightsAreRoundedOnTheCpuOnly) {
  const fs::path dir = WriteTinyHfFolder("fp8");
  DecoderOptions o;
  o.device = "cpu";
  o.quantization = WeightQuantization::kFp8;
  auto cpu = LoadDecoder(dir.string(), o, CpuBackends());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*cpu)->quantization_name(), "fp8");
  o.quantization = WeightQuantization::kNone;
  auto plain = LoadDecoder(dir.string(), o, CpuBackends());
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*plain)->quantization_name(), "none");

  g_decoder_calls = {};
  g_gpu_visible = true;
  o.device = "cuda";
  o.quantization = WeightQuantization::kFp8;
  ASSERT_TRUE(LoadDecoder(dir.string(), o, FakeCudaBackends()).ok());
  EXPECT_EQ(g_decoder_calls.creates, 1);
  EXPECT_EQ(g_decoder_calls.asked, WeightQuantization::kFp8);
  EXPECT_EQ(g_decoder_calls.weights, WeightQuantization::kNone);
  fs::remove_all(dir);
}

TEST(BackendsTest, NoVisibleGpuMeansAutoIsCpuAndCudaSaysSo) {
  const fs::path dir = WriteTinyHfFolder("nogpu");
  const Backends fake = FakeCudaBackends();
  g_decoder_calls = {};
  g_gpu_visible = false;
  EXPECT_TRUE(fake.cuda_compiled());
  EXPECT_FALSE(fake.cuda_usable());
  EXPECT_EQ(ResolveDecoderDevice("auto", fake), "cpu");
  DecoderOptions o;
  o.device = "cuda";
  auto cuda = LoadDecoder(dir.string(), o, fake);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("no CUDA GPU is visible"), std::string::npos)
      << cuda.status().ToString();
  o.device = "auto";
  ASSERT_TRUE(LoadDecoder(dir.string(), o, fake).ok());
  EXPECT_EQ(g_decoder_calls.creates, 0);
  g_gpu_visible = true;
  fs::remove_all(dir);
}

// ---- the encoder and synthetic slots ----

class FakeBertDevice final : public BertDeviceModel {
 public:
  std::string device_name() const override { return "fake:0"; }
  StatusOr<std::unique_ptr<BertRunner>> CreateRunner() override {
    return UnimplementedError("fake device has no runner");
  }
};

int g_bert_creates = 0;
StatusOr<std::shared_ptr<BertDeviceModel>> FakeCreateBert(std::shared_ptr<const BertEncoder>,
                                                          const BertDeviceOptions&) {
  ++g_bert_creates;
  return std::shared_ptr<BertDeviceModel>(std::make_shared<FakeBertDevice>());
}

TEST(BackendsTest, LoadBertOnDeviceUsesTheBertBackendItIsGiven) {
  g_bert_creates = 0;
  Backends fake = CpuBackends();
  fake.cuda_bert = {.create = &FakeCreateBert, .available = nullptr};
  auto dev = LoadBertOnDevice(nullptr, {.device = "auto"}, fake);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_NE(*dev, nullptr);
  EXPECT_EQ((*dev)->device_name(), "fake:0");
  EXPECT_EQ(g_bert_creates, 1);

  auto cpu = LoadBertOnDevice(nullptr, {.device = "auto"}, CpuBackends());
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, nullptr);  // the CPU encoder
  auto cuda = LoadBertOnDevice(nullptr, {.device = "cuda"}, CpuBackends());
  EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda.status().message().find("built without CUDA"), std::string::npos)
      << cuda.status().ToString();
  EXPECT_EQ(g_bert_creates, 1);
}

class FakeSyntheticRunner final : public SyntheticRunner {
 public:
  Status Run(const uint8_t*, int64_t, std::vector<uint8_t>*, SyntheticTimes*) override { return OkStatus(); }
  std::string device() const override { return "fake-cuda"; }
};

int64_t g_synthetic_max_rows = 0;
StatusOr<std::unique_ptr<SyntheticRunner>> FakeCreateSynthetic(std::shared_ptr<const SyntheticModel>,
                                                               int64_t max_rows) {
  g_synthetic_max_rows = max_rows;
  return std::unique_ptr<SyntheticRunner>(new FakeSyntheticRunner);
}

TEST(BackendsTest, NewSyntheticRunnerUsesTheSyntheticBackendItIsGiven) {
  auto config = SyntheticConfig::FromJson(nlohmann::json::parse(R"({"device": "auto"})"), "synth.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto model = std::make_shared<const SyntheticModel>(*config);
  Backends fake = CpuBackends();
  fake.cuda_synthetic = {.create = &FakeCreateSynthetic, .available = nullptr};
  g_synthetic_max_rows = 0;
  auto r = NewSyntheticRunner(model, 6, fake);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->device(), "fake-cuda");
  EXPECT_EQ(g_synthetic_max_rows, 6);
  auto cpu = NewSyntheticRunner(model, 6, CpuBackends());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*cpu)->device(), "cpu");
}

}  // namespace
}  // namespace stoke
