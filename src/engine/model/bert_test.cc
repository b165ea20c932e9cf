#include "engine/model/bert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "base/half.h"
#include "engine/model/backends.h"
#include "engine/model/bert_backend.h"
#include "kernels/cpu/kv_quant.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

// A tiny random BERT written as an HF folder, plus a double-precision reference forward pass over the same
// (dtype-rounded) weights.
struct TinyBert {
  int vocab = 40, hidden = 16, heads = 4, layers = 2, inter = 24, max_pos = 24, types = 2;
  float eps = 1e-12f;
  std::map<std::string, std::vector<float>> w;  // normalised name -> values (as stored, after dtype rounding)
  std::map<std::string, std::vector<int64_t>> shapes;

  void Add(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng, float stddev,
           float mean = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    w[name] = std::move(v);
    shapes[name] = std::move(shape);
  }

  explicit TinyBert(uint32_t seed) {
    std::mt19937 rng(seed);
    Add("embeddings.word_embeddings.weight", {vocab, hidden}, rng, 0.5f);
    Add("embeddings.position_embeddings.weight", {max_pos, hidden}, rng, 0.5f);
    Add("embeddings.token_type_embeddings.weight", {types, hidden}, rng, 0.5f);
    Add("embeddings.LayerNorm.weight", {hidden}, rng, 0.1f, 1.0f);
    Add("embeddings.LayerNorm.bias", {hidden}, rng, 0.1f);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      for (const char* qkv : {"query", "key", "value"}) {
        Add(p + "attention.self." + qkv + ".weight", {hidden, hidden}, rng, 0.3f);
        Add(p + "attention.self." + qkv + ".bias", {hidden}, rng, 0.1f);
      }
      Add(p + "attention.output.dense.weight", {hidden, hidden}, rng, 0.3f);
      Add(p + "attention.output.dense.bias", {hidden}, rng, 0.1f);
      Add(p + "attention.output.LayerNorm.weight", {hidden}, rng, 0.1f, 1.0f);
      Add(p + "attention.output.LayerNorm.bias", {hidden}, rng, 0.1f);
      Add(p + "intermediate.dense.weight", {inter, hidden}, rng, 0.3f);
      Add(p + "intermediate.dense.bias", {inter}, rng, 0.1f);
      Add(p + "output.dense.weight", {hidden, inter}, rng, 0.3f);
      Add(p + "output.dense.bias", {hidden}, rng, 0.1f);
      Add(p + "output.LayerNorm.weight", {hidden}, rng, 0.1f, 1.0f);
      Add(p + "output.LayerNorm.bias", {hidden}, rng, 0.1f);
    }
    Add("pooler.dense.weight", {hidden, hidden}, rng, 0.3f);  // present in real checkpoints, unused
  }

  struct WriteOptions {
    bool bert_prefix = false;  // "bert.encoder..." as BertFor* checkpoints
    bool gamma_beta = false;   // LayerNorm.gamma/.beta as old TF conversions
    bool f16_linears = false;  // Linear weights stored as F16 (values rounded in `w` too)
    bool misalign = false;     // data buffer at an odd file offset
    int sentence_max_seq = 0;  // write sentence_bert_config.json when > 0
    std::string hidden_act = "gelu";
  };

  // Writes config.json, model.safetensors (and sentence_bert_config.json) into `dir`.
  void Write(const fs::path& dir, const WriteOptions& o) {
    fs::create_directories(dir);
    nlohmann::json cfg = {{"architectures", {"BertModel"}},
                          {"model_type", "bert"},
                          {"vocab_size", vocab},
                          {"hidden_size", hidden},
                          {"num_hidden_layers", layers},
                          {"num_attention_heads", heads},
                          {"intermediate_size", inter},
                          {"max_position_embeddings", max_pos},
                          {"type_vocab_size", types},
                          {"layer_norm_eps", eps},
                          {"hidden_act", o.hidden_act},
                          {"pad_token_id", 0}};
    std::ofstream(dir / "config.json") << cfg.dump(2);
    if (o.sentence_max_seq > 0) {
      std::ofstream(dir / "sentence_bert_config.json")
          << nlohmann::json{{"max_seq_length", o.sentence_max_seq}, {"do_lower_case", false}}.dump();
    }
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (auto& [name, values] : w) {
      const bool linear = shapes[name].size() == 2 && name.find("embeddings") == std::string::npos;
      const bool f16 = o.f16_linears && linear;
      std::string file_name = name;
      if (o.gamma_beta && name.find("LayerNorm.weight") != std::string::npos) {
        file_name.replace(file_name.find("weight"), 6, "gamma");
      } else if (o.gamma_beta && name.find("LayerNorm.bias") != std::string::npos) {
        file_name.replace(file_name.find("bias"), 4, "beta");
      }
      if (o.bert_prefix && name.rfind("pooler", 0) != 0) file_name = "bert." + file_name;
      const size_t begin = data.size();
      for (float& x : values) {
        if (f16) {
          const uint16_t h = Fp32ToFp16(x);
          x = Fp16ToFp32(h);
          data.append(reinterpret_cast<const char*>(&h), 2);
        } else {
          data.append(reinterpret_cast<const char*>(&x), 4);
        }
      }
      header[file_name] = {
          {"dtype", f16 ? "F16" : "F32"}, {"shape", shapes[name]}, {"data_offsets", {begin, data.size()}}};
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string h = header.dump();
    // PyTorch's writer pads the header so data starts 8-aligned; `misalign` makes it start at an odd offset.
    while ((8 + h.size()) % 8 != (o.misalign ? 1u : 0u)) h += ' ';
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << data;
  }

  // Double-precision forward pass + mean pooling + L2 normalisation for one sequence.
  std::vector<double> Reference(const std::vector<int32_t>& ids) const {
    const int64_t len = ids.size(), hd = hidden / heads;
    auto at = [&](const std::string& n) -> const std::vector<float>& { return w.at(n); };
    std::vector<double> x(len * hidden);
    auto layer_norm = [&](std::vector<double>& v, const std::string& prefix) {
      const auto &g = at(prefix + ".weight"), &b = at(prefix + ".bias");
      for (int64_t t = 0; t < len; ++t) {
        double mean = 0, var = 0;
        for (int j = 0; j < hidden; ++j) mean += v[t * hidden + j];
        mean /= hidden;
        for (int j = 0; j < hidden; ++j) var += (v[t * hidden + j] - mean) * (v[t * hidden + j] - mean);
        var /= hidden;
        for (int j = 0; j < hidden; ++j) {
          v[t * hidden + j] = (v[t * hidden + j] - mean) / std::sqrt(var + eps) * g[j] + b[j];
        }
      }
    };
    auto linear = [&](const std::vector<double>& in, int64_t in_f, const std::string& prefix, int64_t out_f) {
      const auto &wt = at(prefix + ".weight"), &b = at(prefix + ".bias");
      std::vector<double> y(len * out_f);
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t o = 0; o < out_f; ++o) {
          double s = b[o];
          for (int64_t i = 0; i < in_f; ++i) s += in[t * in_f + i] * wt[o * in_f + i];
          y[t * out_f + o] = s;
        }
      }
      return y;
    };
    const auto &word = at("embeddings.word_embeddings.weight"),
               &pos = at("embeddings.position_embeddings.weight"),
               &type = at("embeddings.token_type_embeddings.weight");
    for (int64_t t = 0; t < len; ++t) {
      for (int j = 0; j < hidden; ++j) {
        x[t * hidden + j] = double(word[ids[t] * hidden + j]) + pos[t * hidden + j] + type[j];
      }
    }
    layer_norm(x, "embeddings.LayerNorm");
    for (int l = 0; l < layers; ++l) {
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      auto q = linear(x, hidden, p + "attention.self.query", hidden);
      auto k = linear(x, hidden, p + "attention.self.key", hidden);
      auto v = linear(x, hidden, p + "attention.self.value", hidden);
      std::vector<double> ctx(len * hidden, 0.0), sc(len);
      for (int h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < len; ++i) {
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j < len; ++j) {
            double s = 0;
            for (int d = 0; d < hd; ++d) s += q[i * hidden + h * hd + d] * k[j * hidden + h * hd + d];
            sc[j] = s / std::sqrt(double(hd));
            mx = std::max(mx, sc[j]);
          }
          for (int64_t j = 0; j < len; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
          for (int64_t j = 0; j < len; ++j) {
            for (int d = 0; d < hd; ++d)
              ctx[i * hidden + h * hd + d] += sc[j] / sum * v[j * hidden + h * hd + d];
          }
        }
      }
      auto a = linear(ctx, hidden, p + "attention.output.dense", hidden);
      for (size_t i = 0; i < x.size(); ++i) x[i] += a[i];
      layer_norm(x, p + "attention.output.LayerNorm");
      auto f = linear(x, hidden, p + "intermediate.dense", inter);
      for (double& z : f) z = 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
      auto o = linear(f, inter, p + "output.dense", hidden);
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      layer_norm(x, p + "output.LayerNorm");
    }
    std::vector<double> e(hidden, 0.0);
    for (int64_t t = 0; t < len; ++t) {
      for (int j = 0; j < hidden; ++j) e[j] += x[t * hidden + j] / len;
    }
    double n = 0;
    for (double z : e) n += z * z;
    for (double& z : e) z /= std::sqrt(n);
    return e;
  }
};

class BertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stoke_bert_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<BertEncoder> LoadOrDie(const TinyBert::WriteOptions& o) {
    model_.Write(dir_, o);
    auto enc = BertEncoder::Load(dir_.string());
    EXPECT_TRUE(enc.ok()) << enc.status().ToString();
    return enc.ok() ? std::move(enc).value() : nullptr;
  }

  std::vector<std::vector<int32_t>> RandomBatch(int n, int min_len, int max_len, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> batch(n);
    for (auto& ids : batch) {
      ids.resize(std::uniform_int_distribution<int>(min_len, max_len)(rng));
      for (int32_t& id : ids) id = std::uniform_int_distribution<int>(0, model_.vocab - 1)(rng);
    }
    return batch;
  }

  void ExpectMatchesReference(const BertEncoder& enc, double tol) {
    auto batch = RandomBatch(5, 1, 20, 7);
    std::vector<float> out(1, std::nanf(""));
    ASSERT_TRUE(enc.Embed(batch, &out).ok());
    ASSERT_EQ(out.size(), batch.size() * model_.hidden);
    for (size_t s = 0; s < batch.size(); ++s) {
      const auto ref = model_.Reference(batch[s]);
      for (int j = 0; j < model_.hidden; ++j) {
        ASSERT_NEAR(out[s * model_.hidden + j], ref[j], tol)
            << "sequence " << s << " (len " << batch[s].size() << ") dim " << j;
      }
    }
  }

  fs::path dir_;
  TinyBert model_{1234};
};

TEST_F(BertTest, MatchesDoublePrecisionReference) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  EXPECT_EQ(enc->config().hidden_size, 16);
  EXPECT_EQ(enc->config().num_hidden_layers, 2);
  EXPECT_EQ(enc->max_seq_length(), 24);  // no sentence_bert_config.json: max_position_embeddings
  ExpectMatchesReference(*enc, 2e-5);
}

TEST_F(BertTest, AcceptsBertPrefixAndGammaBeta) {
  auto enc = LoadOrDie({.bert_prefix = true, .gamma_beta = true});
  ASSERT_NE(enc, nullptr);
  ExpectMatchesReference(*enc, 2e-5);
}

TEST_F(BertTest, F16LinearsAndMisalignedData) {
  auto enc = LoadOrDie({.f16_linears = true, .misalign = true});
  ASSERT_NE(enc, nullptr);
  ExpectMatchesReference(*enc, 1e-4);
}

TEST_F(BertTest, BatchEqualsEachAlone) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  // Very different lengths in one batch: a short sequence must not see the long one's tokens, and nothing
  // padded may enter its mean.
  auto batch = RandomBatch(9, 1, 24, 99);
  batch[3] = {1, 5, 2};
  batch[4].assign(24, 7);
  std::vector<float> all;
  ASSERT_TRUE(enc->Embed(batch, &all).ok());
  for (size_t s = 0; s < batch.size(); ++s) {
    std::vector<float> one;
    ASSERT_TRUE(enc->Embed({batch[s]}, &one).ok());
    for (int j = 0; j < model_.hidden; ++j) {
      ASSERT_NEAR(all[s * model_.hidden + j], one[j], 1e-6) << "sequence " << s << " dim " << j;
    }
  }
  // Batch order does not matter either.
  std::vector<std::vector<int32_t>> reversed(batch.rbegin(), batch.rend());
  std::vector<float> rev;
  ASSERT_TRUE(enc->Embed(reversed, &rev).ok());
  const size_t n = batch.size();
  for (size_t s = 0; s < n; ++s) {
    for (int j = 0; j < model_.hidden; ++j) {
      ASSERT_NEAR(rev[(n - 1 - s) * model_.hidden + j], all[s * model_.hidden + j], 1e-6);
    }
  }
}

TEST_F(BertTest, MeanIsOverRealTokensOnly) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  // Batched with a long sequence, a 2-token sequence's embedding is the mean of its own 2 tokens (the
  // reference pools exactly those).
  std::vector<std::vector<int32_t>> batch = {{3, 4}, std::vector<int32_t>(20, 9)};
  std::vector<float> out;
  ASSERT_TRUE(enc->Embed(batch, &out).ok());
  const auto ref = model_.Reference({3, 4});
  for (int j = 0; j < model_.hidden; ++j) EXPECT_NEAR(out[j], ref[j], 2e-5);
  // ... and appending pad ids (0) would change it: padding is not something the encoder may see.
  const auto padded_ref = model_.Reference({3, 4, 0, 0});
  double diff = 0;
  for (int j = 0; j < model_.hidden; ++j) diff += std::abs(out[j] - padded_ref[j]);
  EXPECT_GT(diff, 1e-3);
}

TEST_F(BertTest, UnitNorm) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  auto batch = RandomBatch(6, 1, 24, 3);
  std::vector<float> out;
  ASSERT_TRUE(enc->Embed(batch, &out).ok());
  for (size_t s = 0; s < batch.size(); ++s) {
    double n = 0;
    for (int j = 0; j < model_.hidden; ++j)
      n += double(out[s * model_.hidden + j]) * out[s * model_.hidden + j];
    EXPECT_NEAR(std::sqrt(n), 1.0, 1e-5);
  }
}

TEST_F(BertTest, TruncatesAtSentenceMaxSeqLengthKeepingLastId) {
  auto enc = LoadOrDie({.sentence_max_seq = 12});
  ASSERT_NE(enc, nullptr);
  EXPECT_EQ(enc->max_seq_length(), 12);
  std::vector<int32_t> longer(20);
  for (int i = 0; i < 20; ++i) longer[i] = i + 1;
  std::vector<int32_t> truncated(longer.begin(), longer.begin() + 11);
  truncated.push_back(longer.back());
  std::vector<float> a, b;
  ASSERT_TRUE(enc->Embed({longer, {5, 6}}, &a).ok());
  ASSERT_TRUE(enc->Embed({truncated}, &b).ok());
  const auto ref = model_.Reference(truncated);
  for (int j = 0; j < model_.hidden; ++j) {
    EXPECT_NEAR(a[j], b[j], 1e-6);
    EXPECT_NEAR(a[j], ref[j], 2e-5);
  }
  // Raising the limit (clamped to max_position_embeddings = 24) lets all 20 tokens in.
  enc->set_max_seq_length(1000);
  EXPECT_EQ(enc->max_seq_length(), 24);
  ASSERT_TRUE(enc->Embed({longer}, &a).ok());
  const auto full = model_.Reference(longer);
  for (int j = 0; j < model_.hidden; ++j) EXPECT_NEAR(a[j], full[j], 2e-5);
}

TEST_F(BertTest, RejectsBadInput) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  std::vector<float> out;
  Status st = enc->Embed({{1, 2}, {}}, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.message();
  st = enc->Embed({{1, 40}}, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("40"), std::string::npos) << st.message();
  EXPECT_EQ(enc->Embed({{-1}}, &out).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(enc->Embed({}, &out).ok());
  EXPECT_TRUE(out.empty());
}

TEST_F(BertTest, RejectsBadModels) {
  model_.Write(dir_, {.hidden_act = "gelu_new"});
  auto enc = BertEncoder::Load(dir_.string());
  ASSERT_FALSE(enc.ok());
  EXPECT_NE(enc.status().message().find("gelu_new"), std::string::npos) << enc.status().message();

  fs::remove_all(dir_);
  model_.w.erase("encoder.layer.1.output.dense.bias");
  model_.Write(dir_, {});
  enc = BertEncoder::Load(dir_.string());
  ASSERT_FALSE(enc.ok());
  EXPECT_NE(enc.status().message().find("encoder.layer.1.output.dense.bias"), std::string::npos)
      << enc.status().message();

  EXPECT_FALSE(BertEncoder::Load((dir_ / "no_such_dir").string()).ok());

  nlohmann::json bad = {{"hidden_size", 10}, {"num_attention_heads", 3}};
  EXPECT_EQ(BertConfig::FromJson(bad, "c.json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BertConfig::FromJson(nlohmann::json{{"vocab_size", "big"}}, "c.json").status().code(),
            StatusCode::kInvalidArgument);
  auto defaults = BertConfig::FromJson(nlohmann::json::object(), "c.json");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->hidden_size, 768);
  EXPECT_EQ(defaults->head_dim(), 64);
}

// ---- --quantization fp8 on the CPU (BertEncoder::QuantizeWeightsFp8) ----

// Every Linear of every layer, in a fixed order.
std::vector<const BertEncoder::Linear*> Linears(const BertEncoder& enc) {
  std::vector<const BertEncoder::Linear*> all;
  for (const BertEncoder::Layer& l : enc.layers()) {
    for (const BertEncoder::Linear* m : {&l.query, &l.key, &l.value, &l.attn_out, &l.intermediate, &l.output})
      all.push_back(m);
  }
  return all;
}

// A Linear's weight widened to fp32 (F32 or F16 as TinyBert writes them).
std::vector<float> Weights(const BertEncoder::Linear& m) {
  std::vector<float> out(m.out * m.in);
  for (int64_t i = 0; i < m.out * m.in; ++i) {
    if (m.dtype == DType::kF32) {
      std::memcpy(&out[i], static_cast<const uint8_t*>(m.w) + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(m.w) + 2 * i, 2);
      out[i] = m.dtype == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
  return out;
}

// The reference: cpu::QuantizeKvRow's fp8 branch per row, dequantised with scale · multiplier.
std::vector<float> ReferenceRoundTrip(const std::vector<float>& w, int64_t rows, int64_t cols,
                                      float multiplier = 1.0f) {
  std::vector<float> out(w.size());
  std::vector<uint8_t> q(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale =
        cpu::QuantizeKvRow(w.data() + r * cols, static_cast<int>(cols), KvCacheDtype::kFp8, q.data());
    cpu::DequantizeKvRow(q.data(), static_cast<int>(cols), scale * multiplier, KvCacheDtype::kFp8,
                         out.data() + r * cols);
  }
  return out;
}

TEST_F(BertTest, Fp8WeightsAreTheReferenceQuantisersRoundTrip) {
  for (bool f16 : {false, true}) {
    SCOPED_TRACE(f16 ? "F16 linears" : "F32 linears");
    auto enc = LoadOrDie({.f16_linears = f16});
    ASSERT_NE(enc, nullptr);
    EXPECT_EQ(enc->quantization(), WeightQuantization::kNone);
    std::vector<std::vector<float>> before;
    for (const auto* m : Linears(*enc)) before.push_back(Weights(*m));
    ASSERT_TRUE(enc->QuantizeWeightsFp8().ok());
    EXPECT_EQ(enc->quantization(), WeightQuantization::kFp8);
    const auto after = Linears(*enc);
    ASSERT_EQ(after.size(), 6u * model_.layers);
    size_t changed = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      const BertEncoder::Linear& m = *after[i];
      EXPECT_EQ(m.dtype, DType::kF32);
      const std::vector<float> ref = ReferenceRoundTrip(before[i], m.out, m.in);
      const std::vector<float> got = Weights(m);
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(got[j], ref[j]) << "linear " << i << " value " << j;
        changed += got[j] != before[i][j];
      }
    }
    EXPECT_GT(changed, 0u);  // E4M3 keeps 3 mantissa bits: most values move
  }
}

TEST_F(BertTest, Fp8AllZeroRowsStayZero) {
  // Row 3 of layer 0's query and the last row of layer 1's output dense: all zeros (scale 0).
  auto& q = model_.w["encoder.layer.0.attention.self.query.weight"];
  std::fill(q.begin() + 3 * model_.hidden, q.begin() + 4 * model_.hidden, 0.0f);
  auto& o = model_.w["encoder.layer.1.output.dense.weight"];
  std::fill(o.end() - model_.inter, o.end(), 0.0f);
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  ASSERT_TRUE(enc->QuantizeWeightsFp8().ok());
  const std::vector<float> qw = Weights(enc->layers()[0].query);
  for (int j = 0; j < model_.hidden; ++j) {
    EXPECT_EQ(qw[3 * model_.hidden + j], 0.0f) << j;
    EXPECT_FALSE(std::signbit(qw[3 * model_.hidden + j])) << j;
  }
  EXPECT_NE(qw[2 * model_.hidden], 0.0f);
  const std::vector<float> ow = Weights(enc->layers()[1].output);
  for (int j = 0; j < model_.inter; ++j) EXPECT_EQ(ow[ow.size() - model_.inter + j], 0.0f) << j;
}

TEST_F(BertTest, Fp8LeavesEmbeddingsNormsAndBiasesAlone) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  const void* word = enc->word_embeddings();
  const void* pos = enc->position_embeddings();
  const std::vector<float> type0 = enc->token_type0_embedding();
  const BertEncoder::Norm emb_norm = enc->embedding_norm();
  const std::vector<BertEncoder::Layer> layers = enc->layers();  // biases and norms copied
  ASSERT_TRUE(enc->QuantizeWeightsFp8().ok());
  EXPECT_EQ(enc->word_embeddings(), word);
  EXPECT_EQ(enc->word_dtype(), DType::kF32);
  EXPECT_EQ(enc->position_embeddings(), pos);
  EXPECT_EQ(enc->token_type0_embedding(), type0);
  EXPECT_EQ(enc->embedding_norm().gamma, emb_norm.gamma);
  EXPECT_EQ(enc->embedding_norm().beta, emb_norm.beta);
  ASSERT_EQ(enc->layers().size(), layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const BertEncoder::Layer &a = layers[l], &b = enc->layers()[l];
    EXPECT_EQ(a.attn_norm.gamma, b.attn_norm.gamma);
    EXPECT_EQ(a.attn_norm.beta, b.attn_norm.beta);
    EXPECT_EQ(a.out_norm.gamma, b.out_norm.gamma);
    EXPECT_EQ(a.out_norm.beta, b.out_norm.beta);
    EXPECT_EQ(a.query.bias, b.query.bias);
    EXPECT_EQ(a.key.bias, b.key.bias);
    EXPECT_EQ(a.value.bias, b.value.bias);
    EXPECT_EQ(a.attn_out.bias, b.attn_out.bias);
    EXPECT_EQ(a.intermediate.bias, b.intermediate.bias);
    EXPECT_EQ(a.output.bias, b.output.bias);
    EXPECT_NE(a.query.w, b.query.w);  // the weights themselves are new buffers
    EXPECT_EQ(b.intermediate.out, model_.inter);
    EXPECT_EQ(b.intermediate.in, model_.hidden);
  }
}

TEST_F(BertTest, Fp8QuantisingTwiceIsRefused) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  ASSERT_TRUE(enc->QuantizeWeightsFp8().ok());
  const std::vector<float> once = Weights(enc->layers()[0].key);
  Status again = enc->QuantizeWeightsFp8();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
  EXPECT_NE(again.message().find("already quantised"), std::string::npos) << again.ToString();
  EXPECT_EQ(Weights(enc->layers()[0].key), once);
  EXPECT_EQ(enc->quantization(), WeightQuantization::kFp8);
}

TEST_F(BertTest, Fp8EmbeddingsStayCloseAndTheBrokenMultiplierMovesThem) {
  model_.Write(dir_, {});  // once: the three encoders map the same file
  auto load = [&]() { return BertEncoder::Load(dir_.string()); };
  auto fp32_or = load(), good_or = load(), broken_or = load();
  ASSERT_TRUE(fp32_or.ok() && good_or.ok() && broken_or.ok());
  auto &fp32 = *fp32_or, &good = *good_or, &broken = *broken_or;
  const std::vector<float> w = Weights(good->layers()[1].value);
  ASSERT_TRUE(good->QuantizeWeightsFp8().ok());
  ASSERT_TRUE(broken->QuantizeWeightsFp8({.testing_scale_multiplier = 1.5f}).ok());
  // The broken quantiser's values are the reference's round trip with every scale 1.5x.
  const BertEncoder::Linear& bv = broken->layers()[1].value;
  const std::vector<float> ref = ReferenceRoundTrip(w, bv.out, bv.in, 1.5f);
  const std::vector<float> got = Weights(bv);
  const std::vector<float> ok = Weights(good->layers()[1].value);
  size_t differ = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j], ref[j]) << j;
    differ += got[j] != ok[j];
  }
  EXPECT_GT(differ, got.size() / 2);
  // Embeddings: fp8 weights stay close to fp32 (cosine), the broken ones move further.
  auto batch = RandomBatch(4, 3, 16, 11);
  std::vector<float> e32, e8, ebad;
  ASSERT_TRUE(fp32->Embed(batch, &e32).ok());
  ASSERT_TRUE(good->Embed(batch, &e8).ok());
  ASSERT_TRUE(broken->Embed(batch, &ebad).ok());
  auto min_cosine = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 1;
    for (size_t s = 0; s < batch.size(); ++s) {
      double dot = 0;  // unit vectors
      for (int j = 0; j < model_.hidden; ++j)
        dot += double(a[s * model_.hidden + j]) * b[s * model_.hidden + j];
      worst = std::min(worst, dot);
    }
    return worst;
  };
  const double c8 = min_cosine(e32, e8), cbad = min_cosine(e32, ebad);
  EXPECT_GT(c8, 0.99);
  EXPECT_LT(cbad, c8);
  EXPECT_NE(e8, e32);
}

TEST_F(BertTest, Fp8CpuEncoderIsNotUploadedToADevice) {
  auto enc = LoadOrDie({});
  ASSERT_NE(enc, nullptr);
  ASSERT_TRUE(enc->QuantizeWeightsFp8().ok());
  std::shared_ptr<const BertEncoder> shared = std::move(enc);
  // cpu: the quantised CPU encoder itself runs (no device model).
  auto cpu = LoadBertOnDevice(shared, {.device = "cpu"}, CpuBackends());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(*cpu, nullptr);
  // cuda: the device quantises its own copy from the checkpoint's weights; a CPU-quantised encoder is
  // refused.
  Backends fake = CpuBackends();
  fake.cuda_bert = {.create = [](std::shared_ptr<const BertEncoder>,
                                 const BertDeviceOptions&) -> StatusOr<std::shared_ptr<BertDeviceModel>> {
                      return InternalError("not reached");
                    },
                    .available = nullptr};
  auto dev = LoadBertOnDevice(shared, {.device = "cuda", .quantization = WeightQuantization::kFp8}, fake);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kFailedPrecondition) << dev.status().ToString();
}

// The real all-MiniLM-L6-v2 (skipped when not downloaded): shape, the 256 limit, and one embedding against
// sentence-transformers 6.2.0 (ids of "Hello world, this is stoke.").
TEST(BertRealModelTest, MiniLmMatchesSentenceTransformers) {
  const char* env = std::getenv("STOKE_MODEL_DIR");
  const fs::path base =
      env ? fs::path(env) : fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/") / ".cache/stoke/models";
  const fs::path dir = base / "all-minilm-l6-v2";
  if (!fs::exists(dir / "model.safetensors"))
    GTEST_SKIP() << dir << " missing: run `stoke model fetch all-minilm-l6-v2`";
  auto enc = BertEncoder::Load(dir.string());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ((*enc)->max_seq_length(), 256);
  EXPECT_EQ((*enc)->hidden_size(), 384);
  const std::vector<int32_t> ids = {101, 7592, 2088, 1010, 2023, 2003, 13299, 1012, 102};
  std::vector<float> out;
  ASSERT_TRUE((*enc)->Embed({ids, {101, 102}}, &out).ok());
  ASSERT_EQ(out.size(), 2u * 384);
  const float expected[8] = {-0.0001096929f, -0.01101146f, -0.008754867f, -0.01033002f,
                             0.01481435f,    -0.03285023f, 0.02575045f,   -0.02686391f};
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(out[j], expected[j], 1e-5) << "dim " << j;
  EXPECT_NEAR(out[383], 0.038477488f, 1e-5);
}

TEST(BertDeviceOptionsTest, UnknownEncoderAttentionIsInvalidArgument) {
  for (const char* ok : {"auto", "tensor32", "tensor", "vectorized", "simple"}) {
    EXPECT_TRUE(ValidateBertDeviceOptions({.attention = ok}).ok()) << ok;
  }
  // Checked before the device is resolved, so a CPU build says so too.
  auto r = LoadBertOnDevice(nullptr, {.device = "cpu", .attention = "fast"}, CpuBackends());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--encoder-attention 'fast'"), std::string::npos)
      << r.status().ToString();
}

TEST(BertDeviceOptionsTest, UnknownEncoderEpiloguesIsInvalidArgument) {
  for (const char* ok : {"fused-tanh", "fused", "separate"}) {
    EXPECT_TRUE(ValidateBertDeviceOptions({.epilogues = ok}).ok()) << ok;
  }
  auto r = LoadBertOnDevice(nullptr, {.device = "cpu", .epilogues = "tanh"}, CpuBackends());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--encoder-epilogues 'tanh'"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace stoke
