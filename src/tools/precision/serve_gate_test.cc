// The gate `stoke serve` runs at load: nothing to run for the reference precision; a failing precision (the
// test-only broken quantiser) refused, or served with --allow-inconsistent; the /v1/models fields and the
// /metrics gauges it publishes.
#include "tools/precision/serve_gate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "engine/loader/model_registry.h"
#include "engine/model/backends.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {
namespace {

GateReport HandMadeReport(bool pass) {
  GateReport r;
  r.kind = "decoder";
  r.reference = "cpu, kv fp32";
  r.candidate = "cpu, kv int8";
  r.positions = 256;
  r.metrics.push_back({"top1_agreement", pass ? 0.98 : 0.5, 0.9, true, pass, ""});
  r.metrics.push_back({"mean_kl", 0.01, 0.05, false, true, ""});
  return r;
}

TEST(ServeGateTest, ModelFields) {
  const auto with = nlohmann::json::parse(PrecisionModelFields({"int8", "fp8"}, HandMadeReport(true)));
  EXPECT_EQ(with["precision"]["kv_cache_dtype"], "int8");
  EXPECT_EQ(with["precision"]["quantization"], "fp8");
  EXPECT_EQ(with["precision"]["consistency_gate"]["pass"], true);
  EXPECT_EQ(with["precision"]["consistency_gate"]["metrics"][0]["name"], "top1_agreement");
  const auto without = nlohmann::json::parse(PrecisionModelFields({"bf16"}, std::nullopt));
  EXPECT_EQ(without["precision"]["quantization"], "none");
  EXPECT_TRUE(without["precision"]["consistency_gate"].is_null());
}

TEST(ServeGateTest, Gauges) {
  MetricsRegistry registry;
  ASSERT_TRUE(PublishGateMetrics(HandMadeReport(false), "smol", {"int8", "none"}, registry).ok());
  ASSERT_TRUE(PublishGateMetrics(HandMadeReport(true), "smol8", {"fp32", "fp8"}, registry).ok());
  const std::string text = registry.ExposeText();
  EXPECT_NE(text.find("stoke:precision_gate_pass{kv_cache_dtype=\"int8\",model_name=\"smol\","
                      "quantization=\"none\"} 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stoke:precision_gate_pass{kv_cache_dtype=\"fp32\",model_name=\"smol8\","
                      "quantization=\"fp8\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("metric=\"top1_agreement\",model_name=\"smol\",quantization=\"none\"} 0.5"),
            std::string::npos)
      << text;
}

class SmolLm2ServeGate : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = DefaultModelDir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) GTEST_SKIP() << path_ << " is absent (stoke model fetch)";
    if (!ReadGateText("").ok()) GTEST_SKIP() << "no default gate text";
    auto tok = LoadTokenizer(path_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value();
  }
  std::string path_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SmolLm2ServeGate, ReferencePrecisionRunsNothing) {
  DecoderOptions o;
  o.device = "cpu";
  auto r = RunServeGate(path_, o, *tok_, false, CpuBackends());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_value());
}

TEST_F(SmolLm2ServeGate, FailingPrecisionIsRefusedUnlessAllowed) {
  DecoderOptions o;
  o.device = "cpu";
  o.kv_cache = {.dtype = KvCacheDtype::kInt8, .testing_dequant_scale_multiplier = 1.5f};
  auto refused = RunServeGate(path_, o, *tok_, /*allow_inconsistent=*/false, CpuBackends());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--allow-inconsistent"), std::string::npos);
  EXPECT_NE(refused.status().message().find("FAIL  top1_agreement"), std::string::npos)
      << refused.status().message();
  auto allowed = RunServeGate(path_, o, *tok_, /*allow_inconsistent=*/true, CpuBackends());
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  ASSERT_TRUE(allowed->has_value());
  EXPECT_FALSE((*allowed)->pass());
}

}  // namespace
}  // namespace stoke::precision
