// The real SmolLM2-135M-Instruct Q4_1 GGUF (shared/reference/real-models.md §1). Skips when the file is
// absent; CI fetches it first (stoke model fetch smollm2-135m-instruct).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <map>

#include "engine/loader/gguf_reader.h"
#include "engine/loader/model_registry.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SmolLm2Gguf : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = DefaultModelDir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      GTEST_SKIP() << path_
                   << " is absent: run `stoke model fetch smollm2-135m-instruct` (or set STOKE_MODEL_DIR)";
    }
    file_size_ = static_cast<size_t>(st.st_size);
    auto f = GgufFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::move(f).value();
  }
  std::string path_;
  size_t file_size_ = 0;
  std::unique_ptr<GgufFile> file_;
};

TEST_F(SmolLm2Gguf, Metadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.Keys().size(), 33u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("general.file_type"), 3);  // MOSTLY_Q4_1
  EXPECT_EQ(*f.GetInt("general.quantization_version"), 2);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*f.GetInt("llama.context_length"), 8192);
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 576);
  EXPECT_EQ(*f.GetInt("llama.feed_forward_length"), 1536);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count"), 9);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(*f.GetInt("llama.rope.dimension_count"), 64);
  EXPECT_EQ(*f.GetInt("llama.vocab_size"), 49152);
  EXPECT_EQ(*f.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_FALSE(*f.GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.padding_token_id"), 2);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_THAT(*f.GetString("tokenizer.chat_template"), HasSubstr("<|im_start|>"));

  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[0], "<|endoftext|>");
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  EXPECT_EQ((*tokens)[16], "<empty_output>");
  auto types = f.GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  ASSERT_EQ(types->size(), 49152u);
  for (int i = 0; i <= 16; ++i) EXPECT_EQ((*types)[i], 3) << i;  // control (special)
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(merges->size(), 48900u);
  EXPECT_EQ((*merges)[0], "Ġ t");
  EXPECT_EQ(f.ValueSummary("tokenizer.ggml.tokens"), "[string x 49152]");
}

TEST_F(SmolLm2Gguf, Tensors) {
  const GgufFile& f = *file_;
  ASSERT_EQ(f.tensors().size(), 272u);  // token_embd + output_norm + 30 x 9; output.weight is tied (absent)
  const TensorRef* embd = f.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dtype, DType::kQ8_0);
  EXPECT_THAT(embd->shape, ElementsAre(49152, 576));
  EXPECT_EQ(embd->nbytes, 49152u * 18 * 34);
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);
  const TensorRef* norm = f.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_THAT(norm->shape, ElementsAre(576));

  const std::map<std::string, std::vector<int64_t>> kLayer = {
      {"attn_norm", {576}},      {"ffn_norm", {576}},     {"attn_q", {576, 576}},
      {"attn_k", {192, 576}},    {"attn_v", {192, 576}},  {"attn_output", {576, 576}},
      {"ffn_gate", {1536, 576}}, {"ffn_up", {1536, 576}}, {"ffn_down", {576, 1536}},
  };
  for (int layer = 0; layer < 30; ++layer) {
    for (const auto& [part, shape] : kLayer) {
      const std::string name = "blk." + std::to_string(layer) + "." + part + ".weight";
      const TensorRef* t = f.FindTensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->shape, shape) << name;
      EXPECT_EQ(t->dtype, shape.size() == 1 ? DType::kF32 : DType::kQ4_1) << name;
    }
  }
  std::map<DType, int> by_type;
  size_t total = 0;
  const uint8_t* end = nullptr;
  for (const TensorRef& t : f.tensors()) {
    ++by_type[t.dtype];
    total += t.nbytes;
    if (t.data + t.nbytes > end) end = t.data + t.nbytes;
  }
  EXPECT_EQ(by_type[DType::kQ4_1], 210);
  EXPECT_EQ(by_type[DType::kF32], 61);
  EXPECT_EQ(by_type[DType::kQ8_0], 1);
  // Tensors fill the data section up to the alignment padding.
  EXPECT_LE(f.data_offset() + total, file_size_);
  EXPECT_GT(f.data_offset() + total + 272 * 32, file_size_);
}

TEST_F(SmolLm2Gguf, DequantisedWeightsLookLikeWeights) {
  const GgufFile& f = *file_;
  for (const char* name :
       {"token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.0.attn_norm.weight"}) {
    const TensorRef* t = f.FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    const int64_t cols = t->cols();
    std::vector<float> row(cols);
    const size_t row_bytes = *RowBytes(t->dtype, cols);
    double sum_sq = 0;
    int zeros = 0;
    for (int64_t r : {int64_t{0}, t->rows() - 1}) {
      ASSERT_TRUE(cpu::DequantizeRow(t->dtype, t->data + r * row_bytes, row.data(), cols).ok());
      for (float v : row) {
        ASSERT_TRUE(std::isfinite(v)) << name;
        ASSERT_LT(std::fabs(v), 100.0f) << name;
        sum_sq += v * v;
        zeros += v == 0.0f;
      }
    }
    EXPECT_GT(sum_sq, 0.0) << name;
    EXPECT_LT(zeros, cols) << name;
  }
}

}  // namespace
}  // namespace stoke
