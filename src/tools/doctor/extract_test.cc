// ExtractSignals on /metrics text and /v1/gpu JSON fixtures shaped like stoke serve's.
#include "tools/doctor/extract.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tools/doctor/rules.h"

namespace stoke::doctor {
namespace {

std::vector<bench::PromSample> Parse(const std::string& text) {
  std::map<std::string, std::string> types;
  auto r = bench::ParsePrometheusText(text, &types);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::vector<bench::PromSample>{};
}

// A classic model: `n` requests so far, each with 1 ms queue and `pre` s preprocess; busy seconds `busy`.
std::string Classic(int n, double pre, double busy, int batches, int pending) {
  std::string t = "# TYPE stoke:request_stage_seconds histogram\n";
  for (const char* st : {"recv", "queue", "preprocess", "compute", "send"}) {
    double per = std::string(st) == "preprocess" ? pre : (std::string(st) == "queue" ? 1e-3 : 1e-4);
    t += fmt::format("stoke:request_stage_seconds_sum{{model_name=\"m\",stage=\"{}\"}} {}\n", st, per * n);
    t += fmt::format("stoke:request_stage_seconds_count{{model_name=\"m\",stage=\"{}\"}} {}\n", st, n);
  }
  t += fmt::format("stoke:inference_count_total{{model_name=\"m\"}} {}\n", n);
  t += fmt::format("stoke:inference_exec_count_total{{model_name=\"m\"}} {}\n", batches);
  t += fmt::format("stoke:batch_close_total{{model_name=\"m\",reason=\"full\"}} {}\n", batches / 2);
  t += fmt::format("stoke:batch_close_total{{model_name=\"m\",reason=\"immediate\"}} {}\n",
                   batches - batches / 2);
  t += fmt::format("stoke:instance_busy_seconds_total{{model_name=\"m\",instance=\"0\"}} {}\n", busy);
  t += fmt::format("stoke:inference_pending_request_count{{model_name=\"m\"}} {}\n", pending);
  // Another model's series must not leak in.
  t += "stoke:instance_busy_seconds_total{model_name=\"other\",instance=\"0\"} 999\n";
  return t;
}

TEST(DoctorExtract, ClassicLedgerBatchesAndBusyTimeAreWindowDeltas) {
  std::vector<Scrape> sc(3);
  sc[0] = {0.0, Parse(Classic(100, 0.004, 10, 40, 0)), nullptr};
  sc[1] = {1.0, Parse(Classic(150, 0.004, 10.9, 50, 6)), nullptr};
  sc[2] = {2.0, Parse(Classic(300, 0.004, 11.9, 80, 2)), nullptr};
  ModelConfigInfo cfg = ParseModelConfig(nlohmann::json::parse(
      R"({"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 500},
          "instance_group": [{"count": 1, "kind": "KIND_CPU"}]})"));
  Signals s = ExtractSignals(sc, cfg, "m");
  EXPECT_EQ(s.kind, "classic");
  EXPECT_EQ(s.requests, 200);
  EXPECT_DOUBLE_EQ(s.window_s, 2.0);
  EXPECT_NEAR(s.stage_s.at("preprocess"), 0.004, 1e-12);
  EXPECT_NEAR(s.host_s, 0.004, 1e-12);
  EXPECT_NEAR(s.queue_s, 0.001, 1e-12);
  EXPECT_NEAR(s.io_s, 2e-4, 1e-12);
  EXPECT_NEAR(s.latency_s, 0.004 + 0.001 + 3e-4, 1e-12);
  EXPECT_NEAR(s.mean_batch_size, 200.0 / 40, 1e-12);
  EXPECT_NEAR(s.close_share.at("full"), 0.5, 1e-12);
  EXPECT_NEAR(s.instance_busy, 1.9 / 2.0, 1e-12);
  EXPECT_NEAR(s.pending_mean, 8.0 / 3, 1e-12);
  EXPECT_EQ(s.max_batch_size, 16);
  EXPECT_EQ(s.max_queue_delay_us, 500);
  EXPECT_EQ(s.instances, 1);
  EXPECT_EQ(Diagnose(s).front().bottleneck, "host_bound");
}

TEST(DoctorExtract, NoDynamicBatchingMeansBatchingOff) {
  ModelConfigInfo cfg = ParseModelConfig(nlohmann::json::parse(R"({"max_batch_size": 8})"));
  EXPECT_TRUE(cfg.known);
  EXPECT_EQ(cfg.max_batch_size, 0);
}

std::string Llm(double kv, int preempt, int no_blocks, int empty, int waiting) {
  std::string t;
  t += fmt::format("stoke:kv_cache_usage_ratio{{model_name=\"m\"}} {}\n", kv);
  t += "stoke:kv_cache_blocks_used{model_name=\"m\"} 30\nstoke:kv_cache_blocks_free{model_name=\"m\"} 2\n";
  t += fmt::format("stoke:num_preemptions_total{{model_name=\"m\"}} {}\n", preempt);
  t += fmt::format("stoke:num_requests_waiting{{model_name=\"m\"}} {}\n", waiting);
  t += "stoke:num_requests_running{model_name=\"m\"} 4\n";
  t +=
      fmt::format("stoke:step_admission_stop_total{{model_name=\"m\",reason=\"no_blocks\"}} {}\n", no_blocks);
  t += fmt::format("stoke:step_admission_stop_total{{model_name=\"m\",reason=\"queue_empty\"}} {}\n", empty);
  return t;
}

TEST(DoctorExtract, LlmGaugesAreMeanAndMaxCountersAreDeltas) {
  std::vector<Scrape> sc = {{0, Parse(Llm(0.5, 3, 10, 10, 0)), nullptr},
                            {1, Parse(Llm(1.0, 8, 40, 20, 6)), nullptr}};
  Signals s = ExtractSignals(sc, {}, "m");
  EXPECT_EQ(s.kind, "llm");
  EXPECT_DOUBLE_EQ(s.kv_usage_max, 1.0);
  EXPECT_DOUBLE_EQ(s.kv_usage_mean, 0.75);
  EXPECT_DOUBLE_EQ(s.kv_blocks_total, 32);
  EXPECT_DOUBLE_EQ(s.preemptions, 5);
  EXPECT_DOUBLE_EQ(s.waiting_mean, 3);
  EXPECT_NEAR(s.admission_share.at("no_blocks"), 0.75, 1e-12);
  EXPECT_EQ(Diagnose(s).front().bottleneck, "kv_capacity_bound");
}

// The engine's steps as the server exports them, cumulative: `steps` steps of `ms` each (of which `model_ms`
// in the model), each with 256 decode tokens, 100 prefill tokens, 16 GB of weights, 2 GB of KV, 9 TFLOP of
// matmul and 0.5 TFLOP of attention; `cost` = false: a model without a cost model (zero bytes and FLOPs).
std::string Steps(double steps, double ms, double model_ms, bool cost = true) {
  std::string t = "stoke:kv_cache_usage_ratio{model_name=\"m\"} 0.5\n";
  t += fmt::format("stoke:step_duration_seconds_count{{model_name=\"m\"}} {}\n", steps);
  t += fmt::format("stoke:step_duration_seconds_sum{{model_name=\"m\"}} {}\n", steps * ms / 1e3);
  t += fmt::format("stoke:step_decode_tokens_sum{{model_name=\"m\"}} {}\n", 256 * steps);
  t += fmt::format("stoke:step_prefill_tokens_sum{{model_name=\"m\"}} {}\n", 100 * steps);
  t +=
      fmt::format("stoke:step_seconds_total{{model_name=\"m\",part=\"model\"}} {}\n", steps * model_ms / 1e3);
  t += fmt::format("stoke:step_seconds_total{{model_name=\"m\",part=\"host\"}} {}\n",
                   steps * (ms - model_ms) / 1e3);
  t += fmt::format("stoke:step_output_seconds_total{{model_name=\"m\"}} {}\n", steps * 0.5e-3);
  const double c = cost ? 1 : 0;
  t += fmt::format("stoke:step_read_bytes_total{{kind=\"weights\",model_name=\"m\"}} {}\n", c * 16e9 * steps);
  t += fmt::format("stoke:step_read_bytes_total{{kind=\"kv\",model_name=\"m\"}} {}\n", c * 2e9 * steps);
  t += fmt::format("stoke:step_flops_total{{kind=\"matmul\",model_name=\"m\"}} {}\n", c * 9e12 * steps);
  t += fmt::format("stoke:step_flops_total{{kind=\"attention\",model_name=\"m\"}} {}\n", c * 0.5e12 * steps);
  // Another model's steps must not leak in.
  t += "stoke:step_duration_seconds_count{model_name=\"other\"} 5000\n";
  return t;
}

TEST(DoctorExtract, StepSplitIsPerStepOverTheWindowAndTimedAtTheDeviceRates) {
  std::vector<Scrape> sc = {{0, Parse(Steps(100, 30, 29)), nullptr}, {2, Parse(Steps(180, 25, 24)), nullptr}};
  Signals s = ExtractSignals(sc, {}, "m");
  EXPECT_EQ(s.kind, "llm");
  EXPECT_DOUBLE_EQ(s.steps, 80);
  // 180 x 25 ms - 100 x 30 ms = 1.5 s over 80 steps; model 180 x 24 - 100 x 29 = 1.42 s.
  EXPECT_NEAR(s.step_ms, 1500.0 / 80, 1e-9);
  EXPECT_NEAR(s.step_model_ms, 1420.0 / 80, 1e-9);
  EXPECT_NEAR(s.step_host_ms, 80.0 / 80, 1e-9);
  EXPECT_NEAR(s.step_output_ms, 0.5, 1e-9);  // the output thread's 0.5 ms per step (async output)
  EXPECT_NEAR(s.engine_busy, 1.5 / 2, 1e-12);
  EXPECT_NEAR(s.step_decode_tokens, 256, 1e-9);
  EXPECT_NEAR(s.step_prefill_tokens, 100, 1e-9);
  EXPECT_NEAR(s.step_weight_bytes, 16e9, 1);
  EXPECT_NEAR(s.step_kv_bytes, 2e9, 1);
  EXPECT_NEAR(s.step_matmul_flops, 9e12, 1e3);
  EXPECT_FALSE(Has(s.step_floor_ms));  // no rates yet
  EXPECT_FALSE(Has(s.step_memory_ms) || Has(s.step_math_ms));

  ApplyDeviceRates(/*hbm_gbps=*/4000, /*tensor_tflops=*/600, &s);
  EXPECT_NEAR(s.step_weights_ms, 4.0, 1e-9);
  EXPECT_NEAR(s.step_kv_ms, 0.5, 1e-9);
  EXPECT_NEAR(s.step_matmul_ms, 15.0, 1e-9);
  EXPECT_NEAR(s.step_attention_ms, 0.5e12 / 600e12 * 1e3, 1e-9);
  EXPECT_NEAR(s.step_floor_ms, 15.0 + 0.5e12 / 600e12 * 1e3, 1e-9);  // the math is the larger part
  EXPECT_NEAR(s.step_memory_ms, 4.5, 1e-9);                          // weights + KV
  EXPECT_NEAR(s.step_math_ms, 15.0 + 0.5e12 / 600e12 * 1e3, 1e-9);   // matmul + attention

  ApplyDeviceRates(/*hbm_gbps=*/1000, /*tensor_tflops=*/0, &s);  // bandwidth only: a lower bound from it
  EXPECT_NEAR(s.step_floor_ms, 18.0, 1e-9);
}

TEST(DoctorExtract, StepSplitWithoutACostModelHasNoFloor) {
  std::vector<Scrape> sc = {{0, Parse(Steps(10, 5, 4, false)), nullptr},
                            {1, Parse(Steps(20, 5, 4, false)), nullptr}};
  Signals s = ExtractSignals(sc, {}, "m");
  EXPECT_DOUBLE_EQ(s.steps, 10);
  EXPECT_NEAR(s.step_model_ms, 4, 1e-9);
  ApplyDeviceRates(4000, 600, &s);
  EXPECT_FALSE(Has(s.step_weights_ms));
  EXPECT_FALSE(Has(s.step_floor_ms));
}

TEST(DoctorExtract, PrometheusNamesAndGpuJson) {
  auto gpu = [](double ts, double pv, const char* reason) {
    return nlohmann::json::parse(fmt::format(
        R"({{"available": true, "timestamp": {}, "devices": [{{"gpu": 0, "clocks_event_reasons": ["{}"],
            "metrics": {{"DCGM_FI_DEV_GPU_UTIL": 99, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.98,
                        "DCGM_FI_PROF_SM_ACTIVE": 0.03, "DCGM_FI_PROF_DRAM_ACTIVE": 0.02,
                        "DCGM_FI_DEV_FB_USED": 10, "DCGM_FI_DEV_FB_TOTAL": 80,
                        "DCGM_FI_DEV_POWER_VIOLATION": {}, "DCGM_FI_DEV_THERMAL_VIOLATION": 0}}}}]}})",
        ts, reason, pv));
  };
  std::vector<Scrape> sc = {
      {0, Parse("stoke_inference_exec_count_total{model_name=\"m\"} 1\n"), gpu(100, 0, "gpu_idle")},
      {2, Parse("stoke_inference_exec_count_total{model_name=\"m\"} 9\n"), gpu(102, 1e9, "sw_power_cap")}};
  Signals s = ExtractSignals(sc, {}, "m");
  EXPECT_EQ(s.kind, "classic");  // stoke_ names (--metric-names prometheus) read the same
  EXPECT_EQ(s.gpu_samples, 2);
  EXPECT_DOUBLE_EQ(s.gpu_util, 0.99);
  EXPECT_DOUBLE_EQ(s.sm_active, 0.03);
  EXPECT_DOUBLE_EQ(s.fb_used_ratio, 0.125);
  EXPECT_DOUBLE_EQ(s.power_violation_share, 0.5);
  EXPECT_DOUBLE_EQ(s.thermal_violation_share, 0);
  EXPECT_DOUBLE_EQ(s.clock_reason_share.at("sw_power_cap"), 0.5);
}

// GET /v1/models as the OpenAI server answers it: the named model's precision, nothing for other models or
// entries without one.
TEST(DoctorExtract, ServedPrecisionFromTheModelsList) {
  const nlohmann::json models = nlohmann::json::parse(R"json({"object": "list", "data": [
    {"id": "other", "device": "cpu", "precision": {"kv_cache_dtype": "int8", "quantization": "none"}},
    {"id": "llama", "object": "model", "device": "cuda:0 (NVIDIA H200)",
     "precision": {"kv_cache_dtype": "fp8", "quantization": "fp8", "consistency_gate": null}}]})json");
  ModelConfigInfo info;
  ParseServedPrecision(models, "llama", &info);
  EXPECT_EQ(info.kv_cache_dtype, "fp8");
  EXPECT_EQ(info.weight_quantization, "fp8");
  EXPECT_EQ(info.device, "cuda:0 (NVIDIA H200)");
  const Signals s = ExtractSignals({}, info, "llama");
  EXPECT_EQ(s.kv_cache_dtype, "fp8");  // from the models list, whatever the scrapes say
  EXPECT_EQ(s.weight_quantization, "fp8");
  EXPECT_EQ(s.device, "cuda:0 (NVIDIA H200)");
  ModelConfigInfo none;
  ParseServedPrecision(models, "absent", &none);
  ParseServedPrecision(nlohmann::json::parse(R"({"data": [{"id": "llama"}]})"), "llama", &none);
  ParseServedPrecision(nlohmann::json::array(), "llama", &none);
  EXPECT_EQ(none.kv_cache_dtype, "");
  EXPECT_EQ(none.weight_quantization, "");
  EXPECT_EQ(none.device, "");
}

}  // namespace
}  // namespace stoke::doctor
