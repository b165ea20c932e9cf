#include "engine/loader/hf_folder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/file_util.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct FakeTensor {
  std::string name;
  std::vector<float> values;
};

// A valid F32 safetensors file holding `tensors` as 1-D arrays.
std::string SafetensorsBytes(const std::vector<FakeTensor>& tensors) {
  std::string header = "{";
  std::string data;
  for (const FakeTensor& t : tensors) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    if (header.size() > 1) header += ",";
    header += fmt::format(R"("{}":{{"dtype":"F32","shape":[{}],"data_offsets":[{},{}]}})", t.name,
                          t.values.size(), begin, data.size());
  }
  header += "}";
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

class HfFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("stoke_hf_test_{}_{}", getpid(), counter_++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& contents) {
    fs::create_directories((dir_ / name).parent_path());
    ASSERT_TRUE(WriteStringToFile((dir_ / name).string(), contents).ok());
  }
  std::string dir() const { return dir_.string(); }

  fs::path dir_;
  static inline int counter_ = 0;
};

TEST_F(HfFolderTest, SingleFileWithBertNamesNormalised) {
  Write("config.json", R"({"model_type": "bert", "hidden_size": 4, "num_hidden_layers": 1})");
  Write("model.safetensors", SafetensorsBytes({{"bert.embeddings.LayerNorm.gamma", {1, 1, 1, 1}},
                                               {"bert.embeddings.LayerNorm.beta", {0, 0, 0, 0}},
                                               {"bert.encoder.layer.0.output.dense.weight", {1, 2}},
                                               {"cls.predictions.bias", {3}}}));
  Write("sentence_bert_config.json", R"({"max_seq_length": 256, "do_lower_case": false})");
  auto f = HfFolder::Open(dir() + "/");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->dir(), dir());
  EXPECT_EQ((*f)->config()["hidden_size"], 4);
  EXPECT_EQ((*f)->tensors().size(), 4u);
  EXPECT_EQ((*f)->shards().size(), 1u);

  const TensorRef* g = (*f)->FindTensor("embeddings.LayerNorm.weight");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->name, "embeddings.LayerNorm.weight");
  EXPECT_EQ((*f)->FindTensor("bert.embeddings.LayerNorm.gamma"), g);  // original name still works
  EXPECT_NE((*f)->FindTensor("embeddings.LayerNorm.bias"), nullptr);
  const TensorRef* d = (*f)->FindTensor("encoder.layer.0.output.dense.weight");
  ASSERT_NE(d, nullptr);
  float v[2];
  std::memcpy(v, d->data, sizeof(v));
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_NE((*f)->FindTensor("cls.predictions.bias"), nullptr);  // no "bert." prefix: unchanged
  EXPECT_EQ((*f)->FindTensor("embeddings.LayerNorm.gamma"), nullptr);

  EXPECT_EQ((*f)->FilePath("tokenizer.json"), dir() + "/tokenizer.json");
  EXPECT_EQ((*f)->SentenceMaxSeqLength(), 256);
}

TEST(HfNamesTest, Normalize) {
  EXPECT_EQ(NormalizeHfTensorName("bert.encoder.layer.0.attention.output.LayerNorm.gamma"),
            "encoder.layer.0.attention.output.LayerNorm.weight");
  EXPECT_EQ(NormalizeHfTensorName("encoder.layer.0.output.LayerNorm.beta"),
            "encoder.layer.0.output.LayerNorm.bias");
  EXPECT_EQ(NormalizeHfTensorName("model.layers.0.mlp.up_proj.weight"), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(NormalizeHfTensorName("xbert.gamma"), "xbert.gamma");
}

TEST_F(HfFolderTest, ShardedIndexOpensEachShardOnce) {
  Write("config.json", R"({"model_type": "llama"})");
  Write("model-00001-of-00002.safetensors", SafetensorsBytes({{"a", {1}}, {"b", {2, 3}}, {"c", {4}}}));
  Write("model-00002-of-00002.safetensors", SafetensorsBytes({{"d", {5}}, {"e", {6}}}));
  Write("model.safetensors.index.json", R"({"metadata": {"total_size": 24}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00001-of-00002.safetensors", "d": "model-00002-of-00002.safetensors",
      "e": "model-00002-of-00002.safetensors"}})");
  Write("model.safetensors", "ignored when an index exists");
  auto f = HfFolder::Open(dir());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->shards().size(), 2u);
  EXPECT_EQ((*f)->tensors().size(), 5u);
  for (const char* n : {"a", "b", "c", "d", "e"}) EXPECT_NE((*f)->FindTensor(n), nullptr) << n;
  float e;
  std::memcpy(&e, (*f)->FindTensor("e")->data, 4);
  EXPECT_EQ(e, 6.0f);
}

TEST_F(HfFolderTest, TensorMissingFromItsShardIsAnError) {
  Write("config.json", "{}");
  Write("s1.safetensors", SafetensorsBytes({{"a", {1}}}));
  Write("model.safetensors.index.json",
        R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  auto f = HfFolder::Open(dir());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(f.status().message(), HasSubstr("'ghost'"));
  EXPECT_THAT(f.status().message(), HasSubstr("s1.safetensors"));
}

TEST_F(HfFolderTest, IndexErrors) {
  Write("config.json", "{}");
  Write("model.safetensors.index.json", R"({"weight_map": {"a": "missing.safetensors"}})");
  auto f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("missing.safetensors"));

  Write("model.safetensors.index.json", R"({"weight_map": {"a": "../escape.safetensors"}})");
  f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("'a'"));

  Write("model.safetensors.index.json", R"({"metadata": {}})");
  f = HfFolder::Open(dir());
  EXPECT_THAT(f.status().message(), HasSubstr("weight_map"));

  Write("model.safetensors.index.json", "{\"weight_map\": {\n\"a\": }");
  f = HfFolder::Open(dir());
  EXPECT_THAT(f.status().message(), HasSubstr("model.safetensors.index.json:2:"));
}

TEST_F(HfFolderTest, DuplicateAfterNormalisationIsAnError) {
  Write("config.json", "{}");
  Write("model.safetensors", SafetensorsBytes({{"bert.pooler.dense.bias", {1}}, {"pooler.dense.bias", {2}}}));
  auto f = HfFolder::Open(dir());
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("defined twice"));
}

TEST_F(HfFolderTest, ConfigErrorsNameFileAndLine) {
  auto f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("config.json"));

  Write("config.json", "{\n  \"hidden_size\": 4,\n  \"layers\": ,\n}");
  f = HfFolder::Open(dir());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr(dir() + "/config.json:3:"));

  Write("config.json", "[1, 2]");
  f = HfFolder::Open(dir());
  EXPECT_THAT(f.status().message(), HasSubstr("not a JSON object"));
}

TEST_F(HfFolderTest, MissingOrBadWeights) {
  Write("config.json", "{}");
  auto f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(f.status().message(), HasSubstr("model.safetensors"));

  Write("pytorch_model.bin", "pickle");
  f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);

  const std::string good = SafetensorsBytes({{"a", {1, 2, 3}}});
  Write("model.safetensors", good.substr(0, good.size() - 1));
  f = HfFolder::Open(dir());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(f.status().message(), HasSubstr(dir() + "/model.safetensors"));
}

TEST_F(HfFolderTest, NotAFolder) {
  EXPECT_EQ(HfFolder::Open(dir() + "/nope").status().code(), StatusCode::kNotFound);
  Write("file", "x");
  EXPECT_EQ(HfFolder::Open(dir() + "/file").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(HfFolderTest, SentenceMaxSeqLengthAbsentOrBad) {
  Write("config.json", "{}");
  Write("model.safetensors", SafetensorsBytes({{"a", {1}}}));
  auto f = HfFolder::Open(dir());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->SentenceMaxSeqLength(), std::nullopt);
  Write("sentence_bert_config.json", R"({"max_seq_length": "long"})");
  EXPECT_EQ((*f)->SentenceMaxSeqLength(), std::nullopt);
  Write("sentence_bert_config.json", "{");
  EXPECT_EQ((*f)->SentenceMaxSeqLength(), std::nullopt);
}

// The real all-MiniLM-L6-v2 folder (real-models.md §2), when present.
TEST(HfFolderRealTest, MiniLm) {
  const char* env = std::getenv("STOKE_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const fs::path root = env && *env ? fs::path(env) : fs::path(home ? home : ".") / ".cache/stoke/models";
  const fs::path dir = root / "all-minilm-l6-v2";
  if (!fs::exists(dir / "model.safetensors"))
    GTEST_SKIP() << dir << " missing: run `stoke model fetch all-minilm-l6-v2`";
  auto f = HfFolder::Open(dir.string());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->config()["num_hidden_layers"], 6);
  EXPECT_EQ((*f)->config()["hidden_size"], 384);
  const TensorRef* emb = (*f)->FindTensor("embeddings.word_embeddings.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{30522, 384}));
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_NE((*f)->FindTensor("encoder.layer.5.output.LayerNorm.weight"), nullptr);
  EXPECT_EQ((*f)->SentenceMaxSeqLength(), 256);
  int64_t params = 0;
  for (const TensorRef& t : (*f)->tensors()) params += t.numel();
  EXPECT_NEAR(static_cast<double>(params), 22.7e6, 0.1e6);
}

}  // namespace
}  // namespace stoke
