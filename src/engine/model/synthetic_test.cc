#include "engine/model/synthetic.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

#include "engine/model/backends.h"

namespace stoke {
namespace {

SyntheticConfig Parse(const char* text) {
  auto c = SyntheticConfig::FromJson(nlohmann::json::parse(text), "synth.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : SyntheticConfig{};
}

std::vector<uint8_t> Rows(int64_t rows, int64_t bytes, int seed) {
  std::vector<uint8_t> v(rows * bytes);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
  return v;
}

TEST(SyntheticModelTest, ParsesEveryKey) {
  SyntheticConfig c = Parse(R"({"type": "synthetic", "name": "s", "max_batch_size": 8, "input_bytes": 16,
      "output_bytes": 8, "preprocess_us": 1, "preprocess_us_per_item": 2, "buffers": "pinned", "launch_us": 3,
      "kernels": [{"name": "k", "count": 4, "flops": 10, "flops_per_item": 20, "bytes": 30, "bytes_per_item": 40,
                   "blocks": 16}],
      "postprocess_us": 5, "postprocess_us_per_item": 6, "cpu_scale": 0.5, "device": "cuda"})");
  EXPECT_EQ(c.input_bytes, 16);
  EXPECT_EQ(c.output_bytes, 8);
  EXPECT_TRUE(c.pinned);
  ASSERT_EQ(c.kernels.size(), 1u);
  EXPECT_EQ(c.kernels[0].count, 4);
  EXPECT_EQ(c.kernels[0].bytes_per_item, 40);
  EXPECT_EQ(c.postprocess_us_per_item, 6);
  EXPECT_EQ(c.cpu_scale, 0.5);
  EXPECT_EQ(c.kernels[0].blocks, 16);
  EXPECT_EQ(c.device, "cuda");
  EXPECT_EQ(Parse("{}").device, "cpu");
  EXPECT_FALSE(c.kernels[0].tensor);
  EXPECT_EQ(c.h2d_row_bytes(), 16);  // 0: the input row
}

TEST(SyntheticModelTest, ExpandedCopiesAndTensorKernels) {
  SyntheticConfig c = Parse(R"({"input_bytes": 16, "output_bytes": 8, "h2d_bytes_per_item": 4096,
      "kernels": [{"count": 1, "flops": 1000, "tensor": true}]})");
  EXPECT_EQ(c.h2d_row_bytes(), 4096);
  ASSERT_EQ(c.kernels.size(), 1u);
  EXPECT_TRUE(c.kernels[0].tensor);
  auto below = SyntheticConfig::FromJson(nlohmann::json::parse(R"({"input_bytes": 16, "h2d_bytes_per_item": 8})"),
                                         "x.json");
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.status().message().find("h2d_bytes_per_item"), std::string::npos) << below.status().message();
  auto bad = SyntheticConfig::FromJson(nlohmann::json::parse(R"({"kernels": [{"tensor": 1}]})"), "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'tensor'"), std::string::npos) << bad.status().message();
  // The CPU model still produces the per-row output from the packed inputs.
  SyntheticModel m(c);
  auto ws = m.NewWorkspace();
  std::vector<uint8_t> in = Rows(3, 16, 1), out;
  SyntheticTimes t;
  ASSERT_TRUE(m.Run(in.data(), 3, &out, *ws, &t).ok());
  ASSERT_EQ(out.size(), 24u);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(out[r * 8 + j], in[r * 16 + j] ^ 0x5A);
  EXPECT_GE(ws->device_in.size(), 3u * 4096);  // the copy moved the expanded rows
}

TEST(SyntheticModelTest, ExclusiveSleepsTakeTurns) {
  SyntheticConfig c =
      Parse(R"({"input_bytes": 4, "output_bytes": 4, "sleep_us": 20000, "sleep_us_per_item": 5000,
                                "sleep_exclusive": true})");
  EXPECT_EQ(c.sleep_us, 20000);
  EXPECT_EQ(c.sleep_us_per_item, 5000);
  EXPECT_TRUE(c.sleep_exclusive);
  const SyntheticModel model(c);
  // Two instances run a 2-row batch each at once: one device, so the 30 ms sleeps add up. A floor only (the
  // machine can add time, never remove it).
  const Nanos start = MonotonicNanos();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&model] {
      auto ws = model.NewWorkspace();
      std::vector<uint8_t> in = Rows(2, 4, 1), out;
      SyntheticTimes times;
      ASSERT_TRUE(model.Run(in.data(), 2, &out, *ws, &times).ok());
      EXPECT_GE(times.compute, 30'000'000);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GE(MonotonicNanos() - start, 60'000'000);
  EXPECT_FALSE(SyntheticConfig::FromJson(nlohmann::json::parse(R"({"sleep_exclusive": 1})"), "s.json").ok());
}

TEST(SyntheticModelTest, BadConfigNamesFileAndKey) {
  for (const char* text : {R"({"input_bytes": 0})", R"({"buffers": "huge"})", R"({"preprocess_us": -1})",
                           R"({"kernels": [{"flops": "many"}]})", R"({"kernels": [{"threads": 2}]})",
                           R"({"latency": 5})", R"({"device": "gpu"})", R"({"kernels": [{"blocks": -1}]})"}) {
    auto c = SyntheticConfig::FromJson(nlohmann::json::parse(text), "synth.json");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("synth.json"), std::string::npos) << c.status().message();
  }
}

TEST(SyntheticModelTest, OutputIsPerRowAndBatchIndependent) {
  for (const char* buffers : {"pageable", "pinned"}) {
    SyntheticModel m(
        Parse((std::string(R"({"input_bytes": 5, "output_bytes": 12, "buffers": ")") + buffers +
               R"(", "kernels": [{"count": 2, "flops": 1000, "bytes": 4096, "bytes_per_item": 64}]})")
                  .c_str()));
    auto ws = m.NewWorkspace();
    const std::vector<uint8_t> in = Rows(3, 5, 1);
    std::vector<uint8_t> out;
    SyntheticTimes t;
    ASSERT_TRUE(m.Run(in.data(), 3, &out, *ws, &t).ok());
    ASSERT_EQ(out.size(), 36u);
    for (int64_t r = 0; r < 3; ++r) {
      for (int j = 0; j < 12; ++j) EXPECT_EQ(out[r * 12 + j], in[r * 5 + j % 5] ^ 0x5A);
      std::vector<uint8_t> alone;
      ASSERT_TRUE(m.Run(in.data() + r * 5, 1, &alone, *ws, &t).ok());
      EXPECT_EQ(alone, std::vector<uint8_t>(out.begin() + r * 12, out.begin() + (r + 1) * 12)) << buffers;
    }
  }
}

TEST(SyntheticModelTest, SpendsTheConfiguredCpuTime) {
  SyntheticModel m(Parse(R"({"input_bytes": 4, "output_bytes": 4, "preprocess_us_per_item": 50000,
                             "postprocess_us": 2000, "launch_us": 100, "kernels": [{"count": 10}]})"));
  auto ws = m.NewWorkspace();
  const std::vector<uint8_t> in = Rows(2, 4, 0);
  std::vector<uint8_t> out;
  SyntheticTimes t;
  ASSERT_TRUE(m.Run(in.data(), 2, &out, *ws, &t).ok());
  EXPECT_GE(t.preprocess, 100'000'000);  // 2 rows x 50 ms
  EXPECT_GE(t.compute, 1'000'000);       // 10 launches x 100 us
  EXPECT_GE(t.postprocess, 2'000'000);
  EXPECT_LT(t.h2d, t.preprocess);  // 4 bytes vs 100 ms: the preprocess spin is not in h2d, even on a busy CPU
}

// The CPU-only Backends value: "cpu" and "auto" run on the CPU, "cuda" says why it cannot.
TEST(SyntheticModelTest, RunnerFollowsTheDeviceKey) {
  for (const char* device : {"cpu", "auto"}) {
    auto m = std::make_shared<const SyntheticModel>(Parse(
        (std::string(R"({"input_bytes": 3, "output_bytes": 3, "device": ")") + device + "\"}").c_str()));
    auto r = NewSyntheticRunner(m, 4, CpuBackends());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->device(), "cpu");
    const std::vector<uint8_t> in = {1, 2, 3};
    std::vector<uint8_t> out;
    SyntheticTimes t;
    ASSERT_TRUE((*r)->Run(in.data(), 1, &out, &t).ok());
    EXPECT_EQ(out, (std::vector<uint8_t>{1 ^ 0x5A, 2 ^ 0x5A, 3 ^ 0x5A}));
  }
  auto m = std::make_shared<const SyntheticModel>(Parse(R"({"device": "cuda"})"));
  auto r = NewSyntheticRunner(m, 1, CpuBackends());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("without CUDA"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace stoke
