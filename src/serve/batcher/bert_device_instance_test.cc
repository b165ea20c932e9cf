// The classic BERT model on a device model (engine/model/bert_backend.h) through the dynamic batcher, with a
// fake device that runs the CPU encoder and reports fixed stage times: one runner per instance, rows split
// back per request, and the runner's h2d / compute / d2h reaching each request's ledger. The CUDA encoder
// itself is tested in engine/cuda/cuda_bert_gpu_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <vector>

#include "engine/model/backends.h"
#include "engine/model/bert_test_util.h"
#include "serve/batcher/bert_classic_model.h"
#include "serve/batcher/dynamic_batcher.h"

namespace stoke {
namespace {

class FakeRunner final : public BertRunner {
 public:
  explicit FakeRunner(std::shared_ptr<const BertEncoder> enc) : enc_(std::move(enc)) {}
  Status Embed(const std::vector<std::vector<int32_t>>& batch, std::vector<float>* out,
               EmbedTimes* times) override {
    RETURN_IF_ERROR(enc_->Embed(batch, out));
    if (times != nullptr) *times = {.prepare_ns = 5, .h2d_ns = 1000, .compute_ns = 2000, .d2h_ns = 3000};
    return OkStatus();
  }

 private:
  std::shared_ptr<const BertEncoder> enc_;
};

class FakeDevice final : public BertDeviceModel {
 public:
  explicit FakeDevice(std::shared_ptr<const BertEncoder> enc) : enc_(std::move(enc)) {}
  std::string device_name() const override { return "fake:0"; }
  StatusOr<std::unique_ptr<BertRunner>> CreateRunner() override {
    ++runners;
    return std::unique_ptr<BertRunner>(new FakeRunner(enc_));
  }
  std::atomic<int> runners{0};

 private:
  std::shared_ptr<const BertEncoder> enc_;
};

InferTensor Int64s(const char* name, const std::vector<int64_t>& v) {
  InferTensor t{name, TensorType::kInt64, {1, static_cast<int64_t>(v.size())}, {}};
  t.data.resize(v.size() * 8);
  std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

TEST(BertDeviceInstanceTest, RunnerPerInstanceAndDeviceStagesInTheLedger) {
  const auto dir = testing::WriteRandomBert(
      {.vocab = 100, .hidden = 32, .heads = 2, .layers = 1, .inter = 64, .max_pos = 40}, 3,
      "device_instance");
  auto loaded = BertEncoder::Load(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<const BertEncoder> enc = std::move(loaded).value();
  auto device = std::make_shared<FakeDevice>(enc);
  auto model = std::make_shared<BertClassicModel>(enc, nullptr, BertInputForm::kTokenIds, 1, device);
  EXPECT_EQ(model->device_name(), "fake:0");
  BatcherConfig cfg;
  // The four one-row requests below fill one batch of 4; the delay is only a backstop (10 s), so they batch
  // together however slowly this machine runs the submitting thread.
  cfg.max_batch_size = 4;
  cfg.instance_count = 2;
  cfg.dynamic_batching = DynamicBatchingOptions{.max_queue_delay_us = 10'000'000};
  auto b = DynamicBatcher::Create({.model_name = "tiny-ids", .config = cfg}, model);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(device->runners.load(), 2);

  const std::vector<std::vector<int64_t>> rows = {{1, 5, 9, 2}, {1, 7, 2}, {1, 3, 4, 5, 6, 7, 8, 2}, {1, 2}};
  std::vector<std::promise<InferResult>> done(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<InferTensor> in = {Int64s("input_ids", rows[i]),
                                   Int64s("attention_mask", std::vector<int64_t>(rows[i].size(), 1))};
    auto n = ValidateInputs(model->signature(), 8, in);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    int64_t tokens = 0;
    auto prepared = model->Prepare(std::move(in), *n, &tokens);
    ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
    auto req = std::make_unique<ClassicRequest>();
    req->input = std::move(prepared).value();
    req->tokens = tokens;
    req->done = [&done, i](InferResult r) { done[i].set_value(std::move(r)); };
    ASSERT_TRUE((*b)->Submit(std::move(req)).ok());
  }
  int64_t max_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    InferResult r = done[i].get_future().get();
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].shape, (std::vector<int64_t>{1, 32}));
    std::vector<float> got(32), want;
    std::memcpy(got.data(), r.outputs[0].data.data(), 32 * 4);
    ASSERT_TRUE(enc->Embed({std::vector<int32_t>(rows[i].begin(), rows[i].end())}, &want).ok());
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(got[j], want[j], 2e-6) << "request " << i << " dim " << j;
    EXPECT_EQ(r.times.exec.h2d, 1000);
    EXPECT_EQ(r.times.exec.compute, 2000);
    EXPECT_EQ(r.times.exec.d2h, 3000);
    EXPECT_GE(r.times.exec.preprocess, 5);
    max_rows = std::max(max_rows, r.times.batch_rows);
  }
  EXPECT_EQ(max_rows, 4);  // one full batch
}

TEST(BertDeviceInstanceTest, LoadBertOnDeviceWithoutABackend) {
  const auto dir = testing::WriteRandomBert(
      {.vocab = 50, .hidden = 16, .heads = 2, .layers = 1, .inter = 32, .max_pos = 20}, 4, "no_backend");
  auto loaded = BertEncoder::Load(dir.string());
  ASSERT_TRUE(loaded.ok());
  std::shared_ptr<const BertEncoder> enc = std::move(loaded).value();
  auto cpu = LoadBertOnDevice(enc, {.device = "cpu"}, CpuBackends());
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, nullptr);
  EXPECT_EQ(LoadBertOnDevice(enc, {.device = "npu"}, CpuBackends()).status().code(),
            StatusCode::kInvalidArgument);
  // The CPU-only Backends value: auto falls back to the CPU, cuda says why it cannot.
  auto a = LoadBertOnDevice(enc, {.device = "auto"}, CpuBackends());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, nullptr);
  auto c = LoadBertOnDevice(enc, {.device = "cuda"}, CpuBackends());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("built without CUDA"), std::string::npos) << c.status().ToString();
}

}  // namespace
}  // namespace stoke
