// The gate end to end: a model against itself passes with perfect metrics; the real SmolLM2 (skipped when
// absent) passes with an int8 and an fp8 KV cache and FAILS with a deliberately broken quantiser (every
// dequantisation scale wrong), which only a C++ option reaches (KvCacheOptions::testing_dequant_scale_...);
// fp8 weights (--quantization fp8) are compared like the KV precisions, and a broken weight quantiser
// (Fp8WeightOptions::testing_scale_multiplier) fails.
#include "tools/precision/gate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>

#include "engine/loader/gguf_reader.h"
#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"
#include "engine/model/weight_quant.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {
namespace {

// Bytes as ids modulo the tiny model's vocabulary.
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int vocab) : vocab_(vocab) {}
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions&) const override {
    std::vector<int32_t> ids;
    for (unsigned char ch : text) ids.push_back(ch % vocab_);
    return ids;
  }
  std::string Decode(std::span<const int32_t>, bool) const override { return {}; }
  int vocab_size() const override { return vocab_; }

 private:
  int vocab_;
};

constexpr const char* kText =
    "The licenses for most software and other practical works are designed to take away your freedom to "
    "share and change the works. By contrast, the General Public License is intended to guarantee your "
    "freedom to share and change all versions of a program. When we speak of free software, we are referring "
    "to freedom, not price.";

TEST(DecoderGateTest, ModelAgainstItselfIsPerfect) {
  testing::TinyLlama m(31);
  auto a = CpuLlama::Create(m.ToWeights(true));
  auto b = CpuLlama::Create(m.ToWeights(true));
  ASSERT_TRUE(a.ok() && b.ok());
  ByteTokenizer tok(m.c.vocab_size);
  auto r =
      RunDecoderGate(**a, **b, tok, kText, {.tokens = 200, .window = 64, .chunk = 24, .greedy_tokens = 8});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass()) << ReportToText(*r);
  EXPECT_EQ(r->positions, 200);
  ASSERT_EQ(r->metrics.size(), 4u);
  EXPECT_EQ(r->metrics[0].value, 1.0);  // top-1
  EXPECT_EQ(r->metrics[1].value, 0.0);  // KL
  EXPECT_EQ(r->metrics[2].value, 1.0);  // perplexity ratio
  EXPECT_EQ(r->metrics[3].value, 1.0);  // greedy
  const auto j = ReportToJson(*r);
  EXPECT_EQ(j["pass"], true);
  EXPECT_EQ(j["metrics"][1]["comparison"], "<=");
}

TEST(DecoderGateTest, TightThresholdsFailAndTextSaysWhich) {
  testing::TinyLlama m(32);
  auto a = CpuLlama::Create(m.ToWeights(true));
  auto b = CpuLlama::Create(m.ToWeights(true), nullptr, false, {.dtype = KvCacheDtype::kInt8});
  ASSERT_TRUE(a.ok() && b.ok());
  ByteTokenizer tok(m.c.vocab_size);
  DecoderGateOptions o{.tokens = 120, .chunk = 50, .greedy_tokens = 0};
  o.thresholds.max_mean_kl = 0.0;  // int8 KV differs from fp32 at least a little
  auto r = RunDecoderGate(**a, **b, tok, kText, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass());
  EXPECT_EQ(r->metrics.size(), 3u);  // no greedy metric with 0 greedy tokens
  const std::string text = ReportToText(*r);
  EXPECT_NE(text.find("FAIL  mean_kl"), std::string::npos) << text;
  EXPECT_NE(text.find("kv int8"), std::string::npos) << text;
}

TEST(DecoderGateTest, Fp8WeightsAreAnotherPrecisionTheLabelNames) {
  testing::TinyLlama m(34);
  LlamaWeights q = m.ToWeights(true);
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&q).ok());
  auto a = CpuLlama::Create(m.ToWeights(true));
  auto b = CpuLlama::Create(std::move(q));
  ASSERT_TRUE(a.ok() && b.ok());
  ByteTokenizer tok(m.c.vocab_size);
  auto r = RunDecoderGate(**a, **b, tok, kText, {.tokens = 120, .chunk = 50, .greedy_tokens = 0});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->candidate, "cpu, weights fp8, kv fp32");
  EXPECT_EQ(r->reference, "cpu, kv fp32");
  EXPECT_GT(r->metrics[1].value, 0.0);  // mean KL: the logits moved
  for (const MetricResult& mr : r->metrics) EXPECT_TRUE(std::isfinite(mr.value)) << mr.name;
}

TEST(DecoderGateTest, ReferenceDropsTheWeightQuantisation) {
  DecoderOptions cand;
  cand.device = "cpu";
  EXPECT_FALSE(DiffersFromReference(cand, "cpu"));
  cand.quantization = WeightQuantization::kFp8;
  EXPECT_TRUE(DiffersFromReference(cand, "cpu"));
  EXPECT_TRUE(DiffersFromReference(cand, "cuda"));
  cand.kv_cache.dtype = KvCacheDtype::kInt8;
  const DecoderOptions ref = ReferenceOptions(cand);
  EXPECT_EQ(ref.quantization, WeightQuantization::kNone);
  EXPECT_EQ(ref.kv_cache.dtype, KvCacheDtype::kAuto);
  EXPECT_FALSE(DiffersFromReference(ref, "cpu"));
}

TEST(DecoderGateTest, BadOptionsAreInvalidArgument) {
  testing::TinyLlama m(33);
  auto a = CpuLlama::Create(m.ToWeights(true));
  ByteTokenizer tok(m.c.vocab_size);
  EXPECT_EQ(RunDecoderGate(**a, **a, tok, kText, {.tokens = 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RunDecoderGate(**a, **a, tok, "", {}).status().code(), StatusCode::kInvalidArgument);
}

// The real model through the gate as `stoke model check` runs it on the CPU.
class SmolLm2Gate : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = DefaultModelDir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) GTEST_SKIP() << path_ << " is absent (stoke model fetch)";
    auto tok = LoadTokenizer(path_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value();
    auto text = ReadGateText("");
    if (!text.ok()) GTEST_SKIP() << text.status().ToString();
    text_ = *text;
  }
  StatusOr<GateReport> Check(KvCacheOptions kv, WeightQuantization q = WeightQuantization::kNone) {
    DecoderOptions cand;
    cand.device = "cpu";
    cand.kv_cache = kv;
    cand.quantization = q;
    const std::string path = path_;
    auto load = [path](const DecoderOptions& o) { return LoadDecoder(path, o, CpuBackends()); };
    return CheckDecoderPrecision(load, ReferenceOptions(cand), cand, *tok_, text_,
                                 {.tokens = 256, .greedy_prompts = 2, .greedy_tokens = 16});
  }
  std::string path_, text_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolLm2Gate, Int8KvPasses) {
  auto r = Check({.dtype = KvCacheDtype::kInt8});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass()) << ReportToText(*r);
  EXPECT_EQ(r->positions, 256);
  std::printf("%s", ReportToText(*r).c_str());
}

TEST_F(SmolLm2Gate, Fp8KvPasses) {
  auto r = Check({.dtype = KvCacheDtype::kFp8});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->pass()) << ReportToText(*r);
  std::printf("%s", ReportToText(*r).c_str());
}

// The gate can fail: int8 KV whose dequantisation scales are 1.5x too large.
TEST_F(SmolLm2Gate, BrokenQuantiserIsRejected) {
  auto r = Check({.dtype = KvCacheDtype::kInt8, .testing_dequant_scale_multiplier = 1.5f});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass()) << ReportToText(*r);
  std::printf("%s", ReportToText(*r).c_str());
}

// fp8 weights on the real model: a report with finite metrics and logits that moved. Whether this 135M Q4_1
// model passes is measured, not asserted here (docs/precision.md has the numbers).
TEST_F(SmolLm2Gate, Fp8WeightsAreCompared) {
  auto r = Check({}, WeightQuantization::kFp8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->candidate.find("weights fp8"), std::string::npos) << r->candidate;
  for (const MetricResult& m : r->metrics) EXPECT_TRUE(std::isfinite(m.value)) << m.name;
  EXPECT_GT(r->metrics[1].value, 0.0);  // mean KL
  std::printf("%s", ReportToText(*r).c_str());
}

// The gate can fail on weights too: fp8 weights whose scales are 1.5x too large.
TEST_F(SmolLm2Gate, BrokenWeightQuantiserIsRejected) {
  auto ref = LoadDecoder(path_, DecoderOptions{}, CpuBackends());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto gguf = GgufFile::Open(path_);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  auto weights = LoadLlamaWeights(std::shared_ptr<const GgufFile>(std::move(*gguf)));
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  ASSERT_TRUE(QuantizeLlamaWeightsFp8(&*weights, {.testing_scale_multiplier = 1.5f}).ok());
  auto cand = CpuLlama::Create(std::move(*weights), nullptr, /*ggml_numerics=*/true);
  ASSERT_TRUE(cand.ok()) << cand.status().ToString();
  auto r =
      RunDecoderGate(**ref, **cand, *tok_, text_, {.tokens = 256, .greedy_prompts = 2, .greedy_tokens = 16});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->pass()) << ReportToText(*r);
  std::printf("%s", ReportToText(*r).c_str());
}

}  // namespace
}  // namespace stoke::precision
