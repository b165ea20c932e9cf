// --quantization fp8 on the CPU (weight_quant.h): every value of every projection is a point of the E4M3 grid
// times its row's scale (amax / 448), the nearest such point to the original, so within amax / 16 of it; the
// embedding stays as it was while a tied lm_head gets its own copy; GGUF quantised rows are widened first;
// the model's logits move, a little.
#include "engine/model/weight_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

using testing::TinyLlama;

const float* F32(const LinearWeight& w) {
  EXPECT_EQ(w.dtype, DType::kF32);
  return static_cast<const float*>(w.data);
}

// Checks that `got` [rows, cols] is the row-wise fp8 round trip of `orig`: each value equals e4m3(b) · scale
// for some byte b, with scale = amax / 448 of its original row, and is the grid point nearest the original
// (ties either way); the largest error of a row is at most amax / 16. Independent of the quantiser's own
// arithmetic: it searches the 254 finite E4M3 values.
void ExpectFp8RoundTrip(const float* got, const float* orig, int64_t rows, int64_t cols, const char* what) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = orig + r * cols;
    const float* y = got + r * cols;
    float amax = 0;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 448.0f;
    double worst = 0;
    for (int64_t i = 0; i < cols; ++i) {
      bool on_grid = false;
      double nearest = INFINITY;
      for (int b = 0; b < 256; ++b) {
        if ((b & 0x7f) == 0x7f) continue;  // NaN
        const float g = cpu::Fp8E4M3ToFloat(static_cast<uint8_t>(b)) * scale;
        on_grid |= g == y[i];
        nearest = std::min(nearest, std::fabs(double(g) - x[i]));
      }
      const double err = std::fabs(double(y[i]) - x[i]);
      ASSERT_TRUE(on_grid) << what << " [" << r << ", " << i << "] = " << y[i] << " is not e4m3 x " << scale;
      ASSERT_LE(err, nearest + 1e-6 * amax) << what << " [" << r << ", " << i << "]: not the nearest point";
      worst = std::max(worst, err);
    }
    EXPECT_LE(worst, amax / 16.0) << what << " row " << r;
  }
}

std::vector<float> Concat(const TinyLlama& m, const std::string& p,
                          std::initializer_list<const char*> parts) {
  std::vector<float> v;
  for (const char* part : parts) {
    const std::vector<float>& w = m.W(p + part);
    v.insert(v.end(), w.begin(), w.end());
  }
  return v;
}

TEST(WeightQuantTest, EveryProjectionIsTheNearestFp8GridPointTimesItsRowScale) {
  TinyLlama m(41);
  LlamaWeights w = m.ToWeights(/*fuse=*/false);
  const void* emb = w.embedding.data;
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&w, {.quantize_lm_head = true}).ok());
  EXPECT_EQ(w.quantization, WeightQuantization::kFp8);
  EXPECT_EQ(w.embedding.data, emb);
  ExpectFp8RoundTrip(F32(w.lm_head), m.W("lm_head.weight").data(), w.lm_head.rows, w.lm_head.cols, "lm_head");
  for (int l = 0; l < m.c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LlamaLayerWeights& lw = w.layers[l];
    EXPECT_TRUE(lw.qkv.empty() && lw.gate_up.empty());
    const std::pair<const LinearWeight*, const char*> mats[] = {
        {&lw.q, "self_attn.q_proj.weight"}, {&lw.k, "self_attn.k_proj.weight"},
        {&lw.v, "self_attn.v_proj.weight"}, {&lw.o, "self_attn.o_proj.weight"},
        {&lw.gate, "mlp.gate_proj.weight"}, {&lw.up, "mlp.up_proj.weight"},
        {&lw.down, "mlp.down_proj.weight"}};
    for (const auto& [mat, name] : mats) {
      ExpectFp8RoundTrip(F32(*mat), m.W(p + name).data(), mat->rows, mat->cols, name);
    }
  }
}

TEST(WeightQuantTest, FusedMatricesAndATiedLmHead) {
  TinyLlama m(42, /*tied=*/true);
  LlamaWeights w = m.ToWeights(/*fuse=*/true);
  ASSERT_EQ(w.lm_head.data, w.embedding.data);
  const void* emb = w.embedding.data;
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&w, {.quantize_lm_head = true}).ok());
  // The embedding is untouched (same buffer, same values); the lm_head has its own quantised copy.
  const std::vector<float>& e = m.W("model.embed_tokens.weight");
  ASSERT_EQ(w.embedding.data, emb);
  EXPECT_EQ(w.embedding.dtype, DType::kF32);
  EXPECT_EQ(std::vector<float>(F32(w.embedding), F32(w.embedding) + e.size()), e);
  EXPECT_NE(w.lm_head.data, w.embedding.data);
  ExpectFp8RoundTrip(F32(w.lm_head), e.data(), w.lm_head.rows, w.lm_head.cols, "tied lm_head");
  for (int l = 0; l < m.c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LlamaLayerWeights& lw = w.layers[l];
    const std::vector<float> qkv =
        Concat(m, p, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"});
    const std::vector<float> gu = Concat(m, p, {"mlp.gate_proj.weight", "mlp.up_proj.weight"});
    ExpectFp8RoundTrip(F32(lw.qkv), qkv.data(), lw.qkv.rows, lw.qkv.cols, "qkv");
    ExpectFp8RoundTrip(F32(lw.gate_up), gu.data(), lw.gate_up.rows, lw.gate_up.cols, "gate_up");
  }
  // The buffers only the replaced matrices used are gone: the embedding, per layer qkv, o, gate_up, down,
  // and the lm_head remain.
  EXPECT_EQ(w.owned.size(), 1u + 4u * m.c.num_layers + 1u);
  EXPECT_EQ(QuantizeLlamaWeightsFp8(&w).code(), StatusCode::kFailedPrecondition);  // not twice
}

// A GGUF Q8_0 matrix is dequantised first: the round trip is of the values the file stands for. A zero row
// stays zero (scale 0).
TEST(WeightQuantTest, QuantisedRowsAreWidenedFirstAndZeroRowsStayZero) {
  const int64_t rows = 8, cols = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 0.5f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = d(rng);
  for (int64_t i = 0; i < cols; ++i) x[3 * cols + i] = 0;
  std::vector<uint8_t> q8(*RowBytes(DType::kQ8_0, cols) * rows);
  cpu::QuantizeRowQ8_0(x.data(), q8.data(), rows * cols);
  std::vector<float> widened(rows * cols);
  ASSERT_TRUE(cpu::DequantizeRow(DType::kQ8_0, q8.data(), widened.data(), rows * cols).ok());
  LlamaWeights w;
  w.lm_head = {q8.data(), DType::kQ8_0, rows, cols};
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&w, {.quantize_lm_head = true}).ok());
  ExpectFp8RoundTrip(F32(w.lm_head), widened.data(), rows, cols, "q8_0");
  for (int64_t i = 0; i < cols; ++i) EXPECT_EQ(F32(w.lm_head)[3 * cols + i], 0.0f);

  // The test-only multiplier scales every value: a broken quantiser the gate must catch.
  LlamaWeights broken;
  broken.lm_head = {q8.data(), DType::kQ8_0, rows, cols};
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&broken, {.testing_scale_multiplier = 2.0f, .quantize_lm_head = true}).ok());
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(F32(broken.lm_head)[i], 2.0f * F32(w.lm_head)[i]);
}

// By default the lm_head keeps the checkpoint's precision (its matrix and buffer untouched); the layers are
// quantised.
TEST(WeightQuantTest, TheLmHeadKeepsItsPrecisionByDefault) {
  for (bool tied : {false, true}) {
    TinyLlama m(44, tied);
    LlamaWeights w = m.ToWeights(/*fuse=*/true);
    const LinearWeight before = w.lm_head;
    const void* emb = w.embedding.data;
    ASSERT_TRUE(QuantizeLlamaWeightsFp8(&w).ok());
    EXPECT_EQ(w.lm_head.data, before.data);
    EXPECT_EQ(w.lm_head.dtype, before.dtype);
    EXPECT_EQ(w.embedding.data, emb);
    EXPECT_EQ(tied, w.lm_head.data == w.embedding.data);
    const std::string p = "model.layers.0.";
    const std::vector<float> down = m.W(p + "mlp.down_proj.weight");
    ExpectFp8RoundTrip(F32(w.layers[0].down), down.data(), w.layers[0].down.rows, w.layers[0].down.cols,
                       "down");
    if (!tied) {
      const std::vector<float>& lm = m.W("lm_head.weight");
      EXPECT_EQ(std::vector<float>(F32(w.lm_head), F32(w.lm_head) + lm.size()), lm);
    }
  }
}

TEST(WeightQuantTest, CpuLlamaWithFp8WeightsMovesItsLogitsALittle) {
  TinyLlama m(43);
  LlamaWeights q = m.ToWeights(true);
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&q).ok());
  auto ref = CpuLlama::Create(m.ToWeights(true));
  auto fp8 = CpuLlama::Create(std::move(q));
  ASSERT_TRUE(ref.ok() && fp8.ok());
  EXPECT_EQ((*ref)->quantization_name(), "none");
  EXPECT_EQ((*fp8)->quantization_name(), "fp8");
  std::vector<std::vector<float>> logits;
  for (CpuLlama* model : {ref->get(), fp8->get()}) {
    ASSERT_TRUE(model->AllocateKvCache(4, 16).ok());
    StepInput in;
    in.token_ids = {1, 17, 42, 5, 88, 23, 9, 60};
    StepSequence s;
    s.num_tokens = 8;
    s.block_table = {0};
    s.logits = StepSequence::Logits::kAll;
    in.sequences.push_back(s);
    StepOutput out;
    ASSERT_TRUE(model->Step(in, &out).ok());
    logits.push_back(out.logits);
  }
  const double err = testing::RelErr(logits[1], logits[0]);
  EXPECT_GT(err, 0.0);  // another precision
  // 3 mantissa bits per weight (~3 % rms error each); a tiny random model (hidden 64) magnifies it (0.17
  // measured). The real models are checked through the gate (tools/precision).
  EXPECT_LT(err, 0.3);
  std::printf("fp8 weights: relative logit error %.4f\n", err);
}

}  // namespace
}  // namespace stoke
