// --quantization int8 on the real all-MiniLM-L6-v2 (skipped when it is not fetched): refused without
// calibration data (with the message saying why), calibrated on one text (GPL-2, Debian's base-files) and
// gated on another (GPL-3's first 64 sentences): with per-token activation scales (the default) the gate
// passes it; with static scales it stays close to fp32 but the gate rejects it, narrowly, on its mean cosine
// (docs/precision.md); a deliberately broken quantiser (every activation scale x0.1: inputs saturate) is far
// from it in both forms, and `stoke serve`'s load-time check refuses a failing int8 unless allowed. The
// figures docs/precision.md quotes are printed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>

#include "engine/loader/model_registry.h"
#include "tools/precision/calibration.h"
#include "tools/precision/encoder_gate.h"
#include "tools/precision/minilm_gate_fixture.h"
#include "tools/precision/text_chunker.h"

namespace stoke::precision {
namespace {

constexpr const char* kCalibrationText = "/usr/share/common-licenses/GPL-2";

class MiniLmInt8Gate : public MiniLmGateFixture {
 protected:
  void SetUp() override {
    struct stat st {};
    if (::stat(kCalibrationText, &st) != 0) GTEST_SKIP() << kCalibrationText << " is absent";
    MiniLmGateFixture::SetUp();
  }

  // The int8 encoder calibrated on GPL-2 at `percentile` (static scales only), activation scales x
  // multiplier.
  StatusOr<EncoderAtPrecision> Int8(double percentile, float multiplier = 1.0f,
                                    Int8Activations activations = Int8Activations::kStatic) {
    BertDeviceOptions o{.device = "cpu", .quantization = WeightQuantization::kInt8};
    o.int8_activation_scale_multiplier = multiplier;
    ASSIGN_OR_RETURN(std::unique_ptr<BertEncoder> enc, BertEncoder::Load(path_));
    RETURN_IF_ERROR(CalibrateForInt8(
        *enc, *tok_, {.data = kCalibrationText, .percentile = percentile, .activations = activations}, &o));
    return EncoderAtPrecisionFrom(std::move(enc), o, CpuBackends());
  }

  GateReport Check(double percentile, float multiplier = 1.0f,
                   Int8Activations activations = Int8Activations::kStatic) {
    auto cand = Int8(percentile, multiplier, activations);
    EXPECT_TRUE(cand.ok()) << cand.status().ToString();
    EXPECT_EQ(cand->encoder->quantization(), WeightQuantization::kInt8);
    EXPECT_EQ(cand->label, "cpu, weights int8");
    auto r = CheckEncoderPrecision(reference_, *cand, *tok_, text_, {});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::printf("int8, %s activations, percentile %g, activation scales x%.2f: %s",
                std::string(Int8ActivationsName(activations)).c_str(), percentile, multiplier,
                ReportToText(*r).c_str());
    return *r;
  }

};

TEST_F(MiniLmInt8Gate, RefusedWithoutCalibrationData) {
  BertDeviceOptions o{.device = "cpu", .quantization = WeightQuantization::kInt8};
  auto enc = BertEncoder::Load(path_);
  ASSERT_TRUE(enc.ok());
  Status st = CalibrateForInt8(**enc, *tok_, {}, &o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--calibration-data FILE"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("smoothed per channel"), std::string::npos) << st.message();
  // Per-token activations need the smoothing factors: refused the same way.
  EXPECT_EQ(CalibrateForInt8(**enc, *tok_, {.activations = Int8Activations::kPerToken}, &o).code(),
            StatusCode::kInvalidArgument);
  // Nor does the loader quantise without the ranges.
  auto at = EncoderAtPrecisionFrom(std::move(enc).value(), o, CpuBackends());
  EXPECT_EQ(at.status().code(), StatusCode::kInvalidArgument);
  // A file with no sample in it.
  const std::string empty = ::testing::TempDir() + "/empty_calibration.txt";
  std::FILE* f = std::fopen(empty.c_str(), "w");
  std::fputs("\n  \n\r\n", f);
  std::fclose(f);
  auto enc2 = BertEncoder::Load(path_);
  st = CalibrateForInt8(**enc2, *tok_, {.data = empty}, &o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no samples"), std::string::npos) << st.message();
  st = CalibrateForInt8(**enc2, *tok_, {.data = empty + ".absent"}, &o);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
}

// docs/precision.md's table (the defaults: percentile 99.999, smoothing 0.8): mean cosine 0.99731, min
// 0.99458 on the development machine: min_cosine passes, the mean misses 0.999, so the gate rejects it. What
// is asserted: the int8 GEMMs moved the embeddings a little (far less than the broken calibration below).
TEST_F(MiniLmInt8Gate, CalibratedInt8StaysCloseToFp32) {
  const GateReport r = Check(BertCalibrationOptions{}.percentile);
  EXPECT_EQ(r.reference, "cpu fp32");
  EXPECT_EQ(r.positions, 64);
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_LT(r.metrics[0].value, 1.0);  // the int8 GEMMs did run
  EXPECT_GT(r.metrics[0].value, 0.996);
  EXPECT_TRUE(r.metrics[1].pass) << r.metrics[1].value;  // min_cosine >= 0.99
}

TEST_F(MiniLmInt8Gate, SaturatingCalibrationIsRejected) {
  const GateReport r = Check(BertCalibrationOptions{}.percentile, 0.1f);
  EXPECT_FALSE(r.pass());
}

// The default, --int8-activations per-token: docs/precision.md's figures (mean 0.99928, min 0.99877 on the
// development machine): the gate passes.
TEST_F(MiniLmInt8Gate, PerTokenActivationsPassTheGate) {
  ASSERT_EQ(BertCalibrationOptions{}.activations, Int8Activations::kPerToken);
  const GateReport r = Check(BertCalibrationOptions{}.percentile, 1.0f, Int8Activations::kPerToken);
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_LT(r.metrics[0].value, 1.0);  // the int8 GEMMs did run
  EXPECT_TRUE(r.pass()) << r.metrics[0].value << " " << r.metrics[1].value;
}

// A broken per-token quantiser (each row's scale x0.1: all but a tenth of its range saturates) fails.
TEST_F(MiniLmInt8Gate, BrokenPerTokenQuantiserIsRejected) {
  const GateReport r = Check(BertCalibrationOptions{}.percentile, 0.1f, Int8Activations::kPerToken);
  EXPECT_FALSE(r.pass());
  EXPECT_LT(r.metrics[0].value, 0.99);
}

TEST_F(MiniLmInt8Gate, ServeGateRefusesABrokenCalibrationUnlessAllowed) {
  auto broken = Int8(BertCalibrationOptions{}.percentile, 0.1f);
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  auto refused = RunEncoderServeGate(path_, *broken, *tok_, /*allow_inconsistent=*/false);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--allow-inconsistent"), std::string::npos);
  auto allowed = RunEncoderServeGate(path_, *broken, *tok_, /*allow_inconsistent=*/true);
  ASSERT_TRUE(allowed.ok()) << allowed.status().ToString();
  ASSERT_TRUE(allowed->has_value());
  EXPECT_FALSE((*allowed)->pass());
  // The real calibration: the serve gate's verdict is model check's (refused when it fails, as above).
  auto good = Int8(BertCalibrationOptions{}.percentile);
  ASSERT_TRUE(good.ok());
  const bool pass = Check(BertCalibrationOptions{}.percentile).pass();
  auto served = RunEncoderServeGate(path_, *good, *tok_, false);
  if (pass) {
    ASSERT_TRUE(served.ok()) << served.status().ToString();
    EXPECT_TRUE((*served)->pass());
  } else {
    EXPECT_EQ(served.status().code(), StatusCode::kFailedPrecondition) << served.status().ToString();
  }
}

}  // namespace
}  // namespace stoke::precision
