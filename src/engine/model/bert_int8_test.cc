// --quantization int8 on the CPU encoder (bert_int8.h, BertEncoder::QuantizeWeightsInt8): the percentile
// tracker against sorting, calibration's ranges against the GEMM inputs seen by an observer, the int8 weights
// against the reference row quantiser, the int8 forward close to fp32 and far from it with a broken
// (saturating) calibration, and the errors.
#include "engine/model/bert_int8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "engine/model/bert_test_util.h"
#include "kernels/cpu/int8_gemm.h"

namespace stoke {
namespace {

TEST(AbsPercentileTest, MatchesSortingAtEveryPercentile) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(50000);
  for (float& v : x) v = dist(rng);
  x[123] = -40.f;  // one outlier: the maximum, which a high percentile ignores
  std::vector<float> sorted(x.size());
  std::transform(x.begin(), x.end(), sorted.begin(), [](float v) { return std::fabs(v); });
  std::sort(sorted.begin(), sorted.end());
  for (double p : {100.0, 99.99, 99.9, 90.0, 50.0}) {
    AbsPercentile a(static_cast<int64_t>(x.size()), p);
    for (size_t i = 0; i < x.size(); i += 777) a.Add(x.data() + i, std::min<size_t>(777, x.size() - i));
    const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * x.size()));  // 1-based, ascending
    EXPECT_EQ(a.Value(), sorted[rank - 1]) << p;
  }
  AbsPercentile empty(10, 99.0);
  EXPECT_EQ(empty.Value(), 0.f);
}

class BertInt8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test: ctest runs tests in parallel, and rewriting a mapped file under another is SIGBUS.
    dir_ =
        testing::WriteRandomBert(shape_, 5, ::testing::UnitTest::GetInstance()->current_test_info()->name())
            .string();
    std::mt19937 rng(9);
    std::uniform_int_distribution<int32_t> id(1, shape_.vocab - 1);
    for (int s = 0; s < 12; ++s) {
      std::vector<int32_t> ids(3 + s * 5);
      for (auto& v : ids) v = id(rng);
      samples_.push_back(std::move(ids));
    }
  }
  std::unique_ptr<BertEncoder> Load() {
    auto e = BertEncoder::Load(dir_);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static double MinCosine(const std::vector<float>& a, const std::vector<float>& b, int64_t h) {
    double worst = 1.0;
    for (size_t r = 0; r * h < a.size(); ++r) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t j = 0; j < h; ++j) {
        dot += double{a[r * h + j]} * b[r * h + j];
        na += double{a[r * h + j]} * a[r * h + j];
        nb += double{b[r * h + j]} * b[r * h + j];
      }
      worst = std::min(worst, dot / std::sqrt(na * nb));
    }
    return worst;
  }

  testing::RandomBertShape shape_;
  std::string dir_;
  std::vector<std::vector<int32_t>> samples_;
};

TEST_F(BertInt8Test, AbsMaxCalibrationIsTheLargestInputEachGemmSaw) {
  auto enc = Load();
  ASSERT_NE(enc, nullptr);
  // Independently: the max |x| of each GEMM input over the same samples, embedded in one batch.
  std::vector<std::array<float, kBertGemmInputs>> seen(shape_.layers, {0.f, 0.f, 0.f, 0.f});
  int calls = 0;
  std::vector<float> out;
  ASSERT_TRUE(enc->Embed(samples_, &out, ThreadPool::Default(),
                         [&](int layer, BertGemmInput input, const float* x, int64_t rows, int64_t cols) {
                           ++calls;
                           float& m = seen[layer][static_cast<int>(input)];
                           for (int64_t i = 0; i < rows * cols; ++i) m = std::max(m, std::fabs(x[i]));
                         })
                  .ok());
  EXPECT_EQ(calls, kBertGemmInputs * shape_.layers);
  // Calibration in one batch: the same maxima; in batches of 5, the same up to the fp32 matmul's rounding
  // (its blocking depends on the rows).
  auto r5 = CalibrateBertActivations(*enc, samples_,
                                     {.percentile = 100.0,
                                      .smoothing_alpha = 0.0,
                                      .activations = Int8Activations::kStatic,
                                      .batch_size = 5});
  ASSERT_TRUE(r5.ok()) << r5.status().ToString();
  auto r = CalibrateBertActivations(*enc, samples_,
                                    {.percentile = 100.0,
                                     .smoothing_alpha = 0.0,
                                     .activations = Int8Activations::kStatic,
                                     .batch_size = 12});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples, 12);
  int64_t tokens = 0;
  for (const auto& s : samples_) tokens += static_cast<int64_t>(s.size());
  EXPECT_EQ(r->tokens, tokens);
  ASSERT_EQ(r->layers.size(), static_cast<size_t>(shape_.layers));
  for (int l = 0; l < shape_.layers; ++l) {
    for (int j = 0; j < kBertGemmInputs; ++j) {
      EXPECT_EQ(r->layers[l][j], seen[l][j]) << l << " " << j;
      EXPECT_NEAR(r5->layers[l][j], seen[l][j], 1e-5f * seen[l][j]) << l << " " << j;
      EXPECT_GT(r->layers[l][j], 0.f);
    }
  }
  // A percentile clips below the maximum, never above it.
  auto p = CalibrateBertActivations(
      *enc, samples_, {.percentile = 99.0, .smoothing_alpha = 0.0, .activations = Int8Activations::kStatic});
  ASSERT_TRUE(p.ok());
  for (int l = 0; l < shape_.layers; ++l) {
    for (int j = 0; j < kBertGemmInputs; ++j) EXPECT_LT(p->layers[l][j], r->layers[l][j]) << l << " " << j;
  }
}

TEST_F(BertInt8Test, WeightsAreTheReferenceRowQuantiserAndScalesComeFromTheRanges) {
  auto ref = Load();
  auto enc = Load();
  ASSERT_NE(enc, nullptr);
  auto r = CalibrateBertActivations(
      *enc, samples_, {.percentile = 100.0, .smoothing_alpha = 0.0, .activations = Int8Activations::kStatic});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->smooth.empty());
  ASSERT_TRUE(enc->QuantizeWeightsInt8(*r).ok());
  EXPECT_EQ(enc->quantization(), WeightQuantization::kInt8);
  const BertEncoder::Linear& q0 = enc->layers()[1].intermediate;  // F32 weights in the random folder
  const BertEncoder::Linear& f0 = ref->layers()[1].intermediate;
  ASSERT_EQ(q0.w_int8.size(), static_cast<size_t>(q0.out * q0.in));
  std::vector<int8_t> want(q0.in);
  for (int64_t o = 0; o < q0.out; ++o) {
    const float s = cpu::QuantizeInt8Row(static_cast<const float*>(f0.w) + o * f0.in, f0.in, want.data());
    ASSERT_EQ(q0.w_scale[o], s) << o;
    ASSERT_TRUE(std::equal(want.begin(), want.end(), q0.w_int8.begin() + o * q0.in)) << o;
  }
  EXPECT_EQ(q0.x_scale, r->layers[1][static_cast<int>(BertGemmInput::kIntermediate)] / 127.0f);
  EXPECT_EQ(enc->layers()[0].key.x_scale, enc->layers()[0].query.x_scale);  // one input, one scale
  // Biases and norms untouched.
  EXPECT_EQ(enc->layers()[1].out_norm.gamma, ref->layers()[1].out_norm.gamma);
  EXPECT_EQ(q0.bias, f0.bias);
}

TEST_F(BertInt8Test, SmoothingFoldsItsFactorsIntoTheWeightsAndTheInputScales) {
  auto ref = Load();
  auto enc = Load();
  ASSERT_NE(enc, nullptr);
  auto r = CalibrateBertActivations(
      *enc, samples_, {.percentile = 100.0, .smoothing_alpha = 0.5, .activations = Int8Activations::kStatic});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->smooth.size(), static_cast<size_t>(shape_.layers));
  const std::vector<float>& s = r->smooth[0][static_cast<int>(BertGemmInput::kOutput)];
  ASSERT_EQ(s.size(), static_cast<size_t>(shape_.inter));
  EXPECT_GT(*std::max_element(s.begin(), s.end()), *std::min_element(s.begin(), s.end()));  // per channel
  ASSERT_TRUE(enc->QuantizeWeightsInt8(*r).ok());
  const BertEncoder::Linear& q = enc->layers()[0].output;
  const BertEncoder::Linear& f = ref->layers()[0].output;
  // Row 3: the reference quantiser of W[3, :] · s.
  std::vector<float> row(f.in);
  for (int64_t j = 0; j < f.in; ++j) row[j] = static_cast<const float*>(f.w)[3 * f.in + j] * s[j];
  std::vector<int8_t> want(f.in);
  EXPECT_EQ(q.w_scale[3], cpu::QuantizeInt8Row(row.data(), f.in, want.data()));
  EXPECT_TRUE(std::equal(want.begin(), want.end(), q.w_int8.begin() + 3 * q.in));
  ASSERT_EQ(q.x_inv.size(), static_cast<size_t>(q.in));
  for (int64_t j = 0; j < q.in; ++j) EXPECT_EQ(q.x_inv[j], 1.0f / (q.x_scale * s[j])) << j;
  // The smoothed encoder embeds close to fp32 as well.
  std::vector<float> want_emb, got;
  ASSERT_TRUE(ref->Embed(samples_, &want_emb).ok());
  ASSERT_TRUE(enc->Embed(samples_, &got).ok());
  EXPECT_GT(MinCosine(want_emb, got, shape_.hidden), 0.99);
}

TEST_F(BertInt8Test, Int8EmbeddingsStayCloseAndABrokenCalibrationDoesNot) {
  auto ref = Load();
  ASSERT_NE(ref, nullptr);
  std::vector<float> want, got, broken;
  ASSERT_TRUE(ref->Embed(samples_, &want).ok());
  auto r = CalibrateBertActivations(
      *ref, samples_, {.percentile = 100.0, .smoothing_alpha = 0.0, .activations = Int8Activations::kStatic});
  ASSERT_TRUE(r.ok());
  auto enc = Load();
  ASSERT_TRUE(enc->QuantizeWeightsInt8(*r).ok());
  ASSERT_TRUE(enc->Embed(samples_, &got).ok());
  const double good = MinCosine(want, got, shape_.hidden);
  EXPECT_LT(good, 1.0);  // the GEMMs did run in int8
  EXPECT_GT(good, 0.99);
  // Every activation scale x0.1: inputs clip at a tenth of their range.
  auto bad = Load();
  ASSERT_TRUE(bad->QuantizeWeightsInt8(*r, {.testing_activation_scale_multiplier = 0.1f}).ok());
  ASSERT_TRUE(bad->Embed(samples_, &broken).ok());
  EXPECT_LT(MinCosine(want, broken, shape_.hidden), good - 0.01);
  // Batched with others or alone: the same vectors (no padding, per-tensor static scales).
  std::vector<float> alone;
  ASSERT_TRUE(enc->Embed({samples_[4]}, &alone).ok());
  for (int64_t j = 0; j < shape_.hidden; ++j) EXPECT_EQ(alone[j], got[4 * shape_.hidden + j]) << j;
}

// --int8-activations per-token (the default): calibration measures only the smoothing factors; each row is
// quantised with its own scale (the GELU output centred and unsmoothed, cpu::QuantizeInt8PerToken), so a
// sequence embeds the same alone or batched, close to fp32, and x0.1 row scales (saturating) far from it.
TEST_F(BertInt8Test, PerTokenActivationsAreQuantisedRowByRow) {
  auto ref = Load();
  ASSERT_NE(ref, nullptr);
  auto r = CalibrateBertActivations(*ref, samples_, {.percentile = 99.0, .smoothing_alpha = 0.8});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->activations, Int8Activations::kPerToken);
  ASSERT_EQ(r->smooth.size(), static_cast<size_t>(shape_.layers));
  EXPECT_EQ(r->layers[0][0], 0.f);  // no static scale measured
  auto enc = Load();
  ASSERT_TRUE(enc->QuantizeWeightsInt8(*r).ok());
  const BertEncoder::Linear& q = enc->layers()[0].query;
  const BertEncoder::Linear& o = enc->layers()[0].output;
  EXPECT_TRUE(q.x_per_token && o.x_per_token);
  EXPECT_FALSE(q.x_centred);
  EXPECT_TRUE(o.x_centred);
  EXPECT_TRUE(o.x_inv.empty());  // the GELU output is not smoothed
  const std::vector<float>& s = r->smooth[0][static_cast<int>(BertGemmInput::kQkv)];
  ASSERT_EQ(q.x_inv.size(), s.size());
  for (size_t j = 0; j < s.size(); ++j) EXPECT_EQ(q.x_inv[j], 1.0f / s[j]) << j;
  int32_t sum = 0;
  for (int64_t j = 0; j < o.in; ++j) sum += o.w_int8[2 * o.in + j];
  EXPECT_EQ(o.w_sum[2], o.w_scale[2] * static_cast<float>(sum));
  std::vector<float> want, got, alone, broken;
  ASSERT_TRUE(ref->Embed(samples_, &want).ok());
  ASSERT_TRUE(enc->Embed(samples_, &got).ok());
  const double good = MinCosine(want, got, shape_.hidden);
  EXPECT_LT(good, 1.0);
  EXPECT_GT(good, 0.99);
  ASSERT_TRUE(enc->Embed({samples_[4]}, &alone).ok());
  for (int64_t j = 0; j < shape_.hidden; ++j) EXPECT_EQ(alone[j], got[4 * shape_.hidden + j]) << j;
  auto bad = Load();
  ASSERT_TRUE(bad->QuantizeWeightsInt8(*r, {.testing_activation_scale_multiplier = 0.1f}).ok());
  ASSERT_TRUE(bad->Embed(samples_, &broken).ok());
  EXPECT_LT(MinCosine(want, broken, shape_.hidden), good - 0.01);
}

TEST(Int8PerTokenQuantiser, SymmetricAndCentredRows) {
  // Row 0: symmetric, amax 2 -> scale 2/127; row 1 centred over [-0.5, 1.5]: mid 0.5, scale 2/254; row 2:
  // constant (centred: mid = the value, q 0); row 3 all zero.
  const float x[4][4] = {{2.f, -1.f, 0.5f, 0.f}, {-0.5f, 1.5f, 0.5f, 0.f}, {3.f, 3.f, 3.f, 3.f}, {}};
  int8_t q[4][4];
  float scale[4], mid[4];
  cpu::QuantizeInt8PerToken(&x[0][0], 1, 4, nullptr, 1.f, false, q[0], &scale[0], &mid[0]);
  EXPECT_EQ(scale[0], 2.f / 127.f);
  EXPECT_EQ(mid[0], 0.f);
  EXPECT_EQ(q[0][0], 127);
  EXPECT_EQ(q[0][1], -64);  // rint(-63.5) = -64 (half to even)
  cpu::QuantizeInt8PerToken(&x[1][0], 3, 4, nullptr, 1.f, true, q[1], &scale[1], &mid[1]);
  EXPECT_EQ(mid[1], 0.5f);
  EXPECT_EQ(scale[1], 2.f / 254.f);
  EXPECT_EQ(q[1][0], -127);
  EXPECT_EQ(q[1][1], 127);
  EXPECT_EQ(q[1][2], 0);
  EXPECT_EQ(mid[2], 3.f);
  EXPECT_EQ(scale[2], 0.f);
  EXPECT_EQ(q[2][0], 0);
  EXPECT_EQ(scale[3], 0.f);
  EXPECT_EQ(mid[3], 0.f);
  // With the centre: y = acc · scale · w_scale + mid · w_sum reproduces x · w for w = 1.
  const int8_t w[4] = {127, 127, 127, 127};
  int32_t acc = 0;
  for (int j = 0; j < 4; ++j) acc += q[1][j] * w[j];
  const float w_scale = 1.f / 127.f, w_sum = w_scale * 4 * 127;
  float y = 0;
  cpu::DequantizeInt8GemmPerToken(&acc, 1, 1, &scale[1], &mid[1], &w_scale, &w_sum, nullptr, &y);
  EXPECT_NEAR(y, -0.5f + 1.5f + 0.5f + 0.f, 4 * scale[1] / 2);  // each q within half a step
}

// QuantizedInt8Layers (what the CUDA backend uploads) is QuantizeWeightsInt8's result, leaving the encoder as
// it was: the same integers, scales, centre terms and smoothing, per-token and static.
TEST_F(BertInt8Test, QuantizedLayersAreWhatQuantizeWeightsMakesAndLeaveTheEncoder) {
  for (Int8Activations a : {Int8Activations::kPerToken, Int8Activations::kStatic}) {
    auto fp32 = Load();
    auto enc = Load();
    ASSERT_NE(fp32, nullptr);
    auto r = CalibrateBertActivations(*fp32, samples_, {.activations = a});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto copies = fp32->QuantizedInt8Layers(*r);
    ASSERT_TRUE(copies.ok()) << copies.status().ToString();
    EXPECT_EQ(fp32->quantization(), WeightQuantization::kNone);
    EXPECT_TRUE(fp32->layers()[0].query.w_int8.empty()) << "the encoder itself is unchanged";
    ASSERT_TRUE(enc->QuantizeWeightsInt8(*r).ok());
    ASSERT_EQ(copies->size(), enc->layers().size());
    for (size_t i = 0; i < copies->size(); ++i) {
      const BertEncoder::Layer& c = (*copies)[i];
      const BertEncoder::Layer& q = enc->layers()[i];
      using Pair = std::pair<const BertEncoder::Linear*, const BertEncoder::Linear*>;
      for (auto [x, y] : {Pair{&c.query, &q.query}, Pair{&c.key, &q.key}, Pair{&c.value, &q.value},
                          Pair{&c.attn_out, &q.attn_out}, Pair{&c.intermediate, &q.intermediate},
                          Pair{&c.output, &q.output}}) {
        ASSERT_FALSE(x->w_int8.empty());
        EXPECT_EQ(x->w_int8, y->w_int8);
        EXPECT_EQ(x->w_scale, y->w_scale);
        EXPECT_EQ(x->w_sum, y->w_sum);
        EXPECT_EQ(x->x_inv, y->x_inv);
        EXPECT_EQ(x->x_scale, y->x_scale);
        EXPECT_EQ(x->x_per_token, y->x_per_token);
        EXPECT_EQ(x->x_centred, y->x_centred);
        EXPECT_EQ(x->bias, y->bias);
      }
      EXPECT_EQ(c.output.x_centred, a == Int8Activations::kPerToken) << "the GELU output is centred per token";
    }
  }
  // Its errors are QuantizeWeightsInt8's.
  auto enc = Load();
  BertActivationRanges bad;
  bad.layers.resize(shape_.layers + 1, {1.f, 1.f, 1.f, 1.f});
  EXPECT_EQ(enc->QuantizedInt8Layers(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(BertInt8Test, BadRangesAndDoubleQuantisationAreErrors) {
  auto enc = Load();
  ASSERT_NE(enc, nullptr);
  BertActivationRanges r;
  r.layers.resize(shape_.layers - 1, {1.f, 1.f, 1.f, 1.f});
  EXPECT_EQ(enc->QuantizeWeightsInt8(r).code(), StatusCode::kInvalidArgument);
  r.layers.resize(shape_.layers, {1.f, 1.f, 1.f, 1.f});
  r.layers[1][2] = std::nanf("");
  Status st = enc->QuantizeWeightsInt8(r);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer 1 intermediate"), std::string::npos) << st.message();
  EXPECT_EQ(enc->quantization(), WeightQuantization::kNone);  // a failure leaves it as it was
  r.layers[1][2] = 1.f;
  ASSERT_TRUE(enc->QuantizeWeightsInt8(r).ok());
  EXPECT_EQ(enc->QuantizeWeightsInt8(r).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(enc->QuantizeWeightsFp8().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CalibrateBertActivations(*enc, samples_).status().code(), StatusCode::kFailedPrecondition);
  auto fresh = Load();
  EXPECT_EQ(CalibrateBertActivations(*fresh, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibrateBertActivations(*fresh, samples_, {.percentile = 0.0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibrateBertActivations(*fresh, samples_, {.smoothing_alpha = 1.5}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke
