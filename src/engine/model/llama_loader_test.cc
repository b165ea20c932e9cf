// Loading Llama weights from files: GGUF (with llama.cpp's Q/K permutation), HF folders, and the config
// readers (GGUF metadata, config.json in both RoPE layouts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/loader/gguf_reader.h"
#include "engine/model/backends.h"
#include "engine/model/factory.h"
#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using testing::RelErr;
using testing::TinyLlama;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("stoke_llama_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

using testing::ScoreAll;
const std::vector<int32_t>& kIds = testing::kTinyIds;

TEST(LlamaLoaderTest, GgufAndHfFolderMatchReference) {
  for (bool tied : {false, true}) {
    for (bool bias : {false, true}) {  // bias: written as qwen2, whose GGUF Q/K are not permuted
      TinyLlama m(21 + tied + 2 * bias, tied, bias);
      const fs::path dir = TempDir("hf");
      m.WriteHfFolder(dir);
      const fs::path gguf = dir.parent_path() / ("stoke_llama_" + std::to_string(::getpid()) + ".gguf");
      m.WriteGguf(gguf);
      const std::vector<float> ref = m.Reference(kIds);
      auto hf = LoadDecoder(dir.string());
      ASSERT_TRUE(hf.ok()) << hf.status().ToString();
      EXPECT_EQ((*hf)->config().tie_word_embeddings, tied);
      EXPECT_EQ((*hf)->config().attention_bias, bias);
      EXPECT_LT(RelErr(ScoreAll(**hf, kIds), ref), 2e-5) << "hf tied " << tied << " bias " << bias;
      DecoderOptions exact;  // stoke's own numerics; ggml's (the default for GGUF) keep an fp16 KV cache
      exact.ggml_compatible_numerics = false;
      auto gg = LoadDecoder(gguf.string(), exact, CpuBackends());
      ASSERT_TRUE(gg.ok()) << gg.status().ToString();
      EXPECT_EQ((*gg)->config().architecture, bias ? "qwen2" : "llama");
      EXPECT_EQ((*gg)->config().tie_word_embeddings, tied);
      EXPECT_EQ((*gg)->config().eos_token_ids, std::vector<int32_t>{2});
      EXPECT_LT(RelErr(ScoreAll(**gg, kIds), ref), 2e-5) << "gguf tied " << tied << " bias " << bias;
      auto ggml = LoadDecoder(gguf.string());
      ASSERT_TRUE(ggml.ok()) << ggml.status().ToString();
      EXPECT_LT(RelErr(ScoreAll(**ggml, kIds), ref), 3e-3) << "gguf, ggml numerics, tied " << tied;
      fs::remove_all(dir);
      fs::remove(gguf);
    }
  }
}

// Without the un-permutation the GGUF model would be "fluent garbage"; make sure that case is detectable:
// loading the permuted file as if it were qwen2 (no un-permute) must disagree with the reference.
TEST(LlamaLoaderTest, SkippingTheQkUnpermuteIsDetectable) {
  TinyLlama m(31);
  const fs::path dir = TempDir("perm");
  m.WriteGguf(dir / "m.gguf");
  auto gguf = GgufFile::Open((dir / "m.gguf").string());
  ASSERT_TRUE(gguf.ok());
  auto w = LoadLlamaWeights(std::shared_ptr<const GgufFile>(std::move(gguf).value()));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // Undo the loader's un-permutation of layer 0's Q rows (swap back to file order).
  LlamaWeights weights = std::move(w).value();
  LinearWeight& qkv = weights.layers[0].qkv;
  std::vector<float> copy(static_cast<const float*>(qkv.data),
                          static_cast<const float*>(qkv.data) + qkv.rows * qkv.cols);
  auto* dst = const_cast<float*>(static_cast<const float*>(qkv.data));
  for (int64_t r = 0; r < m.c.num_heads * m.c.head_dim; ++r) {
    const int64_t src = GgufQkSourceRow(r, m.c.head_dim);
    std::copy(&copy[r * qkv.cols], &copy[(r + 1) * qkv.cols], dst + src * qkv.cols);
  }
  auto model = CpuLlama::Create(std::move(weights));
  ASSERT_TRUE(model.ok());
  EXPECT_GT(RelErr(ScoreAll(**model, kIds), m.Reference(kIds)), 1e-2);
  fs::remove_all(dir);
}

TEST(LlamaLoaderTest, GgufQ8_0WeightsStayClose) {
  TinyLlama m(41);
  const fs::path dir = TempDir("q8");
  m.WriteGguf(dir / "q8.gguf", /*Q8_0=*/8, [](const float* x, int64_t n) {
    std::string bytes(n / 32 * sizeof(cpu::BlockQ8_0), '\0');
    cpu::QuantizeRowQ8_0(x, bytes.data(), n);
    return bytes;
  });
  auto model = LoadDecoder((dir / "q8.gguf").string());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<float> got = ScoreAll(**model, kIds);
  // Reference over the dequantised weights (rows quantise independently, so permuting commutes with it):
  // what remains is the 8-bit activation quantisation of the matmuls.
  TinyLlama dq = m;
  for (auto& [name, v] : dq.w) {
    if (dq.shapes[name].size() != 2) continue;
    std::string bytes(v.size() / 32 * sizeof(cpu::BlockQ8_0), '\0');
    cpu::QuantizeRowQ8_0(v.data(), bytes.data(), v.size());
    ASSERT_TRUE(cpu::DequantizeRow(DType::kQ8_0, bytes.data(), v.data(), v.size()).ok());
  }
  // This random model amplifies perturbations ~8x (its weight-only Q8_0 error is ~4%), so the bound is
  // loose; a Q/K row-order bug on quantised rows gives O(1) errors.
  EXPECT_LT(RelErr(got, dq.Reference(kIds)), 0.1);
  EXPECT_GT(RelErr(got, m.Reference(kIds)), 1e-3);  // really quantised
  fs::remove_all(dir);
}

TEST(LlamaLoaderTest, MissingTensorIsNamed) {
  TinyLlama m(51);
  m.w.erase("model.layers.1.mlp.up_proj.weight");
  const fs::path dir = TempDir("missing");
  m.WriteHfFolder(dir);
  auto model = LoadDecoder(dir.string());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << model.status().ToString();
  fs::remove_all(dir);
}

TEST(LlamaConfigTest, HfConfigClassicAndV5RopeLayouts) {
  nlohmann::json j = {{"model_type", "llama"},
                      {"vocab_size", 128256},
                      {"hidden_size", 2048},
                      {"intermediate_size", 8192},
                      {"num_hidden_layers", 16},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},
                      {"head_dim", 64},
                      {"rms_norm_eps", 1e-5},
                      {"max_position_embeddings", 131072},
                      {"tie_word_embeddings", true},
                      {"bos_token_id", 128000},
                      {"eos_token_id", {128001, 128008, 128009}},
                      {"rope_theta", 500000.0},
                      {"rope_scaling",
                       {{"rope_type", "llama3"},
                        {"factor", 32.0},
                        {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 8192}}}};
  auto c = LlamaConfigFromHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_TRUE(c->tie_word_embeddings);

  // transformers v5: theta and scaling inside rope_parameters.
  nlohmann::json v5 = j;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = j["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  v5["eos_token_id"] = 2;
  auto c5 = LlamaConfigFromHfConfig(v5);
  ASSERT_TRUE(c5.ok()) << c5.status().ToString();
  EXPECT_FLOAT_EQ(c5->rope_theta, 500000.0f);
  EXPECT_EQ(c5->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c5->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(RopeInverseFrequencies(*c5), RopeInverseFrequencies(*c));

  // Defaults (head_dim from hidden/heads, eps 1e-6, kv = heads), qwen2 implies q/k/v bias.
  auto q =
      LlamaConfigFromHfConfig({{"model_type", "qwen2"}, {"hidden_size", 896}, {"num_attention_heads", 14}});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->head_dim, 64);
  EXPECT_EQ(q->num_kv_heads, 14);
  EXPECT_FLOAT_EQ(q->rms_norm_eps, 1e-6f);
  EXPECT_TRUE(q->attention_bias);

  EXPECT_FALSE(LlamaConfigFromHfConfig({{"model_type", "bert"}}).ok());
  EXPECT_FALSE(LlamaConfigFromHfConfig({{"model_type", "llama"}, {"hidden_act", "gelu"}}).ok());
  EXPECT_FALSE(LlamaConfigFromHfConfig({{"model_type", "llama"}, {"rope_scaling", {{"type", "yarn"}}}}).ok());
  EXPECT_FALSE(LlamaConfigFromHfConfig({{"model_type", "llama"}, {"hidden_size", "big"}}).ok());
  EXPECT_FALSE(LlamaConfigFromHfConfig({{"model_type", "llama"}, {"num_key_value_heads", 5}}).ok());
}

TEST(LlamaConfigTest, Llama3RopeScalingMatchesFormula) {
  LlamaConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 64u);
  const double kPi = 3.14159265358979323846;
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128);
    const double wl = 2 * kPi / f;
    double want;
    if (wl < 8192 / 4.0) {
      want = f, ++kept;
    } else if (wl > 8192 / 1.0) {
      want = f / 8, ++divided;
    } else {
      const double s = (8192 / wl - 1) / (4 - 1);
      want = (1 - s) * f / 8 + s * f, ++blended;
    }
    EXPECT_NEAR(inv[i], want, want * 1e-6) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // GGUF rope_freqs divisors take precedence.
  c.rope_freq_divisors.assign(64, 2.0f);
  EXPECT_NEAR(RopeInverseFrequencies(c)[5], std::pow(500000.0, -10.0 / 128) / 2, 1e-7);
}

}  // namespace
}  // namespace stoke

namespace stoke {
namespace {

// The real SmolLM2-135M-Instruct Q4_1 GGUF, when present (CI fetches it; tests/golden/ compares it against
// llama.cpp in depth).
TEST(LlamaRealModelTest, SmolLM2ConfigAndFirstToken) {
  const char* dir = std::getenv("STOKE_MODEL_DIR");
  const fs::path base =
      dir != nullptr ? fs::path(dir)
                     : fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/") / ".cache/stoke/models";
  const fs::path path = base / "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(path)) GTEST_SKIP() << path << " missing: run `stoke model fetch smollm2-135m-instruct`";
  auto model = LoadDecoder(path.string());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const LlamaConfig& c = (*model)->config();
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5f, 1e-9f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ((*model)->KvBytesPerToken(), 30 * 2 * 3 * 64 * 4);
  // "The capital of France is" (llama.cpp's ids): " Paris" (7042) leads llama.cpp's runner-up by 2.5 logits.
  const std::vector<int32_t> ids = {504, 3575, 282, 4649, 314};
  const std::vector<float> logits = ScoreAll(**model, ids);
  ASSERT_EQ(logits.size(), ids.size() * 49152);
  const float* last = logits.data() + 4 * 49152;
  EXPECT_EQ(std::max_element(last, last + 49152) - last, 7042);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// The CUDA tuning knobs are checked before anything loads, on every build: a bad value names its flag.
TEST(LoadDecoderTest, RejectsOutOfRangeCudaTuning) {
  EXPECT_TRUE(ValidateCudaDecoderTuning(CudaDecoderTuning{}).ok());
  struct Case {
    void (*set)(CudaDecoderTuning*);
    const char* flag;
  };
  const Case cases[] = {
      {[](CudaDecoderTuning* t) { t->gemv_max_rows = 9; }, "--gemv-max-rows 9"},
      {[](CudaDecoderTuning* t) { t->gemv_max_rows = -1; }, "--gemv-max-rows -1"},
      {[](CudaDecoderTuning* t) { t->fp8_gemv_max_rows = 9; }, "--fp8-gemv-max-rows 9"},
      {[](CudaDecoderTuning* t) { t->fp8_gemv_max_rows = -1; }, "--fp8-gemv-max-rows -1"},
      {[](CudaDecoderTuning* t) { t->gemv_split = 3; }, "--gemv-split 3"},
      {[](CudaDecoderTuning* t) { t->decode_min_partition = 0; }, "--decode-min-partition 0"},
      {[](CudaDecoderTuning* t) { t->decode_min_partition = 513; }, "--decode-min-partition 513"},
      {[](CudaDecoderTuning* t) { t->decode_partition = 15; }, "--decode-partition 15"},
      {[](CudaDecoderTuning* t) { t->decode_partition = 65537; }, "--decode-partition 65537"},
      {[](CudaDecoderTuning* t) { t->prefill_attention = "tiled"; }, "--prefill-attention 'tiled'"},
      {[](CudaDecoderTuning* t) { t->decode_attention = "auto"; }, "--decode-attention 'auto'"},
      {[](CudaDecoderTuning* t) { t->decode_stages = 1; }, "--decode-stages 1"},
      {[](CudaDecoderTuning* t) { t->decode_stages = 5; }, "--decode-stages 5"},
      {[](CudaDecoderTuning* t) { t->pdl = "sometimes"; }, "--pdl 'sometimes'"},
      {[](CudaDecoderTuning* t) { t->kquant_gemv = "int4"; }, "--kquant-gemv 'int4'"},
      {[](CudaDecoderTuning* t) { t->mixed_attention = "decode"; }, "--mixed-attention 'decode'"},
  };
  for (const Case& c : cases) {
    DecoderOptions o;
    c.set(&o.cuda);
    auto model = LoadDecoder("/nonexistent/model.gguf", o, CpuBackends());
    ASSERT_FALSE(model.ok()) << c.flag;
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(model.status().message().find(c.flag), std::string::npos) << model.status().ToString();
  }
  // The edges are accepted.
  CudaDecoderTuning edge;
  edge.gemv_max_rows = 8;
  edge.fp8_gemv_max_rows = 0;
  edge.gemv_split = 8;
  edge.decode_min_partition = 512;
  edge.decode_partition = 512;
  edge.prefill_attention = "warp";
  edge.decode_attention = "warp";
  edge.decode_stages = 4;
  edge.mixed_attention = "prefill";
  for (const char* math : {"auto", "fp32", "int8"}) {
    edge.kquant_gemv = math;
    EXPECT_TRUE(ValidateCudaDecoderTuning(edge).ok()) << math;
  }
}

}  // namespace
}  // namespace stoke
