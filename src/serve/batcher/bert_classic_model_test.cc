// all-MiniLM-L6-v2 through the dynamic batcher (skipped when the model is not on disk): batched results equal
// those of each sentence alone, the ids form equals the text form, malformed ids are named.
#include "serve/batcher/bert_classic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <vector>

#include "engine/loader/model_registry.h"
#include "serve/batcher/dynamic_batcher.h"

namespace stoke {
namespace {

class BertClassicModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = DefaultModelDir() + "/all-minilm-l6-v2";
    if (!std::filesystem::exists(dir + "/model.safetensors")) return;
    auto enc = BertEncoder::Load(dir);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    auto tok = LoadTokenizer(dir);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    encoder_ = std::move(enc).value();
    tokenizer_ = std::move(tok).value();
  }
  static void TearDownTestSuite() {
    encoder_.reset();
    tokenizer_.reset();
  }
  void SetUp() override {
    if (!encoder_) GTEST_SKIP() << "all-minilm-l6-v2 not in " << DefaultModelDir() << " (stoke model fetch)";
  }

  static InferTensor Texts(const std::vector<std::string>& texts) {
    InferTensor t;
    t.name = "text";
    t.type = TensorType::kBytes;
    t.shape = {static_cast<int64_t>(texts.size()), 1};
    for (const auto& s : texts) AppendBytesElement(s, &t.data);
    return t;
  }
  static std::vector<float> Floats(const InferTensor& t) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), t.data.size());
    return v;
  }

  static inline std::shared_ptr<const BertEncoder> encoder_;
  static inline std::shared_ptr<const Tokenizer> tokenizer_;
};

TEST_F(BertClassicModelTest, BatchedThroughTheBatcherEqualsAlone) {
  auto model = std::make_shared<BertClassicModel>(encoder_, tokenizer_, BertInputForm::kText, 2);
  BatcherConfig cfg;
  cfg.max_batch_size = 8;
  cfg.instance_count = 2;
  cfg.dynamic_batching = DynamicBatchingOptions{.max_queue_delay_us = 20'000};
  auto b = DynamicBatcher::Create({.model_name = "minilm", .config = cfg}, model);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const std::vector<std::string> sentences = {"A man is eating food.",
                                              "The weather is lovely today.",
                                              "Ein Satz auf Deutsch, mit Umlauten: äöü.",
                                              "",
                                              "Short",
                                              "stoke batches requests together"};
  // Alone: the encoder directly, one sentence per call.
  std::vector<std::vector<float>> alone;
  for (const auto& s : sentences) {
    int64_t tokens, total;
    auto rows = model->TokenizeTexts({s}, &tokens, &total);
    ASSERT_TRUE(rows.ok());
    std::vector<float> e;
    ASSERT_TRUE(encoder_->Embed((*rows)->rows, &e).ok());
    alone.push_back(e);
  }
  // Together: one request per sentence, submitted at once, so the 20 ms delay batches them.
  std::vector<std::promise<InferResult>> done(sentences.size());
  for (size_t i = 0; i < sentences.size(); ++i) {
    std::vector<InferTensor> in = {Texts({sentences[i]})};
    auto rows = ValidateInputs(model->signature(), 8, in);
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    int64_t tokens = 0;
    auto prepared = model->Prepare(std::move(in), *rows, &tokens);
    ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
    auto req = std::make_unique<ClassicRequest>();
    req->input = std::move(prepared).value();
    req->tokens = tokens;
    req->done = [&done, i](InferResult r) { done[i].set_value(std::move(r)); };
    ASSERT_TRUE((*b)->Submit(std::move(req)).ok());
  }
  int64_t max_rows = 0;
  for (size_t i = 0; i < sentences.size(); ++i) {
    InferResult r = done[i].get_future().get();
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].shape, (std::vector<int64_t>{1, 384}));
    const std::vector<float> got = Floats(r.outputs[0]);
    ASSERT_EQ(got.size(), alone[i].size());
    // The encoder never pads, but its fp32 GEMMs may pick another kernel for another row count, so allow
    // rounding-level differences (values are L2-normalised, |x| < 1).
    float max_diff = 0;
    for (size_t j = 0; j < got.size(); ++j) max_diff = std::max(max_diff, std::fabs(got[j] - alone[i][j]));
    EXPECT_LE(max_diff, 2e-6f) << "sentence " << i;
    max_rows = std::max(max_rows, r.times.batch_rows);
  }
  EXPECT_GT(max_rows, 1);  // at least one real batch formed
}

TEST_F(BertClassicModelTest, IdsFormEqualsTextForm) {
  BertClassicModel text(encoder_, tokenizer_, BertInputForm::kText, 1);
  BertClassicModel ids(encoder_, tokenizer_, BertInputForm::kTokenIds, 1);
  int64_t tokens, total;
  auto rows = text.TokenizeTexts({"hello world", "a somewhat longer sentence here"}, &tokens, &total);
  ASSERT_TRUE(rows.ok());
  // Right-pad to the longest row with mask 0.
  const auto& r = (*rows)->rows;
  const int64_t seq = static_cast<int64_t>(std::max(r[0].size(), r[1].size()));
  InferTensor in_ids{"input_ids", TensorType::kInt64, {2, seq}, {}};
  InferTensor mask{"attention_mask", TensorType::kInt64, {2, seq}, {}};
  for (const auto& row : r) {
    for (int64_t j = 0; j < seq; ++j) {
      const int64_t id = j < static_cast<int64_t>(row.size()) ? row[j] : 0;
      const int64_t m = j < static_cast<int64_t>(row.size()) ? 1 : 0;
      in_ids.data.append(reinterpret_cast<const char*>(&id), 8);
      mask.data.append(reinterpret_cast<const char*>(&m), 8);
    }
  }
  std::vector<InferTensor> inputs = {in_ids, mask};
  ASSERT_TRUE(ValidateInputs(ids.signature(), 8, inputs).ok());
  int64_t t2 = 0;
  auto prepared = ids.Prepare(inputs, 2, &t2);
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_EQ(static_cast<const TokenRows*>(prepared->get())->rows, r);
  EXPECT_EQ(t2, tokens);

  // Malformed: a mask value of 2, an id past the vocabulary, a row with no tokens.
  auto set = [](InferTensor* t, int64_t i, int64_t v) { std::memcpy(t->data.data() + i * 8, &v, 8); };
  InferTensor bad_mask = mask;
  set(&bad_mask, 0, 2);
  auto e1 = ids.Prepare({in_ids, bad_mask}, 2, &t2);
  ASSERT_FALSE(e1.ok());
  EXPECT_NE(e1.status().message().find("input 'attention_mask': element [0, 0] is 2"), std::string::npos);
  InferTensor bad_ids = in_ids;
  set(&bad_ids, 1, 999999);
  auto e2 = ids.Prepare({bad_ids, mask}, 2, &t2);
  ASSERT_FALSE(e2.ok());
  EXPECT_NE(e2.status().message().find("input 'input_ids': element [0, 1] = 999999"), std::string::npos);
  InferTensor empty_mask = mask;
  for (int64_t j = 0; j < seq; ++j) set(&empty_mask, j, 0);
  auto e3 = ids.Prepare({in_ids, empty_mask}, 2, &t2);
  ASSERT_FALSE(e3.ok());
  EXPECT_NE(e3.status().message().find("row 0 has no real tokens"), std::string::npos);
}

}  // namespace
}  // namespace stoke
