// Pre-quantised FP8 checkpoints (fp8_checkpoint.h): the three scale layouts against their definition, the
// errors a malformed one gives, and whole HF folders in the compressed-tensors / fp8 / block-wise layouts
// loaded by LoadDecoder on the CPU against the same weights computed here.
#include "engine/model/fp8_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/loader/hf_folder.h"
#include "engine/model/backends.h"
#include "engine/model/factory.h"
#include "engine/model/llama_test_util.h"
#include "kernels/cpu/kv_quant.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::RelErr;
using testing::TinyLlama;

TensorRef F8(const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
  return TensorRef{"m.weight", DType::kF8E4M3, {rows, cols}, q.data(), q.size()};
}
TensorRef Scale(const std::vector<float>& s, std::vector<int64_t> shape, const char* name = "m.weight_scale") {
  return TensorRef{name, DType::kF32, std::move(shape), reinterpret_cast<const uint8_t*>(s.data()),
                   s.size() * 4};
}

std::vector<uint8_t> Codes(int64_t n, uint32_t seed) {
  std::vector<uint8_t> q(n);
  uint32_t x = seed;
  for (auto& b : q) {
    do {
      x = x * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(x >> 24);
    } while ((b & 0x7f) == 0x7f);  // no NaN codes
  }
  return q;
}

TEST(Fp8CheckpointTest, EachScaleLayoutMultipliesItsValues) {
  const int64_t rows = 6, cols = 10;
  const std::vector<uint8_t> q = Codes(rows * cols, 7);
  Fp8CheckpointFormat f;
  f.block_rows = 4, f.block_cols = 4;  // blocks [2, 3]
  struct Case {
    std::vector<float> s;
    std::vector<int64_t> shape;
    Fp8ScaleLayout layout;
  };
  const std::vector<Case> cases = {
      {{0.5f}, {}, Fp8ScaleLayout::kPerTensor},
      {{0.25f}, {1}, Fp8ScaleLayout::kPerTensor},
      {{1, 2, 3, 4, 5, 6}, {6}, Fp8ScaleLayout::kPerChannel},
      {{1, 2, 3, 4, 5, 6}, {6, 1}, Fp8ScaleLayout::kPerChannel},
      {{1, 2, 3, 4, 5, 6}, {2, 3}, Fp8ScaleLayout::kPerBlock},
  };
  for (const Case& c : cases) {
    std::vector<float> out(rows * cols);
    auto layout = DequantizeFp8Weight(F8(q, rows, cols), Scale(c.s, c.shape), f, ThreadPool::Default(), out.data());
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    EXPECT_EQ(*layout, c.layout);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) {
        const float s = c.layout == Fp8ScaleLayout::kPerTensor    ? c.s[0]
                        : c.layout == Fp8ScaleLayout::kPerChannel ? c.s[r]
                                                                  : c.s[(r / 4) * 3 + k / 4];
        ASSERT_EQ(out[r * cols + k], cpu::Fp8E4M3ToFloat(q[r * cols + k]) * s)
            << Fp8ScaleLayoutName(c.layout) << " at " << r << "," << k;
      }
    }
  }
}

TEST(Fp8CheckpointTest, MalformedScalesAndNaNCodesAreNamed) {
  const int64_t rows = 4, cols = 8;
  std::vector<uint8_t> q = Codes(rows * cols, 3);
  std::vector<float> out(rows * cols);
  auto run = [&](const TensorRef& s) {
    return DequantizeFp8Weight(F8(q, rows, cols), s, Fp8CheckpointFormat{}, ThreadPool::Default(), out.data());
  };
  auto bad_shape = run(Scale({1, 2, 3}, {3}));
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_THAT(bad_shape.status().message(), HasSubstr("m.weight_scale has shape [3]"));
  EXPECT_THAT(bad_shape.status().message(), HasSubstr("[4, 1] (per output"));
  auto negative = run(Scale({1, -2, 3, 4}, {4}));
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("m.weight_scale[1] is -2"));
  auto inf = run(Scale({INFINITY}, {}));
  ASSERT_FALSE(inf.ok());
  EXPECT_THAT(inf.status().message(), HasSubstr("finite"));
  // Finite, but 448 (the largest code) times it is not: refused rather than dequantised to infinity.
  auto overflow = run(Scale({1, 2, 1e36f, 4}, {4}));
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(overflow.status().message(), HasSubstr("m.weight_scale[2] is 1e+36"));
  EXPECT_THAT(overflow.status().message(), HasSubstr("448 x scale fits in a float"));
  const std::vector<int32_t> ints = {1};
  TensorRef int_scale{"m.weight_scale", DType::kI32, {}, reinterpret_cast<const uint8_t*>(ints.data()), 4};
  auto wrong_type = run(int_scale);
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_THAT(wrong_type.status().message(), HasSubstr("dtype I32"));
  q[2 * cols + 5] = 0xff;  // NaN
  auto nan = run(Scale({1}, {}));
  ASSERT_FALSE(nan.ok());
  EXPECT_THAT(nan.status().message(), HasSubstr("m.weight: row 2 column 5 holds an E4M3 NaN code (0xff)"));
}

TEST(Fp8CheckpointTest, BlockSizeComesFromTheConfig) {
  auto f = Fp8CheckpointFormatFromConfig(nlohmann::json::parse(
      R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 32]}})"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->method, "fp8");
  EXPECT_EQ(f->block_rows, 64);
  EXPECT_EQ(f->block_cols, 32);
  EXPECT_TRUE(f->pre_quantized);
  for (const char* q : {R"({"quant_method": "fbgemm_fp8"})",
                        R"({"quant_method": "compressed-tensors", "format": "float-quantized"})"}) {
    auto c = Fp8CheckpointFormatFromConfig(nlohmann::json{{"quantization_config", nlohmann::json::parse(q)}});
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->pre_quantized) << q;
  }
  for (const char* q : {R"({"quant_method": "compressed-tensors", "format": "int-quantized"})",
                        R"({"quant_method": "gptq"})", R"({"quant_method": 7})"}) {
    auto c = Fp8CheckpointFormatFromConfig(nlohmann::json{{"quantization_config", nlohmann::json::parse(q)}});
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->pre_quantized) << q;
  }
  auto none = Fp8CheckpointFormatFromConfig(nlohmann::json::parse(R"({"model_type": "llama"})"));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->block_rows, 128);
  auto bad = Fp8CheckpointFormatFromConfig(
      nlohmann::json::parse(R"({"quantization_config": {"weight_block_size": [128]}})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("weight_block_size"));
}

// ---- Whole checkpoints -----------------------------------------------------------------------------------

enum class Layout { kChannel, kTensor, kBlock };

struct Written {
  fs::path dir;
  TinyLlama dequantised;  // the model the checkpoint stands for: each fp8 weight as e4m3(q) * scale
};

bool IsProjection(const std::string& name) {
  return name.starts_with("model.layers.") && name.ends_with("_proj.weight");
}

// `m`'s projections as an FP8 checkpoint in `layout` (norms, embedding and lm_head stay F32, as released
// checkpoints keep them in bf16). kChannel: compressed-tensors' "channel" strategy, quantised exactly as
// stoke's --quantization fp8 (cpu::QuantizeKvRow: scale = amax / 448); kTensor: AutoFP8's per-tensor
// weight_scale []; kBlock: weight_scale_inv per 32 x 32 block (weight_block_size in the config).
Written WriteFp8Folder(const TinyLlama& m, Layout layout, const std::string& tag, float scale_multiplier = 1.0f,
                       bool drop_a_scale = false) {
  Written out{fs::temp_directory_path() / ("stoke_fp8ck_" + tag + "_" + std::to_string(::getpid())), m};
  fs::remove_all(out.dir);
  m.WriteHfFolder(out.dir);  // config.json (rewritten below) and the F32 tensors
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, Entry> entries;
  const int64_t kBlock = 32;
  for (const auto& [name, v] : m.w) {
    const std::vector<int64_t>& shape = m.shapes.at(name);
    if (!IsProjection(name)) {
      entries[name] = {"F32", shape, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)};
      continue;
    }
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<uint8_t> q(rows * cols);
    std::vector<float> scales;
    std::vector<int64_t> scale_shape;
    std::vector<float>& deq = out.dequantised.w[name];
    auto amax_of = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      float a = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) a = std::max(a, std::fabs(v[r * cols + c]));
      return a;
    };
    auto encode = [&](int64_t r, int64_t c, float scale) {
      const float x = scale > 0 ? v[r * cols + c] * (1.0f / scale) : 0.0f;
      q[r * cols + c] = cpu::Fp8E4M3FromFloat(x);
      deq[r * cols + c] = cpu::Fp8E4M3ToFloat(q[r * cols + c]) * (scale * scale_multiplier);
    };
    if (layout == Layout::kChannel) {
      scales.resize(rows);
      scale_shape = {rows, 1};
      for (int64_t r = 0; r < rows; ++r) {
        scales[r] = cpu::QuantizeKvRow(&v[r * cols], static_cast<int>(cols), KvCacheDtype::kFp8, &q[r * cols]);
        for (int64_t c = 0; c < cols; ++c)
          deq[r * cols + c] = cpu::Fp8E4M3ToFloat(q[r * cols + c]) * (scales[r] * scale_multiplier);
      }
    } else if (layout == Layout::kTensor) {
      scales = {amax_of(0, rows, 0, cols) / 448.0f};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) encode(r, c, scales[0]);
    } else {
      const int64_t br = (rows + kBlock - 1) / kBlock, bc = (cols + kBlock - 1) / kBlock;
      scale_shape = {br, bc};
      for (int64_t i = 0; i < br; ++i) {
        for (int64_t j = 0; j < bc; ++j) {
          const int64_t r1 = std::min(rows, (i + 1) * kBlock), c1 = std::min(cols, (j + 1) * kBlock);
          const float s = amax_of(i * kBlock, r1, j * kBlock, c1) / 448.0f;
          scales.push_back(s);
          for (int64_t r = i * kBlock; r < r1; ++r)
            for (int64_t c = j * kBlock; c < c1; ++c) encode(r, c, s);
        }
      }
    }
    for (float& s : scales) s *= scale_multiplier;
    entries[name] = {"F8_E4M3", shape, std::string(reinterpret_cast<const char*>(q.data()), q.size())};
    if (drop_a_scale && name == "model.layers.1.mlp.down_proj.weight") continue;
    entries[name + (layout == Layout::kBlock ? "_scale_inv" : "_scale")] = {
        "F32", scale_shape, std::string(reinterpret_cast<const char*>(scales.data()), scales.size() * 4)};
  }
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, e] : entries) {
    const size_t begin = data.size();
    data += e.bytes;
    header[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  {
    std::ofstream f(out.dir / "model.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << data;
  }
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out.dir / "config.json"));
  if (layout == Layout::kChannel) {
    cfg["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}};
  } else if (layout == Layout::kTensor) {
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  } else {
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {kBlock, kBlock}}};
  }
  std::ofstream(out.dir / "config.json", std::ios::trunc) << cfg.dump(2);
  return out;
}

using testing::ScoreAll;
const std::vector<int32_t>& kIds = testing::kTinyIds;

TEST(Fp8CheckpointTest, PerChannelCheckpointIsExactlyQuantizationFp8OfTheOriginal) {
  // compressed-tensors' channel strategy quantises as --quantization fp8 does: loading the checkpoint must
  // give the logits of the original loaded with --quantization fp8, bit for bit.
  const TinyLlama m(61);
  const fs::path orig = fs::temp_directory_path() / ("stoke_fp8ck_orig_" + std::to_string(::getpid()));
  m.WriteHfFolder(orig);
  Written ck = WriteFp8Folder(m, Layout::kChannel, "channel");
  DecoderOptions fp8;
  fp8.quantization = WeightQuantization::kFp8;
  auto a = LoadDecoder(orig.string(), fp8, CpuBackends());
  auto b = LoadDecoder(ck.dir.string(), DecoderOptions{}, CpuBackends());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->quantization_name(), "fp8");
  const std::vector<float> la = ScoreAll(**a, kIds), lb = ScoreAll(**b, kIds);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << "logit " << i;
  // And they are the fp8 values, not the original's: the reference of the dequantised weights agrees.
  EXPECT_LT(RelErr(lb, ck.dequantised.Reference(kIds)), 2e-5);
  EXPECT_GT(RelErr(lb, m.Reference(kIds)), 1e-3);
  fs::remove_all(orig);
  fs::remove_all(ck.dir);
}

TEST(Fp8CheckpointTest, PerTensorAndPerBlockCheckpointsComputeTheirDequantisedWeights) {
  const TinyLlama m(62);
  for (Layout layout : {Layout::kTensor, Layout::kBlock}) {
    const char* tag = layout == Layout::kTensor ? "tensor" : "block";
    Written ck = WriteFp8Folder(m, layout, tag);
    auto model = LoadDecoder(ck.dir.string(), DecoderOptions{}, CpuBackends());
    ASSERT_TRUE(model.ok()) << tag << ": " << model.status().ToString();
    EXPECT_EQ((*model)->quantization_name(), "fp8") << tag;
    const std::vector<float> logits = ScoreAll(**model, kIds);
    EXPECT_LT(RelErr(logits, ck.dequantised.Reference(kIds)), 2e-5) << tag;
    EXPECT_GT(RelErr(logits, m.Reference(kIds)), 1e-3) << tag;
    fs::remove_all(ck.dir);
  }
}

TEST(Fp8CheckpointTest, ProjectionsStayCodesWithRowScalesUnlessPerBlock) {
  const TinyLlama m(64);
  for (Layout layout : {Layout::kChannel, Layout::kTensor, Layout::kBlock}) {
    Written ck = WriteFp8Folder(m, layout, "codes");
    auto folder = HfFolder::Open(ck.dir.string());
    ASSERT_TRUE(folder.ok()) << folder.status().ToString();
    auto w = LoadLlamaWeights(std::shared_ptr<const HfFolder>(std::move(*folder)));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->quantization, WeightQuantization::kFp8);
    EXPECT_EQ(w->embedding.dtype, DType::kF32);  // not an fp8 tensor in the file
    const LlamaLayerWeights& l = w->layers[1];
    if (layout == Layout::kBlock) {  // a row scale cannot hold per-block scales: dequantised at load
      EXPECT_EQ(w->fp8_checkpoint.matrices[2], 14);
      EXPECT_EQ(l.qkv.dtype, DType::kF32);
      EXPECT_EQ(l.qkv.row_scale, nullptr);
      fs::remove_all(ck.dir);
      continue;
    }
    EXPECT_EQ(w->fp8_checkpoint.matrices[layout == Layout::kChannel ? 1 : 0], 14);
    // q, k, v fused into one matrix of codes; its row scales are q's, then k's, then v's.
    ASSERT_EQ(l.qkv.dtype, DType::kF8E4M3);
    ASSERT_NE(l.qkv.row_scale, nullptr);
    EXPECT_EQ(l.gate_up.dtype, DType::kF8E4M3);
    EXPECT_EQ(l.down.dtype, DType::kF8E4M3);
    const int64_t qd = m.c.num_heads * m.c.head_dim, kvd = m.c.num_kv_heads * m.c.head_dim;
    ASSERT_EQ(l.qkv.rows, qd + 2 * kvd);
    const std::vector<float>& k = ck.dequantised.W("model.layers.1.self_attn.k_proj.weight");
    for (int64_t r = 0; r < kvd; ++r) {
      for (int64_t c = 0; c < l.qkv.cols; c += 7) {
        const uint8_t code = static_cast<const uint8_t*>(l.qkv.data)[(qd + r) * l.qkv.cols + c];
        ASSERT_EQ(cpu::Fp8E4M3ToFloat(code) * l.qkv.row_scale[qd + r], k[r * l.qkv.cols + c]) << r << "," << c;
      }
    }
    // The codes of an unfused matrix are the file's bytes, not a copy.
    const TensorRef* down = std::static_pointer_cast<const HfFolder>(w->source)
                                ->FindTensor("model.layers.1.mlp.down_proj.weight");
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(l.down.data, down->data);
    // CpuLlama multiplies their fp32 values.
    LlamaWeights copy = std::move(*w);
    ASSERT_TRUE(WidenFp8Matrices(&copy, ThreadPool::Default()).ok());
    EXPECT_EQ(copy.layers[1].qkv.dtype, DType::kF32);
    EXPECT_EQ(static_cast<const float*>(copy.layers[1].qkv.data)[qd * l.qkv.cols], k[0]);
    fs::remove_all(ck.dir);
  }
}

TEST(Fp8CheckpointTest, AWrongScaleMovesTheLogitsAndAMissingOneIsNamed) {
  const TinyLlama m(63);
  Written good = WriteFp8Folder(m, Layout::kChannel, "good");
  Written wrong = WriteFp8Folder(m, Layout::kChannel, "wrong", /*scale_multiplier=*/1.5f);
  auto g = LoadDecoder(good.dir.string(), DecoderOptions{}, CpuBackends());
  auto w = LoadDecoder(wrong.dir.string(), DecoderOptions{}, CpuBackends());
  ASSERT_TRUE(g.ok() && w.ok());
  const std::vector<float> lw = ScoreAll(**w, kIds);
  EXPECT_LT(RelErr(lw, wrong.dequantised.Reference(kIds)), 2e-5);  // the scale is applied as written
  EXPECT_GT(RelErr(lw, ScoreAll(**g, kIds)), 1e-2);
  Written missing = WriteFp8Folder(m, Layout::kChannel, "missing", 1.0f, /*drop_a_scale=*/true);
  auto bad = LoadDecoder(missing.dir.string(), DecoderOptions{}, CpuBackends());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(bad.status().message(), HasSubstr("model.layers.1.mlp.down_proj.weight is F8_E4M3 but"));
  EXPECT_THAT(bad.status().message(), HasSubstr("_scale"));
  for (const Written* d : {&good, &wrong, &missing}) fs::remove_all(d->dir);
}

}  // namespace
}  // namespace stoke
