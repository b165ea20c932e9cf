#include "tools/synth/synth.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "base/file_util.h"
#include "engine/loader/hf_folder.h"
#include "engine/model/bert.h"
#include "engine/model/factory.h"
#include "engine/runner/generate.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke::synth {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / fmt::format("stoke_synth_test_{}_{}", ::getpid(), name);
  fs::remove_all(p);
  return p.string();
}

SynthOptions Small(const std::string& shape, const std::string& dir, int layers = 2, uint64_t seed = 7) {
  SynthOptions o;
  o.shape = shape;
  o.out_dir = dir;
  o.layers = layers;
  o.seed = seed;
  o.threads = 2;
  o.progress = false;
  return o;
}

std::vector<int32_t> RandomIds(int n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = d(rng);
  return ids;
}

TEST(SynthNormal, UnitVarianceZeroMean) {
  double sum = 0, sq = 0, mx = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const double v = SynthNormal(42, i);
    sum += v;
    sq += v * v;
    mx = std::max(mx, std::abs(v));
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
  EXPECT_LE(mx, 3.47);
  EXPECT_GT(mx, 3.0);
  EXPECT_NE(SynthTensorKey(1, "a"), SynthTensorKey(2, "a"));
  EXPECT_NE(SynthTensorKey(1, "a"), SynthTensorKey(1, "b"));
}

TEST(Synth, UnknownShapeListsTheShapes) {
  auto a = ShapeArch("llama-70b");
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(a.status().message(), HasSubstr("llama-70b"));
  for (const auto& s : ShapeNames()) EXPECT_THAT(a.status().message(), HasSubstr(s));
  SynthOptions o = Small("bert-base", TempDir("mismatch"));
  o.arch = "llama";
  auto r = WriteSynthModel(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("does not match"));
  o.arch = "";
  o.dtype = "fp8";
  EXPECT_THAT(WriteSynthModel(o).status().message(), HasSubstr("bf16, f16 or f32"));
}

// SmolLM2's shape with 2 layers: stoke loads it (config, weights, tokenizer) and a step gives the logits the
// scheme promises: top-1 = the input token (tied embeddings) by a wide margin, the rest spread by the layers.
TEST(Synth, SmolLm2LoadsStepsAndIsWellConditioned) {
  const std::string dir = TempDir("smol");
  auto r = WriteSynthModel(Small("smollm2-135m", dir));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files.front(), "model.safetensors");
  // 2 layers of SmolLM2-135M: embedding 49152x576 + 2 x (attention + MLP + 2 norms) + final norm.
  const int64_t layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576;
  EXPECT_EQ(r->parameters, 49152LL * 576 + 2 * layer + 576);
  EXPECT_EQ(r->weight_bytes, 2 * r->parameters);

  auto model = LoadDecoder(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const LlamaConfig& c = (*model)->config();
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);

  const std::vector<int32_t> ids = RandomIds(40, 17, 49152, 3);
  auto logits = ScoreLogits(**model, ids, 16);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  const int V = c.vocab_size;
  double min_margin = 1e9, spread_sum = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = logits->data() + t * V;
    std::vector<float> v(row, row + V);
    for (float x : v) ASSERT_TRUE(std::isfinite(x));
    const int top = static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
    EXPECT_EQ(top, ids[t]) << "position " << t;
    std::nth_element(v.begin(), v.begin() + 1, v.end(), std::greater<>());
    min_margin = std::min<double>(min_margin, v[0] - v[1]);
    double m = 0, s = 0;
    for (int j = 0; j < V; ++j) m += row[j];
    m /= V;
    for (int j = 0; j < V; ++j) s += (row[j] - m) * (row[j] - m);
    spread_sum += std::sqrt(s / V);
  }
  const double spread = spread_sum / ids.size();
  EXPECT_GT(min_margin, 3.0);
  EXPECT_GT(spread, 1.0);
  EXPECT_LT(spread, 5.0);

  // The context matters: the same token after different prefixes gives different logits.
  std::vector<int32_t> a = {100, 200, 300, 400}, b = {500, 600, 700, 400};
  auto la = ScoreLogits(**model, a, 16), lb = ScoreLogits(**model, b, 16);
  ASSERT_TRUE(la.ok() && lb.ok());
  double diff = 0;
  for (int j = 0; j < V; ++j) diff = std::max<double>(diff, std::abs((*la)[3 * V + j] - (*lb)[3 * V + j]));
  EXPECT_GT(diff, 0.3);

  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  const std::string text = "Hello, world! 1234 synthetic tokens\n";
  auto enc = (*tok)->Encode(text);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ((*tok)->Decode(*enc), text);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{2});
  fs::remove_all(dir);
}

// Llama 3 tokenizer: specials at 128000+, BOS added, the vocabulary exactly fills vocab_size. Checked on the
// tokenizer file alone (the 1B's weights are too big for a CPU unit test).
TEST(Synth, Llama3ShapeConfigAndTokenizer) {
  const std::string dir = TempDir("llama1b");
  SynthOptions o = Small("llama-3.2-1b", dir, 1);
  auto r = WriteSynthModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto cfg = ReadJsonFile(dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ((*cfg)["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ((*cfg)["rope_theta"], 500000.0);
  EXPECT_EQ((*cfg)["tie_word_embeddings"], true);
  EXPECT_EQ((*cfg)["num_hidden_layers"], 1);
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 128256);
  EXPECT_EQ((*tok)->bos_id(), 128000);
  auto enc = (*tok)->Encode("The capital of France is");
  ASSERT_TRUE(enc.ok());
  ASSERT_FALSE(enc->empty());
  EXPECT_EQ((*enc)[0], 128000);
  EXPECT_EQ((*tok)->Decode(*enc), "The capital of France is");
  EXPECT_EQ((*tok)->TokenText(128009), "<|eot_id|>");
  fs::remove_all(dir);
}

TEST(Synth, BertBaseLoadsAndEmbeds) {
  const std::string dir = TempDir("bert");
  auto r = WriteSynthModel(Small("bert-base", dir));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto enc = BertEncoder::Load(dir);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ((*enc)->config().num_hidden_layers, 2);
  EXPECT_EQ((*enc)->config().hidden_size, 768);
  EXPECT_EQ((*enc)->config().vocab_size, 30522);
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 30522);
  auto a = (*tok)->Encode("hello world, this is a test");
  auto b = (*tok)->Encode("something else entirely");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->front(), 101);
  EXPECT_EQ(a->back(), 102);
  std::vector<float> out;
  ASSERT_TRUE((*enc)->Embed({*a, *b}, &out).ok());
  ASSERT_EQ(out.size(), 2u * 768);
  double na = 0, nb = 0, dot = 0;
  for (int i = 0; i < 768; ++i) {
    ASSERT_TRUE(std::isfinite(out[i]) && std::isfinite(out[768 + i]));
    na += out[i] * out[i];
    nb += out[768 + i] * out[768 + i];
    dot += out[i] * out[768 + i];
  }
  EXPECT_NEAR(na, 1.0, 1e-3);
  EXPECT_NEAR(nb, 1.0, 1e-3);
  EXPECT_LT(dot, 0.999);  // different texts, different embeddings
  fs::remove_all(dir);
}

TEST(Synth, DeterministicForASeed) {
  const std::string d1 = TempDir("det1"), d2 = TempDir("det2"), d3 = TempDir("det3");
  SynthOptions o = Small("bert-base", d1, 1, 5);
  ASSERT_TRUE(WriteSynthModel(o).ok());
  o.out_dir = d2;
  o.threads = 1;  // thread count must not matter
  ASSERT_TRUE(WriteSynthModel(o).ok());
  o.out_dir = d3;
  o.seed = 6;
  ASSERT_TRUE(WriteSynthModel(o).ok());
  for (const char* f : {"model.safetensors", "tokenizer.json", "config.json", "vocab.txt"}) {
    auto a = ReadFileToString(d1 + "/" + f), b = ReadFileToString(d2 + "/" + f);
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    EXPECT_TRUE(*a == *b) << f << " differs for the same seed";
  }
  auto a = ReadFileToString(d1 + "/model.safetensors"), c = ReadFileToString(d3 + "/model.safetensors");
  ASSERT_TRUE(a.ok() && c.ok());
  EXPECT_EQ(a->size(), c->size());
  EXPECT_FALSE(*a == *c) << "a different seed gave the same weights";
  for (const auto& d : {d1, d2, d3}) fs::remove_all(d);
}

// Shards + index (forced small here) load as one model with the same logits as the single file.
TEST(Synth, ShardedEqualsSingleFile) {
  const std::string one = TempDir("one"), many = TempDir("many");
  ASSERT_TRUE(WriteSynthModel(Small("smollm2-135m", one, 2)).ok());
  SynthOptions o = Small("smollm2-135m", many, 2);
  o.max_shard_bytes = 10'000'000;
  auto r = WriteSynthModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files.front(), "model-00001-of-00003.safetensors");
  EXPECT_TRUE(fs::exists(many + "/model.safetensors.index.json"));
  auto folder = HfFolder::Open(many);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ((*folder)->shards().size(), 3u);
  auto m1 = LoadDecoder(one), m2 = LoadDecoder(many);
  ASSERT_TRUE(m1.ok() && m2.ok());
  const std::vector<int32_t> ids = {5, 600, 7000, 8000, 42};
  auto l1 = ScoreLogits(**m1, ids, 8), l2 = ScoreLogits(**m2, ids, 8);
  ASSERT_TRUE(l1.ok() && l2.ok());
  EXPECT_EQ(*l1, *l2);
  fs::remove_all(one);
  fs::remove_all(many);
}

}  // namespace
}  // namespace stoke::synth
