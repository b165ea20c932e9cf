// CudaBert vs the CPU BertEncoder on small random BERTs (and all-MiniLM-L6-v2 when it is in the model dir):
// cosine per sequence, variable lengths mixed in one batch, independence from batch mates, two runners on two
// streams at once, errors, timings. Every figure is printed (the GPU run's log is the record). Skips without
// a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/cuda/cuda_backends.h"
#include "engine/cuda/cuda_bert.h"
#include "engine/loader/model_registry.h"
#include "engine/model/bert.h"
#include "engine/model/bert_int8.h"
#include "engine/model/bert_test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cuda/device.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (::stoke::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)

std::vector<std::vector<int32_t>> RandomBatch(const std::vector<int>& lens, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(1, vocab - 1);
  std::vector<std::vector<int32_t>> b;
  for (int n : lens) {
    std::vector<int32_t> s(n);
    for (int32_t& x : s) x = id(rng);
    b.push_back(std::move(s));
  }
  return b;
}

double Cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

struct Loaded {
  std::shared_ptr<const BertEncoder> cpu;
  std::shared_ptr<BertDeviceModel> gpu;
};

Loaded Load(const fs::path& dir) {
  Loaded l;
  auto enc = BertEncoder::Load(dir.string());
  EXPECT_TRUE(enc.ok()) << enc.status().ToString();
  if (!enc.ok()) return l;
  l.cpu = std::move(enc).value();
  auto dev = CreateCudaBert(l.cpu, BertDeviceOptions{});
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  if (dev.ok()) l.gpu = std::move(dev).value();
  return l;
}

// Embeds `batch` on both; returns the minimum cosine and checks each >= min_cos.
double ExpectMatchesCpu(const Loaded& l, const std::vector<std::vector<int32_t>>& batch, double min_cos,
                        const char* what) {
  std::vector<float> want, got;
  EXPECT_TRUE(l.cpu->Embed(batch, &want).ok());
  auto runner = l.gpu->CreateRunner();
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return 0;
  EmbedTimes times;
  const Status st = (*runner)->Embed(batch, &got, &times);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return 0;
  const int64_t h = l.cpu->hidden_size();
  EXPECT_EQ(got.size(), want.size());
  double worst = 1.0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const double c = Cosine(got.data() + s * h, want.data() + s * h, h);
    size_t nan = 0;
    for (int64_t j = 0; j < h; ++j) nan += std::isnan(got[s * h + j]) ? 1 : 0;
    EXPECT_EQ(nan, 0u) << what << ": sequence " << s;
    EXPECT_GE(c, min_cos) << what << ": sequence " << s << " (length " << batch[s].size() << ")";
    worst = std::min(worst, c);
  }
  std::printf("  [%s] %zu sequences, min cosine %.6f; h2d %.1f us, compute %.1f us, d2h %.1f us\n", what,
              batch.size(), worst, times.h2d_ns / 1e3, times.compute_ns / 1e3, times.d2h_ns / 1e3);
  return worst;
}

// Lengths straddling the attention kernel's 16-query blocks and 64-key tiles, 1 and the maximum, plus one
// longer than max_seq_length (truncated to 160 as on the CPU).
const std::vector<int> kMixedLengths = {1, 2, 5, 15, 16, 17, 63, 64, 65, 100, 128, 129, 150, 160, 200};

TEST(CudaBertTest, MatchesCpuMixedLengthsHeadDim64) {
  SKIP_WITHOUT_GPU();
  const Loaded l = Load(testing::WriteRandomBert(testing::RandomBertShape{}, 1, "hd64"));
  ASSERT_TRUE(l.gpu);
  ExpectMatchesCpu(l, RandomBatch(kMixedLengths, 512, 7), 0.999, "hd64 mixed lengths");
  ExpectMatchesCpu(l, RandomBatch({3}, 512, 8), 0.999, "hd64 single sequence");
}

// Every --encoder-epilogues form against the CPU on the same mixed lengths (fused is the default the tests
// above run; separate keeps an fp32 residual stream; fused-tanh approximates the FFN's erf GELU).
TEST(CudaBertTest, EveryEpilogueFormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 1, "epilogues");
  auto loaded = BertEncoder::Load(dir.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const std::shared_ptr<const BertEncoder> enc = std::move(loaded).value();
  for (const char* e : {"fused", "fused-tanh", "separate"}) {
    Loaded l;
    l.cpu = enc;
    auto dev = CreateCudaBert(l.cpu, BertDeviceOptions{.epilogues = e});
    ASSERT_TRUE(dev.ok()) << e << ": " << dev.status().ToString();
    l.gpu = std::move(dev).value();
    ExpectMatchesCpu(l, RandomBatch(kMixedLengths, 512, 7), 0.999, e);
  }
  EXPECT_FALSE(CreateCudaBert(enc, BertDeviceOptions{.epilogues = "fast"}).ok());
}

TEST(CudaBertTest, MatchesCpuHeadDim32And128) {
  SKIP_WITHOUT_GPU();
  testing::RandomBertShape s32;
  s32.hidden = 96;
  s32.heads = 3;
  s32.inter = 192;
  const Loaded a = Load(testing::WriteRandomBert(s32, 2, "hd32"));
  ASSERT_TRUE(a.gpu);
  ExpectMatchesCpu(a, RandomBatch(kMixedLengths, 512, 9), 0.999, "hd32 mixed lengths");
  testing::RandomBertShape s128;
  s128.hidden = 256;
  s128.heads = 2;
  s128.inter = 512;
  s128.layers = 3;
  const Loaded b = Load(testing::WriteRandomBert(s128, 3, "hd128"));
  ASSERT_TRUE(b.gpu);
  ExpectMatchesCpu(b, RandomBatch(kMixedLengths, 512, 10), 0.999, "hd128 mixed lengths");
}

TEST(CudaBertTest, SequenceIndependentOfBatchMates) {
  SKIP_WITHOUT_GPU();
  const Loaded l = Load(testing::WriteRandomBert(testing::RandomBertShape{}, 4, "mates"));
  ASSERT_TRUE(l.gpu);
  auto runner = l.gpu->CreateRunner();
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  const auto batch = RandomBatch(kMixedLengths, 512, 11);
  std::vector<float> together;
  ASSERT_TRUE((*runner)->Embed(batch, &together, nullptr).ok());
  const int64_t h = l.cpu->hidden_size();
  double max_abs = 0;
  bool bitwise = true;
  for (size_t s = 0; s < batch.size(); ++s) {
    std::vector<float> alone;
    ASSERT_TRUE((*runner)->Embed({batch[s]}, &alone, nullptr).ok());
    for (int64_t j = 0; j < h; ++j) {
      const double d = std::fabs(double(alone[j]) - together[s * h + j]);
      max_abs = std::max(max_abs, d);
      bitwise = bitwise && alone[j] == together[s * h + j];
    }
  }
  std::printf("  [batch mates] alone vs batched: max |diff| %.3e (bitwise equal: %s)\n", max_abs,
              bitwise ? "yes" : "no");
  EXPECT_LE(max_abs, 1e-3);
}

TEST(CudaBertTest, TwoRunnersOnTwoStreamsConcurrently) {
  SKIP_WITHOUT_GPU();
  const Loaded l = Load(testing::WriteRandomBert(testing::RandomBertShape{}, 5, "streams"));
  ASSERT_TRUE(l.gpu);
  const auto a = RandomBatch({40, 7, 150, 64, 65, 1, 99, 128}, 512, 12);
  const auto b = RandomBatch({160, 3, 17, 88, 120, 45}, 512, 13);
  auto r0 = l.gpu->CreateRunner();
  auto r1 = l.gpu->CreateRunner();
  ASSERT_TRUE(r0.ok() && r1.ok());
  std::vector<float> want_a, want_b;
  ASSERT_TRUE((*r0)->Embed(a, &want_a, nullptr).ok());
  ASSERT_TRUE((*r0)->Embed(b, &want_b, nullptr).ok());
  double diff[2] = {0, 0};
  Status err[2];
  auto loop = [&](int i, BertRunner* r, const std::vector<std::vector<int32_t>>& in,
                  const std::vector<float>& want) {
    std::vector<float> got;
    for (int rep = 0; rep < 20; ++rep) {
      Status st = r->Embed(in, &got, nullptr);
      if (!st.ok()) {
        err[i] = st;
        return;
      }
      for (size_t j = 0; j < want.size(); ++j)
        diff[i] = std::max(diff[i], std::fabs(double(got[j]) - want[j]));
    }
  };
  std::thread t0(loop, 0, r0->get(), std::cref(a), std::cref(want_a));
  std::thread t1(loop, 1, r1->get(), std::cref(b), std::cref(want_b));
  t0.join();
  t1.join();
  EXPECT_TRUE(err[0].ok()) << err[0].ToString();
  EXPECT_TRUE(err[1].ok()) << err[1].ToString();
  std::printf("  [two streams] max |diff| vs one runner alone: %.3e, %.3e\n", diff[0], diff[1]);
  // Same shapes on the same weights: the same kernels and GEMM algorithms, so equal up to nothing.
  EXPECT_LE(diff[0], 1e-6);
  EXPECT_LE(diff[1], 1e-6);
  ExpectMatchesCpu(l, a, 0.999, "two streams batch a vs cpu");
}

// --quantization fp8: Linear weights fp8 E4M3 per output channel, activations per token, FP8 GEMMs (W8A8).
// Against the CPU fp32 encoder the embeddings stay close; a quantiser with every scale x1.5 (tests only) moves
// them much further.
TEST(CudaBertTest, Fp8WeightsTrackCpuAndABrokenQuantiserDoesNot) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 21, "fp8");
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  std::shared_ptr<const BertEncoder> cpu = std::move(enc).value();
  const auto batch = RandomBatch(kMixedLengths, 512, 22);
  std::vector<float> want;
  ASSERT_TRUE(cpu->Embed(batch, &want).ok());
  const int64_t h = cpu->hidden_size();
  auto run = [&](float multiplier, double* mean, double* worst) {
    BertDeviceOptions o;
    o.quantization = WeightQuantization::kFp8;
    o.fp8_scale_multiplier = multiplier;
    auto dev = CreateCudaBert(cpu, o);
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    auto runner = (*dev)->CreateRunner();
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    std::vector<float> got;
    const Status st = (*runner)->Embed(batch, &got, nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(got.size(), want.size());
    *mean = 0;
    *worst = 1;
    for (size_t i = 0; i < batch.size(); ++i) {
      const double c = Cosine(got.data() + i * h, want.data() + i * h, h);
      *mean += c / static_cast<double>(batch.size());
      *worst = std::min(*worst, c);
    }
  };
  double mean = 0, worst = 0, bad_mean = 0, bad_worst = 0;
  run(1.0f, &mean, &worst);
  run(1.5f, &bad_mean, &bad_worst);
  std::printf("  [fp8 weights vs cpu fp32] %zu sequences: mean cosine %.6f, worst %.6f; scales x1.5: mean %.6f, "
              "worst %.6f\n",
              batch.size(), mean, worst, bad_mean, bad_worst);
  // Measured on the H200 (2026-12-04): mean 0.998758, worst 0.997359; x1.5: mean 0.794, worst 0.672. W8A8 on
  // this random 2-layer BERT lands just under the encoder gate's mean threshold (0.999), so the gate would
  // refuse it here; the bounds below pin the arithmetic, the gate's verdict on real models is model check's.
  EXPECT_GE(mean, 0.998);
  EXPECT_GE(worst, 0.995);
  EXPECT_LT(bad_mean, 0.95) << "the broken quantiser must move the embeddings far more than fp8 rounding";
}

// --quantization int8 on cuda: the CPU reference's int8 weights and smoothing uploaded as they are, each GEMM
// input quantised on the device as the CPU does (per token, or static), cuBLASLt's exact int8 GEMM. The device's
// inputs are bf16 where the CPU's are fp32, so a few codes round the other way: the device's int8 encoder must
// stay as close to the fp32 one as the CPU's int8 encoder is, and close to the CPU's int8 encoder itself; a
// calibration with every activation scale x0.1 (saturating) must not.
TEST(CudaBertTest, Int8TracksTheCpuInt8ReferenceAndABrokenCalibrationDoesNot) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 23, "int8");
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  std::shared_ptr<const BertEncoder> cpu = std::move(enc).value();
  const auto calibration = RandomBatch({40, 17, 64, 5, 90, 33, 12, 70, 128, 3}, 512, 24);
  const auto batch = RandomBatch(kMixedLengths, 512, 25);
  const int64_t h = cpu->hidden_size();
  std::vector<float> fp32;
  ASSERT_TRUE(cpu->Embed(batch, &fp32).ok());
  auto mean_worst = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double mean = 0, worst = 1;
    for (size_t i = 0; i < batch.size(); ++i) {
      const double c = Cosine(a.data() + i * h, b.data() + i * h, h);
      mean += c / static_cast<double>(batch.size());
      worst = std::min(worst, c);
    }
    return std::pair<double, double>(mean, worst);
  };
  auto on_gpu = [&](const BertActivationRanges& ranges, float multiplier, std::vector<float>* got) {
    BertDeviceOptions o;
    o.quantization = WeightQuantization::kInt8;
    o.int8_ranges = std::make_shared<const BertActivationRanges>(ranges);
    o.int8_activation_scale_multiplier = multiplier;
    auto dev = LoadBertOnDevice(cpu, o, CudaBackends());
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    ASSERT_TRUE(*dev);
    auto runner = (*dev)->CreateRunner();
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    const Status st = (*runner)->Embed(batch, got, nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
  };
  for (Int8Activations a : {Int8Activations::kPerToken, Int8Activations::kStatic}) {
    const char* name = a == Int8Activations::kPerToken ? "per-token" : "static";
    auto ranges = CalibrateBertActivations(*cpu, calibration, {.activations = a});
    ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
    auto ref = BertEncoder::Load(dir.string());
    ASSERT_TRUE(ref.ok());
    ASSERT_TRUE((*ref)->QuantizeWeightsInt8(*ranges).ok());
    std::vector<float> cpu8, gpu8, broken;
    ASSERT_TRUE((*ref)->Embed(batch, &cpu8).ok());
    on_gpu(*ranges, 1.f, &gpu8);
    on_gpu(*ranges, 0.1f, &broken);
    ASSERT_EQ(gpu8.size(), fp32.size());
    const auto [cpu_mean, cpu_worst] = mean_worst(cpu8, fp32);
    const auto [gpu_mean, gpu_worst] = mean_worst(gpu8, fp32);
    const auto [pair_mean, pair_worst] = mean_worst(gpu8, cpu8);
    const auto [bad_mean, bad_worst] = mean_worst(broken, fp32);
    std::printf("  [int8 %s, %zu sequences] vs cpu fp32: cpu int8 mean %.6f worst %.6f, cuda int8 mean %.6f "
                "worst %.6f; cuda vs cpu int8 mean %.6f worst %.6f; scales x0.1 on cuda mean %.6f worst %.6f\n",
                name, batch.size(), cpu_mean, cpu_worst, gpu_mean, gpu_worst, pair_mean, pair_worst, bad_mean,
                bad_worst);
    EXPECT_GE(gpu_mean, cpu_mean - 1e-3) << name;
    EXPECT_GE(pair_mean, 0.998) << name;
    EXPECT_LT(bad_mean, std::min(0.95, cpu_mean - 0.02)) << name << ": the saturating calibration must fail";
  }
  // Without the calibration's ranges int8 cannot run.
  BertDeviceOptions o;
  o.quantization = WeightQuantization::kInt8;
  EXPECT_EQ(CreateCudaBert(cpu, o).status().code(), StatusCode::kInvalidArgument);
}

// --encoder-cuda-graphs on (the default): a shape's first two passes run eagerly (the second is then
// captured), the third on replays the graph. Replays must give the eager pass's bytes, for bf16 with fused epilogues, separate
// epilogues and fp8; other shapes between them must not disturb a graph (each shape has its own), and a
// larger batch that regrows the scratch arena drops the graphs (they point into the old one) and recaptures.
TEST(CudaBertTest, CudaGraphsReplayTheEagerPassBitForBit) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 26, "graphs");
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  std::shared_ptr<const BertEncoder> cpu = std::move(enc).value();
  const auto a = RandomBatch({1, 17, 64, 100}, 512, 27);
  const auto b = RandomBatch({5, 9}, 512, 28);
  const auto big = RandomBatch(std::vector<int>(40, 150), 512, 29);
  for (const char* form : {"fused-tanh", "separate", "fp8"}) {
    BertDeviceOptions eager_o;
    eager_o.cuda_graphs = false;
    if (std::string(form) == "fp8") {
      eager_o.quantization = WeightQuantization::kFp8;
    } else {
      eager_o.epilogues = form;
    }
    BertDeviceOptions graph_o = eager_o;
    graph_o.cuda_graphs = true;
    auto eager_dev = CreateCudaBert(cpu, eager_o);
    auto graph_dev = CreateCudaBert(cpu, graph_o);
    ASSERT_TRUE(eager_dev.ok() && graph_dev.ok()) << graph_dev.status().ToString();
    auto eager = (*eager_dev)->CreateRunner();
    auto graphs = (*graph_dev)->CreateRunner();
    ASSERT_TRUE(eager.ok() && graphs.ok());
    std::vector<float> want_a, want_b, want_big, got;
    ASSERT_TRUE((*eager)->Embed(a, &want_a, nullptr).ok());
    ASSERT_TRUE((*eager)->Embed(b, &want_b, nullptr).ok());
    ASSERT_TRUE((*eager)->Embed(big, &want_big, nullptr).ok());
    EXPECT_EQ((*eager)->graph_launches(), 0);
    // a, a (captured after), b, a (replay), b (captured after), b (replay), a (replay).
    const std::vector<std::pair<const std::vector<std::vector<int32_t>>*, const std::vector<float>*>> order = {
        {&a, &want_a}, {&a, &want_a}, {&b, &want_b}, {&a, &want_a}, {&b, &want_b}, {&b, &want_b}, {&a, &want_a}};
    for (size_t i = 0; i < order.size(); ++i) {
      const Status st = (*graphs)->Embed(*order[i].first, &got, nullptr);
      ASSERT_TRUE(st.ok()) << form << " pass " << i << ": " << st.ToString();
      EXPECT_EQ(got, *order[i].second) << form << " pass " << i << " differs from the eager pass";
    }
    EXPECT_EQ((*graphs)->graph_launches(), 3) << form;
    // A larger batch regrows the arena: the graphs are dropped, and a runs eagerly twice before its next replay.
    ASSERT_TRUE((*graphs)->Embed(big, &got, nullptr).ok());
    EXPECT_EQ(got, want_big) << form;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*graphs)->Embed(a, &got, nullptr).ok());
      EXPECT_EQ(got, want_a) << form << " after the arena grew, pass " << i;
    }
    EXPECT_EQ((*graphs)->graph_launches(), 4) << form;
    std::printf("  [cuda graphs, %s] %lld replays, each equal to the eager pass\n", form,
                static_cast<long long>((*graphs)->graph_launches()));
  }
}

TEST(CudaBertTest, ErrorsAndLimits) {
  SKIP_WITHOUT_GPU();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 6, "errors");
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok());
  std::shared_ptr<const BertEncoder> cpu = std::move(enc).value();
  BertDeviceOptions o;
  o.max_batch_tokens = 100;
  auto dev = CreateCudaBert(cpu, o);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto runner = (*dev)->CreateRunner();
  ASSERT_TRUE(runner.ok());
  std::vector<float> out;
  Status st = (*runner)->Embed({{1, 2}, {}}, &out, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = (*runner)->Embed({{1, 512}}, &out, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("512"), std::string::npos) << st.ToString();
  st = (*runner)->Embed(RandomBatch({60, 60}, 512, 1), &out, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // Still usable after the errors.
  st = (*runner)->Embed(RandomBatch({60, 30}, 512, 1), &out, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<float> want;
  ASSERT_TRUE(cpu->Embed(RandomBatch({60, 30}, 512, 1), &want).ok());
  EXPECT_GE(Cosine(out.data(), want.data(), cpu->hidden_size()), 0.999);
  EXPECT_TRUE((*runner)->Embed({}, &out, nullptr).ok());
  EXPECT_TRUE(out.empty());
}

TEST(CudaBertTest, BackendsValueThroughLoadBertOnDevice) {
  SKIP_WITHOUT_GPU();
  const Backends backends = CudaBackends();
  const fs::path dir = testing::WriteRandomBert(testing::RandomBertShape{}, 7, "registry");
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok());
  std::shared_ptr<const BertEncoder> cpu = std::move(enc).value();
  auto dev = LoadBertOnDevice(cpu, {.device = "auto"}, backends);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE(*dev) << "auto should pick the GPU when one is visible";
  std::printf("  [registry] device: %s\n", (*dev)->device_name().c_str());
  auto none = LoadBertOnDevice(cpu, {.device = "cpu"}, backends);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  EXPECT_EQ(LoadBertOnDevice(cpu, {.device = "tpu"}, backends).status().code(), StatusCode::kInvalidArgument);
  // The CPU-only value never reaches the GPU, even with one visible.
  auto cpu_only = LoadBertOnDevice(cpu, {.device = "auto"}, CpuBackends());
  ASSERT_TRUE(cpu_only.ok());
  EXPECT_FALSE(*cpu_only);
}

TEST(CudaBertTest, MiniLmFiftySentencesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const ModelSpec* spec = FindModelSpec("all-minilm-l6-v2");
  if (spec == nullptr || !ModelPresent(*spec, DefaultModelDir())) {
    GTEST_SKIP() << "all-minilm-l6-v2 not in " << DefaultModelDir();
  }
  const std::string path = ModelEntryPath(*spec, DefaultModelDir());
  const Loaded l = Load(path);
  ASSERT_TRUE(l.gpu);
  auto tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const char* subjects[] = {"The old farmer", "A young engineer", "My neighbour", "The tired doctor",
                            "Our new teacher"};
  const char* verbs[] = {"repaired", "painted", "described", "sold", "carried", "measured", "cleaned"};
  const char* objects[] = {"the broken fence", "a wooden boat", "an ancient map", "the red bicycle",
                           "a heavy suitcase"};
  const char* places[] = {"near the river", "after lunch", "in the rain", "at the market", "on Sunday"};
  EncodeOptions eo;
  eo.add_special = true;
  eo.max_length = l.cpu->max_seq_length();
  std::vector<std::vector<int32_t>> batch;
  for (int i = 0; i < 50; ++i) {
    std::string text = std::string(subjects[i % 5]) + " " + verbs[(i / 5) % 7] + " " + objects[(i * 3) % 5] +
                       " " + places[(i * 7) % 5] + ".";
    for (int r = 0; r < i % 4; ++r) text += " And then " + std::string(objects[(i + r) % 5]) + " again.";
    auto ids = (*tok)->Encode(text, eo);
    ASSERT_TRUE(ids.ok());
    batch.push_back(std::move(ids).value());
  }
  ExpectMatchesCpu(l, batch, 0.999, "all-minilm-l6-v2 50 sentences");
}

}  // namespace
}  // namespace stoke
