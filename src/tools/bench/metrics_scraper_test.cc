#include "tools/bench/metrics_scraper.h"

#include <gtest/gtest.h>

#include <cmath>

namespace stoke::bench {
namespace {

constexpr const char* kScrape1 = R"(# HELP stoke:num_requests_running Running.
# TYPE stoke:num_requests_running gauge
stoke:num_requests_running{model_name="m"} 3
# TYPE stoke:kv_cache_usage_ratio gauge
stoke:kv_cache_usage_ratio{model_name="m"} 0.25
# TYPE stoke:generation_tokens_total counter
stoke:generation_tokens_total{model_name="m"} 100
# TYPE stoke:request_stage_seconds histogram
stoke:request_stage_seconds_bucket{model_name="m",stage="queue",le="+Inf"} 2
stoke:request_stage_seconds_sum{model_name="m",stage="queue"} 0.5
stoke:request_stage_seconds_count{model_name="m",stage="queue"} 2
# TYPE stoke:step_seconds_total counter
stoke:step_seconds_total{model_name="m",part="model"} 1.0
stoke:step_seconds_total{model_name="m",part="host"} 0.1
# TYPE stoke:step_duration_seconds histogram
stoke:step_duration_seconds_count{model_name="m"} 100
# TYPE other_gauge gauge
other_gauge 5
)";

constexpr const char* kScrape2 = R"(# TYPE stoke:num_requests_running gauge
stoke:num_requests_running{model_name="m"} 1
# TYPE stoke:kv_cache_usage_ratio gauge
stoke:kv_cache_usage_ratio{model_name="m"} 0.5
# TYPE stoke:generation_tokens_total counter
stoke:generation_tokens_total{model_name="m"} 300
# TYPE stoke:request_stage_seconds histogram
stoke:request_stage_seconds_sum{model_name="m",stage="queue"} 0.8
stoke:request_stage_seconds_count{model_name="m",stage="queue"} 4
# TYPE stoke:step_seconds_total counter
stoke:step_seconds_total{model_name="m",part="model"} 3.0
stoke:step_seconds_total{model_name="m",part="host"} 0.2
# TYPE stoke:step_duration_seconds histogram
stoke:step_duration_seconds_count{model_name="m"} 180
# TYPE stoke:inference_count_total counter
stoke:inference_count_total{model="s",version="1"} 40
# TYPE stoke:inference_exec_count_total counter
stoke:inference_exec_count_total{model="s",version="1"} 10
# TYPE stoke:inference_pending_request_count gauge
stoke:inference_pending_request_count{model="s",version="1"} 7
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="x",gpu="0"} 0.75
)";

TEST(Prometheus, ParsesSamplesLabelsAndTypes) {
  std::map<std::string, std::string> types;
  auto s = ParsePrometheusText("# TYPE a gauge\na{x=\"1\",y=\"q\\\"z\"} 2.5 1700000000\nb +Inf\n\n", &types);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].name, "a");
  EXPECT_EQ((*s)[0].labels.at("x"), "1");
  EXPECT_EQ((*s)[0].labels.at("y"), "q\"z");
  EXPECT_DOUBLE_EQ((*s)[0].value, 2.5);
  EXPECT_TRUE(std::isinf((*s)[1].value));
  EXPECT_EQ(types["a"], "gauge");
  EXPECT_FALSE(ParsePrometheusText("a{x=\"1\" 2\n", nullptr).ok());
  EXPECT_FALSE(ParsePrometheusText("a notanumber\n", nullptr).ok());
}

TEST(Prometheus, MeanBatchSizeFromInferenceAndExecutionCounts) {
  // Both spellings of `stoke serve --metric-names` (vllm: "stoke:", prometheus: "stoke_").
  for (std::string sep : {":", "_"}) {
    SeriesBuilder b;
    const std::string texts[] = {
        "stoke" + sep + "inference_count_total 10\nstoke" + sep + "inference_exec_count_total 5\n",
        "stoke" + sep + "inference_count_total 50\nstoke" + sep + "inference_exec_count_total 10\n"};
    double t = 0;
    for (const std::string& text : texts) {
      std::map<std::string, std::string> types;
      auto s = ParsePrometheusText(text, &types);
      ASSERT_TRUE(s.ok());
      b.Add(t++, *s, types);
    }
    ServerSeries out = b.Take();
    ASSERT_EQ(out.series["mean_batch_size"].size(), 2u) << sep;
    EXPECT_DOUBLE_EQ(out.series["mean_batch_size"][1], 8) << sep;  // 40 inferences in 5 executions
  }
}

TEST(Prometheus, SeriesBuilderKeepsGaugesRatesAndStageMeans) {
  SeriesBuilder b;
  for (auto [t, text] : {std::pair{0.0, kScrape1}, std::pair{2.0, kScrape2}}) {
    std::map<std::string, std::string> types;
    auto s = ParsePrometheusText(text, &types);
    ASSERT_TRUE(s.ok());
    b.Add(t, *s, types);
  }
  ServerSeries out = b.Take();
  ASSERT_EQ(out.t_s.size(), 2u);
  EXPECT_EQ(out.series.count("other_gauge"), 0u);  // not one the report charts
  EXPECT_EQ(out.series["stoke:num_requests_running"], (std::vector<double>{3, 1}));
  EXPECT_EQ(out.series["stoke:kv_cache_usage_ratio"], (std::vector<double>{0.25, 0.5}));
  auto rate = out.series["stoke:generation_tokens_per_s"];
  ASSERT_EQ(rate.size(), 2u);
  EXPECT_TRUE(std::isnan(rate[0]));
  EXPECT_DOUBLE_EQ(rate[1], 100);  // (300 - 100) / 2 s
  auto queue = out.series["stage_ms:queue"];
  EXPECT_TRUE(std::isnan(queue[0]));
  EXPECT_DOUBLE_EQ(queue[1], 150);  // (0.8 - 0.5) / (4 - 2) s
  // The engine step split: 2 s of model and 0.1 s of host time over 80 steps in the interval.
  EXPECT_TRUE(std::isnan(out.series["step_ms:model"][0]));
  EXPECT_DOUBLE_EQ(out.series["step_ms:model"][1], 25);
  EXPECT_NEAR(out.series["step_ms:host"][1], 1.25, 1e-12);
  EXPECT_EQ(out.series["stoke:inference_pending_request_count"][1], 7);
  EXPECT_TRUE(std::isnan(out.series["mean_batch_size"][1]));  // counters first seen: no interval yet
  auto gpu = out.series["nv_gpu_utilization{gpu=0}"];         // first seen in the second scrape
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_TRUE(std::isnan(gpu[0]));
  EXPECT_DOUBLE_EQ(gpu[1], 0.75);
}

TEST(Prometheus, KeepsDcgmGpuGaugesPerGpuAndReason) {
  SeriesBuilder b;
  std::map<std::string, std::string> types;
  auto s = ParsePrometheusText(R"(# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",modelName="H200",Hostname="h"} 0.6
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-b",modelName="H200",Hostname="h"} 0.2
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 100
# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL gauge
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0",UUID="GPU-a"} 3
# TYPE stoke_gpu_clocks_event_reason gauge
stoke_gpu_clocks_event_reason{gpu="0",reason="sw_power_cap"} 1
stoke_gpu_clocks_event_reason{gpu="0",reason="gpu_idle"} 0
# TYPE stoke_gpu_telemetry_available gauge
stoke_gpu_telemetry_available 1
)",
                               &types);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  b.Add(0, *s, types);
  ServerSeries out = b.Take();
  EXPECT_EQ(out.series["DCGM_FI_PROF_SM_ACTIVE{gpu=0}"], (std::vector<double>{0.6}));
  EXPECT_EQ(out.series["DCGM_FI_PROF_SM_ACTIVE{gpu=1}"], (std::vector<double>{0.2}));
  EXPECT_EQ(out.series["DCGM_FI_DEV_GPU_UTIL{gpu=0}"], (std::vector<double>{100}));
  EXPECT_EQ(out.series["stoke_gpu_clocks_event_reason{gpu=0,reason=sw_power_cap}"], (std::vector<double>{1}));
  EXPECT_EQ(out.series["stoke_gpu_clocks_event_reason{gpu=0,reason=gpu_idle}"], (std::vector<double>{0}));
  EXPECT_EQ(out.series.count("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu=0}"), 0u);  // not charted
  EXPECT_EQ(out.series.count("stoke_gpu_telemetry_available"), 0u);
}

}  // namespace
}  // namespace stoke::bench
