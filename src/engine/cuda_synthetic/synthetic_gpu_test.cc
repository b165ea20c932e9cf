// The synthetic model on the GPU: outputs equal the CPU's, kernel time follows the configured FLOPs and
// bytes, pinned staging beats pageable, two instances (streams) overlap. Label `gpu`: skips without a device.
// Each test prints its measurements (the GPU run's record).
#include "engine/cuda_synthetic/synthetic_gpu.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "engine/model/backends.h"
#include "kernels/cuda/device.h"

namespace stoke {
namespace {

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (::stoke::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)

std::shared_ptr<const SyntheticModel> Model(const std::string& text) {
  auto c = SyntheticConfig::FromJson(nlohmann::json::parse(text), "test");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::make_shared<const SyntheticModel>(c.ok() ? *c : SyntheticConfig{});
}

std::unique_ptr<SyntheticRunner> Runner(std::shared_ptr<const SyntheticModel> m, int64_t max_rows = 1) {
  auto r = NewSyntheticCudaRunner(std::move(m), max_rows);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Runs `n` batches of `rows` zero rows; returns the last batch's times.
SyntheticTimes RunN(SyntheticRunner& r, const SyntheticModel& m, int64_t rows, int n) {
  std::vector<uint8_t> in(static_cast<size_t>(rows * m.config().input_bytes)), out;
  SyntheticTimes t;
  for (int i = 0; i < n; ++i) {
    Status s = r.Run(in.data(), rows, &out, &t);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return t;
}

double Ms(Nanos ns) {
  return static_cast<double>(ns) / 1e6;
}

TEST(SyntheticGpuPlanTest, BlocksGrowWithWorkUpToTheCap) {
  SynthLaunchPlan tiny = PlanSynthLaunch(2e3, 4096, 0, 1056);
  EXPECT_EQ(tiny.blocks, 1);
  EXPECT_EQ(tiny.fma_iters, 1);
  EXPECT_EQ(tiny.region_float4s, 4096 / 2 / 16);
  SynthLaunchPlan big = PlanSynthLaunch(2e11, 0, 0, 1056);
  EXPECT_EQ(big.blocks, 1056);
  // At least the configured FLOPs, at most one iteration per thread more.
  const double done = 16.0 * big.fma_iters * big.blocks * 256;
  EXPECT_GE(done, 2e11);
  EXPECT_LT(done, 2e11 + 16.0 * big.blocks * 256);
  SynthLaunchPlan capped = PlanSynthLaunch(2e11, 0, 8, 1056);
  EXPECT_EQ(capped.blocks, 8);
  EXPECT_GE(16.0 * capped.fma_iters * 8 * 256, 2e11);
  SynthLaunchPlan mem = PlanSynthLaunch(0, double(1 << 30), 0, 1056);
  EXPECT_EQ(mem.fma_iters, 0);
  EXPECT_EQ(mem.region_float4s, (int64_t{1} << 29) / 16);
  EXPECT_EQ(mem.blocks, 1056);
}

TEST(SyntheticGpuTest, BackendServesDeviceCuda) {
  SKIP_WITHOUT_GPU();
  Backends backends = CpuBackends();
  backends.cuda_synthetic = CudaSyntheticBackend();
  auto m = Model(R"({"input_bytes": 8, "output_bytes": 8, "device": "cuda"})");
  auto r = NewSyntheticRunner(m, 4, backends);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->device(), "cuda");
  auto a = Model(R"({"input_bytes": 8, "output_bytes": 8, "device": "auto"})");
  auto ra = NewSyntheticRunner(a, 4, backends);
  ASSERT_TRUE(ra.ok()) << ra.status().ToString();
  EXPECT_EQ((*ra)->device(), "cuda");
  auto rc = NewSyntheticRunner(a, 4, CpuBackends());  // "auto" without the CUDA backend: the CPU
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ((*rc)->device(), "cpu");
}

TEST(SyntheticGpuTest, OutputsEqualTheCpuModelForEveryBatchSize) {
  SKIP_WITHOUT_GPU();
  for (const char* buffers : {"pinned", "pageable"}) {
    for (const char* kernels :
         {R"([{"count": 3, "flops_per_item": 1e6, "bytes": 1e6, "blocks": 4}])", "[]"}) {
      auto m = Model(fmt::format(
          R"({{"input_bytes": 37, "output_bytes": 100, "buffers": "{}", "kernels": {}}})", buffers, kernels));
      auto gpu = Runner(m, 4);
      ASSERT_NE(gpu, nullptr);
      auto ws = m->NewWorkspace();
      std::mt19937 rng(7);
      for (int64_t rows : {1, 3, 4, 6}) {  // 6 > max_rows: the buffers grow
        std::vector<uint8_t> in(static_cast<size_t>(rows * 37));
        for (uint8_t& b : in) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> want, got;
        SyntheticTimes t;
        ASSERT_TRUE(m->Run(in.data(), rows, &want, *ws, &t).ok());
        Status s = gpu->Run(in.data(), rows, &got, &t);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_EQ(got, want) << buffers << " " << kernels << " rows " << rows;
        EXPECT_GT(t.h2d, 0);
        EXPECT_GT(t.compute, 0);
        EXPECT_GT(t.d2h, 0);
      }
    }
  }
}

TEST(SyntheticGpuTest, CpuStagesSpendTheConfiguredTime) {
  SKIP_WITHOUT_GPU();
  auto m = Model(R"({"input_bytes": 64, "output_bytes": 64, "preprocess_us_per_item": 2000,
                     "postprocess_us": 3000, "kernels": [{"count": 1, "flops": 1e6}]})");
  auto r = Runner(m, 2);
  ASSERT_NE(r, nullptr);
  SyntheticTimes t = RunN(*r, *m, 2, 2);
  std::printf("  [cpu stages] preprocess %.2f ms (want >= 4), postprocess %.2f ms (want >= 3)\n",
              Ms(t.preprocess), Ms(t.postprocess));
  EXPECT_GE(t.preprocess, 4'000'000);
  EXPECT_GE(t.postprocess, 3'000'000);
  EXPECT_LT(t.compute, 4'000'000);  // 1 MFLOP is microseconds on a GPU, whatever the CPU stages cost
}

TEST(SyntheticGpuTest, KernelTimeScalesWithFlops) {
  SKIP_WITHOUT_GPU();
  double ms[2];
  const double flops[2] = {5e10, 2e11};
  for (int i = 0; i < 2; ++i) {
    auto m = Model(fmt::format(R"({{"input_bytes": 16, "output_bytes": 16,
                                    "kernels": [{{"count": 4, "flops": {}}}]}})",
                               flops[i]));
    auto r = Runner(m);
    ASSERT_NE(r, nullptr);
    ms[i] = Ms(RunN(*r, *m, 1, 3).compute);
    std::printf("  [flops] %.0e FLOPs x 4 launches: %.3f ms, %.1f TFLOP/s\n", flops[i], ms[i],
                4 * flops[i] / (ms[i] * 1e-3) / 1e12);
  }
  const double ratio = ms[1] / ms[0];
  std::printf("  [flops] time ratio %.2f for 4x the FLOPs\n", ratio);
  EXPECT_GT(ratio, 2.0);
  EXPECT_LT(ratio, 8.0);
  const double tflops = 4 * flops[1] / (ms[1] * 1e-3) / 1e12;
  EXPECT_GT(tflops, 1.0);    // a compute-bound kernel, not a stalled one
  EXPECT_LT(tflops, 200.0);  // no fp32 FMA pipe does more: the work was not optimised away
}

TEST(SyntheticGpuTest, KernelTimeScalesWithBytes) {
  SKIP_WITHOUT_GPU();
  double ms[2];
  const double bytes[2] = {512.0 * (1 << 20), 2048.0 * (1 << 20)};  // well above the L2 cache
  for (int i = 0; i < 2; ++i) {
    auto m = Model(fmt::format(R"({{"input_bytes": 16, "output_bytes": 16,
                                    "kernels": [{{"count": 4, "bytes": {}}}]}})",
                               bytes[i]));
    auto r = Runner(m);
    ASSERT_NE(r, nullptr);
    ms[i] = Ms(RunN(*r, *m, 1, 3).compute);
    std::printf("  [bytes] %.0f MiB x 4 launches: %.3f ms, %.0f GB/s\n", bytes[i] / (1 << 20), ms[i],
                4 * bytes[i] / (ms[i] * 1e-3) / 1e9);
  }
  const double ratio = ms[1] / ms[0];
  std::printf("  [bytes] time ratio %.2f for 4x the bytes\n", ratio);
  EXPECT_GT(ratio, 2.0);
  EXPECT_LT(ratio, 8.0);
  const double gbs = 4 * bytes[1] / (ms[1] * 1e-3) / 1e9;
  EXPECT_GT(gbs, 100.0);
  EXPECT_LT(gbs, 10000.0);  // more than any HBM: the traffic did not happen
}

TEST(SyntheticGpuPlanTest, TensorPlanCoversTheFlops) {
  SynthTensorPlan none = PlanSynthTensor(0, 0, 1056);
  EXPECT_EQ(none.iters, 0);
  SynthTensorPlan big = PlanSynthTensor(1e12, 0, 1056);
  EXPECT_EQ(big.blocks, 1056);
  EXPECT_GE(kTensorFlopsPerWarpIter * big.iters * big.blocks * 8, 1e12);
  SynthTensorPlan capped = PlanSynthTensor(1e12, 4, 1056);
  EXPECT_EQ(capped.blocks, 4);
  EXPECT_GE(kTensorFlopsPerWarpIter * capped.iters * 4 * 8, 1e12);
}

// The tensor-core kernel: outputs as on the CPU, and a rate no FMA pipe reaches (H200 fp32 FMA peak ~67
// TFLOP/s; dense fp16 tensor ~990): the work ran on the tensor cores and was not optimised away.
TEST(SyntheticGpuTest, TensorKernelsRunOnTheTensorCores) {
  SKIP_WITHOUT_GPU();
  auto m = Model(R"({"input_bytes": 16, "output_bytes": 16, "kernels": [{"count": 4, "flops": 2e12,
                     "tensor": true}]})");
  auto r = Runner(m);
  ASSERT_NE(r, nullptr);
  std::vector<uint8_t> in(16), got;
  for (size_t k = 0; k < in.size(); ++k) in[k] = static_cast<uint8_t>(k * 5 + 1);
  SyntheticTimes t;
  ASSERT_TRUE(r->Run(in.data(), 1, &got, &t).ok());
  ASSERT_EQ(got.size(), 16u);
  for (size_t k = 0; k < 16; ++k) EXPECT_EQ(got[k], in[k] ^ 0x5A);  // (the CPU model would burn 8e12 FLOPs)
  const double ms = Ms(RunN(*r, *m, 1, 3).compute);
  const double tflops = 4 * 2e12 / (ms * 1e-3) / 1e12;
  std::printf("  [tensor] 2e12 FLOPs x 4 launches: %.3f ms, %.0f TFLOP/s\n", ms, tflops);
  EXPECT_GT(tflops, 100.0);
  EXPECT_LT(tflops, 2000.0);
}

// "h2d_bytes_per_item": the copy moves the expanded rows (64 MiB per row here), the output is still the
// per-row function of the packed inputs.
TEST(SyntheticGpuTest, ExpandedH2dCopiesTheExpandedRows) {
  SKIP_WITHOUT_GPU();
  double ms[2];
  for (int i = 0; i < 2; ++i) {
    auto m = Model(fmt::format(R"({{"input_bytes": 64, "output_bytes": 32, "buffers": "pageable",
                                    "h2d_bytes_per_item": {}}})",
                               i == 0 ? 0 : 64 << 20));
    auto r = Runner(m, 2);
    ASSERT_NE(r, nullptr);
    std::vector<uint8_t> in(128), got, want;
    for (size_t k = 0; k < in.size(); ++k) in[k] = static_cast<uint8_t>(k * 13);
    SyntheticTimes t;
    auto ws = m->NewWorkspace();
    ASSERT_TRUE(m->Run(in.data(), 2, &want, *ws, &t).ok());
    ASSERT_TRUE(r->Run(in.data(), 2, &got, &t).ok());
    EXPECT_EQ(got, want);
    ms[i] = Ms(RunN(*r, *m, 2, 3).h2d);
    std::printf("  [h2d expanded] %s: %.3f ms\n", i == 0 ? "64 B rows" : "64 MiB rows", ms[i]);
  }
  EXPECT_GT(ms[1], 10 * ms[0]);  // 128 MiB vs 128 B: the bytes crossed
}

TEST(SyntheticGpuTest, PinnedH2dIsFasterThanPageable) {
  SKIP_WITHOUT_GPU();
  const int64_t kBytes = 64 << 20;
  double ms[2];
  const char* kinds[2] = {"pinned", "pageable"};
  for (int i = 0; i < 2; ++i) {
    auto m =
        Model(fmt::format(R"({{"input_bytes": {}, "output_bytes": 16, "buffers": "{}"}})", kBytes, kinds[i]));
    auto r = Runner(m);
    ASSERT_NE(r, nullptr);
    ms[i] = Ms(RunN(*r, *m, 1, 3).h2d);
    std::printf("  [h2d] 64 MiB %s: %.3f ms, %.1f GB/s\n", kinds[i], ms[i], kBytes / (ms[i] * 1e-3) / 1e9);
  }
  EXPECT_LT(ms[0], ms[1]);
}

TEST(SyntheticGpuTest, TwoInstancesOnTwoStreamsOverlap) {
  SKIP_WITHOUT_GPU();
  // Few blocks: one batch leaves most SMs idle, so a second stream's batch can run beside it.
  auto m = Model(R"({"input_bytes": 1024, "output_bytes": 1024, "buffers": "pinned",
                     "kernels": [{"count": 2, "flops": 2e10, "blocks": 8}]})");
  auto a = Runner(m), b = Runner(m);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  RunN(*a, *m, 1, 1);  // warm up both (module load, first launches)
  RunN(*b, *m, 1, 1);
  auto wall = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const double one = wall([&] { RunN(*a, *m, 1, 1); });
  const double two = wall([&] {
    std::thread ta([&] { RunN(*a, *m, 1, 1); });
    std::thread tb([&] { RunN(*b, *m, 1, 1); });
    ta.join();
    tb.join();
  });
  std::printf("  [overlap] one batch %.2f ms, two concurrent batches %.2f ms (%.2fx)\n", one, two, two / one);
  EXPECT_GT(one, 1.0) << "the batch is too short to show overlap";
  EXPECT_LT(two, 1.6 * one);
}

}  // namespace
}  // namespace stoke
