// The encoder gate at a lower weight precision (encoder_gate.h) on the real all-MiniLM-L6-v2 (skipped when it
// is not fetched): fp8 weights on the CPU stay close to fp32 (the figures docs/precision.md quotes are
// printed; the gate rejects them narrowly), the
// test-only broken quantiser (every scale 1.5x) fails, and `stoke serve`'s load-time check refuses it unless
// --allow-inconsistent; the checkpoint's own weights run no gate. Also the /v1/models fields and gauges of an
// encoder (no KV cache).
#include "tools/precision/encoder_gate.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/loader/model_registry.h"
#include "tools/precision/minilm_gate_fixture.h"
#include "tools/precision/serve_gate.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {
namespace {

class MiniLmEncoderGate : public MiniLmGateFixture {
 protected:
  GateReport Check(float multiplier) {
    BertDeviceOptions o{
        .device = "cpu", .quantization = WeightQuantization::kFp8, .fp8_scale_multiplier = multiplier};
    auto cand = LoadEncoderAtPrecision(path_, o, CpuBackends());
    EXPECT_TRUE(cand.ok()) << cand.status().ToString();
    EXPECT_EQ(cand->encoder->quantization(), WeightQuantization::kFp8);
    EXPECT_EQ(cand->device, nullptr);
    EXPECT_EQ(cand->label, "cpu, weights fp8");
    auto r = CheckEncoderPrecision(reference_, *cand, *tok_, text_, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::printf("fp8 weights x%.2f: %s", multiplier, ReportToText(*r).c_str());
    return *r;
  }

};

// Measured on the development machine (docs/precision.md): mean_cosine 0.99848, min_cosine 0.99731 over 64
// sentences of GPL-3, so the gate rejects fp8 weights on this 384-wide model, narrowly (mean < 0.999). The
// verdict is the report's; what is asserted is that the weights moved a little, far less than the broken
// quantiser below moves them.
TEST_F(MiniLmEncoderGate, Fp8WeightsOnTheCpuStayCloseToFp32) {
  const GateReport r = Check(1.0f);
  EXPECT_EQ(r.kind, "encoder");
  EXPECT_EQ(r.reference, "cpu fp32");
  EXPECT_EQ(r.candidate, "cpu, weights fp8");
  EXPECT_EQ(r.positions, 64);
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_EQ(r.metrics[0].name, "mean_cosine");
  EXPECT_LT(r.metrics[0].value, 1.0);  // the weights did move
  EXPECT_GT(r.metrics[0].value, 0.995);
  EXPECT_TRUE(r.metrics[1].pass) << r.metrics[1].value;  // min_cosine >= 0.99
}

TEST_F(MiniLmEncoderGate, BrokenWeightQuantiserIsRejected) {
  const GateReport r = Check(1.5f);
  EXPECT_FALSE(r.pass());
}

TEST_F(MiniLmEncoderGate, ServeGateRefusesAFailingPrecisionUnlessAllowed) {
  BertDeviceOptions o{
      .device = "cpu", .quantization = WeightQuantization::kFp8, .fp8_scale_multiplier = 1.5f};
  auto broken = LoadEncoderAtPrecision(path_, o, CpuBackends());
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  auto refused = RunEncoderServeGate(path_, *broken, *tok_, /*allow_inconsistent=*/false);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--allow-inconsistent"), std::string::npos);
  EXPECT_NE(refused.status().message().find("FAIL  "), std::string::npos) << refused.status().message();
  auto allowed = RunEncoderServeGate(path_, *broken, *tok_, /*allow_inconsistent=*/true);
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  ASSERT_TRUE(allowed->has_value());
  EXPECT_FALSE((*allowed)->pass());

  // The real quantiser: the serve gate's verdict is model check's (refused when it fails, as above).
  o.fp8_scale_multiplier = 1.0f;
  auto good = LoadEncoderAtPrecision(path_, o, CpuBackends());
  ASSERT_TRUE(good.ok());
  const bool pass = Check(1.0f).pass();
  auto served = RunEncoderServeGate(path_, *good, *tok_, false);
  if (pass) {
    ASSERT_TRUE(served.ok()) << served.status().ToString();
    ASSERT_TRUE(served->has_value());
    EXPECT_TRUE((*served)->pass());
  } else {
    EXPECT_EQ(served.status().code(), StatusCode::kFailedPrecondition) << served.status().ToString();
  }
}

TEST_F(MiniLmEncoderGate, CheckpointWeightsRunNoServeGate) {
  auto fp32 = LoadEncoderAtPrecision(path_, {.device = "cpu"}, CpuBackends());
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->label, "cpu fp32");
  EXPECT_EQ(fp32->encoder->quantization(), WeightQuantization::kNone);
  auto r = RunEncoderServeGate(path_, *fp32, *tok_, false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

GateReport EncoderReport(bool pass) {
  GateReport r;
  r.kind = "encoder";
  r.reference = "cpu fp32";
  r.candidate = "cpu, weights fp8";
  r.positions = 64;
  r.metrics.push_back({"mean_cosine", pass ? 0.9999 : 0.9, 0.999, true, pass, ""});
  r.metrics.push_back({"min_cosine", pass ? 0.999 : 0.8, 0.99, true, pass, ""});
  return r;
}

TEST(EncoderServeGateTest, ModelFieldsAndGaugesOfAnEncoder) {
  // An encoder has no KV cache: no kv_cache_dtype in its /v1/models entry, "none" in the gauges' label.
  const auto f = nlohmann::json::parse(PrecisionModelFields({"", "fp8"}, EncoderReport(true)));
  EXPECT_FALSE(f["precision"].contains("kv_cache_dtype"));
  EXPECT_EQ(f["precision"]["quantization"], "fp8");
  EXPECT_EQ(f["precision"]["consistency_gate"]["kind"], "encoder");
  MetricsRegistry registry;
  ASSERT_TRUE(PublishGateMetrics(EncoderReport(false), "minilm", {"", "fp8"}, registry).ok());
  const std::string text = registry.ExposeText();
  EXPECT_NE(text.find("stoke:precision_gate_pass{kv_cache_dtype=\"none\",model_name=\"minilm\","
                      "quantization=\"fp8\"} 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("metric=\"min_cosine\",model_name=\"minilm\",quantization=\"fp8\"} 0.8"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace stoke::precision
