// The doctor's JSON schema, its text for a person and the HTML page, on a hand-made report.
#include "tools/doctor/render.h"

#include <gtest/gtest.h>

#include "tools/doctor/rules.h"

namespace stoke::doctor {
namespace {

DoctorReport Sample() {
  DoctorReport r;
  r.url = "http://127.0.0.1:8000";
  r.model = "m<1>";
  r.api = "kserve-http";
  r.load = "auto";
  Signals& s = r.signals;
  s.kind = "classic";
  s.window_s = 3;
  s.requests = 300;
  s.stage_s = {{"queue", 0.002}, {"preprocess", 0.008}, {"compute", 0.001}};
  s.queue_s = 0.002;
  s.host_s = 0.008;
  s.device_s = 0.001;
  s.io_s = s.copy_s = 0;
  s.service_s = 0.009;
  s.latency_s = 0.011;
  s.instance_busy = 0.97;
  s.instances = 1;
  s.load = {{.concurrency = 1, .requests_per_s = 100, .p50_ms = 9, .p99_ms = 12}};
  r.verdicts = Diagnose(s);
  r.notes = {"GPU telemetry unavailable: disabled"};
  r.slowest = nlohmann::json::parse(
      R"({"capacity": 1000, "recorded": 2, "requests": [
            {"id": "r-7", "e2e_ms": 41.5, "stages_ms": {"queue": 30.0, "preprocess": 9.0, "send": 0.1}},
            {"id": 8, "e2e_ms": 12.0, "stages_ms": {"preprocess": 8.0}}]})");
  return r;
}

TEST(DoctorRender, JsonCarriesVerdictsEvidenceAndNullsForUnknownSignals) {
  nlohmann::json j = ReportJson(Sample());
  EXPECT_EQ(j["schema"], "stoke.doctor.v1");
  ASSERT_FALSE(j["verdicts"].empty());
  const auto& v = j["verdicts"][0];
  EXPECT_EQ(v["bottleneck"], "host_bound");
  EXPECT_EQ(v["evidence"][0]["signal"], "ledger.host_share");
  EXPECT_EQ(v["evidence"][0]["threshold"], 0.5);
  EXPECT_TRUE(v["next_step"].get<std::string>().find("--instances 2") != std::string::npos);
  EXPECT_TRUE(j["signals"]["sm_active"].is_null());
  EXPECT_EQ(j["signals"]["load"][0]["concurrency"], 1);
  EXPECT_EQ(j["slowest_requests"]["requests"][0]["id"], "r-7");
  EXPECT_EQ(j["thresholds"]["host_share"], 0.5);
}

TEST(DoctorRender, TextLeadsWithTheVerdictAndListsTheSlowestRequests) {
  const std::string t = ReportText(Sample());
  EXPECT_NE(t.find("VERDICT host_bound"), std::string::npos) << t;
  EXPECT_NE(t.find("next:  --instances 2"), std::string::npos) << t;
  EXPECT_NE(t.find("r-7 41.5 ms: queue 30.0, preprocess 9.0, send 0.1"), std::string::npos) << t;
  EXPECT_NE(t.find("8 12.0 ms: preprocess 8.0"), std::string::npos) << t;
  EXPECT_NE(t.find("note: GPU telemetry unavailable"), std::string::npos);
}

TEST(DoctorRender, HtmlIsSelfContainedAndEscaped) {
  const std::string h = ReportHtml(Sample());
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_EQ(h.find(" src="), std::string::npos);
  EXPECT_NE(h.find("m&lt;1&gt;"), std::string::npos);
  EXPECT_EQ(h.find("m<1>"), std::string::npos);
  EXPECT_NE(h.find("host_bound"), std::string::npos);
  EXPECT_NE(h.find("Slowest requests"), std::string::npos);
}

// An LLM report with the engine's step split, with and without the device's rates.
TEST(DoctorRender, StepSplitInTextJsonAndHtml) {
  DoctorReport r = Sample();
  Signals& s = r.signals;
  s.kind = "llm";
  s.steps = 80;
  s.engine_busy = 0.75;
  s.step_ms = 18.75;
  s.step_model_ms = 17.75;
  s.step_host_ms = 1.0;
  s.step_decode_tokens = 256;
  s.step_prefill_tokens = 100;
  s.step_weight_bytes = 16e9;
  s.step_kv_bytes = 2e9;
  s.step_matmul_flops = 9e12;
  s.step_attention_flops = 0.5e12;
  std::string t = ReportText(r);
  EXPECT_NE(t.find("steps: 80 in the window (engine busy 0.75), per step 18.75 ms = model 17.75 + host 1.00; "
                   "256.0 decode + 100.0 prefill tokens; reads weights 16.000 GB + KV 2.000 GB; matmul 9.000 "
                   "TFLOP + attention 0.500 TFLOP"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.find("floor"), std::string::npos);  // no rates: no times

  s.hbm_gbps = 4000;
  s.tensor_tflops = 600;
  s.step_weights_ms = 4;
  s.step_kv_ms = 0.5;
  s.step_matmul_ms = 15;
  s.step_attention_ms = 0.83;
  s.step_floor_ms = 15.83;
  t = ReportText(r);
  EXPECT_NE(
      t.find("at 4000 GB/s and 600 TFLOP/s: weights 4.00 ms, KV 0.50 ms, matmul 15.0 ms, attention 0.83 "
             "ms; floor 15.83 ms = 89% of the model's 17.75 ms"),
      std::string::npos)
      << t;
  nlohmann::json j = ReportJson(r);
  EXPECT_EQ(j["signals"]["steps"], 80);
  EXPECT_EQ(j["signals"]["step_floor_ms"], 15.83);
  const std::string h = ReportHtml(r);
  EXPECT_NE(h.find("Where an engine step goes"), std::string::npos);
  EXPECT_NE(h.find("<td>floor</td><td class=\"n\">15.830 ms</td>"), std::string::npos) << h;
}

TEST(DoctorRender, GarbageLedgerBodyIsIgnored) {
  DoctorReport r = Sample();
  r.slowest = nlohmann::json::parse(R"({"requests": [1, "x", {"stages_ms": 3}]})");
  EXPECT_NO_THROW(ReportText(r));
  r.slowest = nullptr;
  EXPECT_EQ(ReportText(r).find("slowest requests"), std::string::npos);
}

TEST(DoctorRender, TheTraceShowsAsTheGpuTimelineOrSaysThereIsNone) {
  DoctorReport r = Sample();
  EXPECT_TRUE(ReportJson(r)["signals"]["trace"].is_null());  // no trace taken
  TraceSignals& t = r.signals.trace;
  t.taken = true;
  t.gpu_timeline = true;
  t.seconds = 2;
  t.kernels = 4000;
  t.copies = 40;
  t.requests = 20;
  t.batches = 20;
  t.kernels_per_request = 200;
  t.kernels_per_batch = 200;
  t.mean_kernel_us = 3.5;
  t.busy_share = 0.9;
  t.gaps = 3999;
  t.gap_mean_us = 2.1;
  t.largest_gap_us = 1500;
  const std::string text = ReportText(r);
  EXPECT_NE(text.find("timeline: 2.0 s trace: 4000 kernels"), std::string::npos) << text;
  EXPECT_NE(text.find("mean kernel 3.5 us"), std::string::npos) << text;
  EXPECT_NE(ReportHtml(r).find("<h2>GPU timeline</h2>"), std::string::npos);
  nlohmann::json j = ReportJson(r);
  EXPECT_EQ(j["signals"]["trace"]["kernels"], 4000);
  EXPECT_EQ(j["signals"]["trace"]["gpu_timeline"], true);
  EXPECT_EQ(text.find("kernels: "), std::string::npos) << text;  // no kernel split in the signals: no line

  t.attention_share = 0.5;
  t.matmul_share = 0.35;
  t.other_share = 0.15;
  t.top_kernels = {{"DecodeFragKernel<128, true>", "attention", 0.45, 29213, 1523},
                   {"nvjet_sm90_tst_256x152", "matmul", 0.12, 6864, 704}};
  const std::string with_kernels = ReportText(r);
  EXPECT_NE(with_kernels.find("kernels: attention 50%, matmul 35%, other 15% of GPU kernel time; largest: "
                              "DecodeFragKernel<128, true> 45.0% (attention) 29.21 ms per batch/step, "
                              "nvjet_sm90_tst_256x152 12.0% (matmul) 6.86 ms per batch/step"),
            std::string::npos)
      << with_kernels;
  j = ReportJson(r);
  EXPECT_EQ(j["signals"]["trace"]["top_kernels"][0]["name"], "DecodeFragKernel<128, true>");
  EXPECT_DOUBLE_EQ(j["signals"]["trace"]["attention_share"].get<double>(), 0.5);
  EXPECT_NE(ReportHtml(r).find("attention 50%, matmul 35%"), std::string::npos);

  t = TraceSignals{.taken = true, .note = "no GPU timeline (CPU model or no CUPTI): off: no CUDA"};
  j = ReportJson(r);
  EXPECT_EQ(j["signals"]["trace"]["gpu_timeline"], false);
  EXPECT_TRUE(j["signals"]["trace"]["kernels_per_request"].is_null());
  EXPECT_NE(ReportHtml(r).find("no GPU timeline (CPU model or no CUPTI)"), std::string::npos);
}

}  // namespace
}  // namespace stoke::doctor
