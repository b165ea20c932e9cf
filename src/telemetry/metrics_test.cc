#include "telemetry/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "telemetry/server_metrics.h"

namespace stoke {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRegistryTest, CounterGaugeHistogramExposition) {
  MetricsRegistry r;
  auto c = r.AddCounter("stoke:things_total", "Things counted.");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  c->WithLabels({{"kind", "a"}}).Inc();
  c->WithLabels({{"kind", "a"}}).Inc(2);
  c->WithLabels({{"kind", "b\"q"}}).Inc();  // label values are escaped
  auto g = r.AddGauge("stoke:level", "A level.");
  ASSERT_TRUE(g.ok());
  g->Get().Set(4.5);
  auto h = r.AddHistogram("stoke:size_seconds", "Sizes.", {0.1, 1.0});
  ASSERT_TRUE(h.ok());
  Histogram hh = h->Get();
  hh.Observe(0.05);
  hh.Observe(0.1);  // le is inclusive
  hh.Observe(0.5);
  hh.Observe(7);
  EXPECT_EQ(hh.CumulativeCounts(), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(hh.Count(), 4u);
  EXPECT_DOUBLE_EQ(hh.Sum(), 7.65);

  const std::string text = r.ExposeText();
  EXPECT_THAT(text, HasSubstr("# HELP stoke:things_total Things counted."));
  EXPECT_THAT(text, HasSubstr("# TYPE stoke:things_total counter"));
  EXPECT_THAT(text, HasSubstr("stoke:things_total{kind=\"a\"} 3"));
  EXPECT_THAT(text, HasSubstr("stoke:things_total{kind=\"b\\\"q\"} 1"));
  EXPECT_THAT(text, HasSubstr("# TYPE stoke:level gauge"));
  EXPECT_THAT(text, HasSubstr("stoke:level 4.5"));
  EXPECT_THAT(text, HasSubstr("# TYPE stoke:size_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("stoke:size_seconds_bucket{le=\"0.1\"} 2"));
  EXPECT_THAT(text, HasSubstr("stoke:size_seconds_bucket{le=\"1\"} 3"));
  EXPECT_THAT(text, HasSubstr("stoke:size_seconds_bucket{le=\"+Inf\"} 4"));
  EXPECT_THAT(text, HasSubstr("stoke:size_seconds_count 4"));
}

TEST(MetricsRegistryTest, RejectsBadNamesTypesAndBuckets) {
  MetricsRegistry r;
  EXPECT_EQ(r.AddCounter("bad name_total", "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddCounter("stoke:no_suffix", "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddHistogram("stoke:h", "x", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddHistogram("stoke:h", "x", {1, 1}).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(r.AddGauge("stoke:g", "x").ok());
  EXPECT_EQ(r.AddHistogram("stoke:g", "x", {1}).status().code(), StatusCode::kAlreadyExists);
  auto c = r.AddCounter("stoke:c_total", "x");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->TryWithLabels({{"bad-label", "v"}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->TryWithLabels({{"le", "v"}}).status().code(), StatusCode::kInvalidArgument);
  // A bad label through the unchecked path gives a null handle, not a crash.
  Counter null_counter = c->WithLabels({{"0bad", "v"}});
  null_counter.Inc();
  EXPECT_EQ(null_counter.Value(), 0.0);
  // Same name, same type: the same family.
  auto c2 = r.AddCounter("stoke:c_total", "x");
  ASSERT_TRUE(c2.ok());
  c->Get().Inc(5);
  EXPECT_EQ(c2->Get().Value(), 5.0);
}

TEST(MetricsRegistryTest, CountersNeverDecrease) {
  MetricsRegistry r;
  auto c = r.AddCounter("stoke:x_total", "x");
  ASSERT_TRUE(c.ok());
  Counter h = c->Get();
  h.Inc(2);
  h.Inc(-1);
  EXPECT_EQ(h.Value(), 2.0);
}

TEST(MetricsRegistryTest, ConcurrentIncrementsAreNotLost) {
  MetricsRegistry r;
  auto c = r.AddCounter("stoke:n_total", "x");
  auto h = r.AddHistogram("stoke:v", "x", {1, 2});
  ASSERT_TRUE(c.ok() && h.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Get().Inc();
        h->Get().Observe(1.5);
      }
    });
  }
  for (int i = 0; i < 20; ++i) (void)r.ExposeText();  // scrapes during updates
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->Get().Value(), 40000.0);
  EXPECT_EQ(h->Get().Count(), 40000u);
}

TEST(MetricsRegistryTest, CollectHooksRunBeforeExposition) {
  MetricsRegistry r;
  auto g = r.AddGauge("stoke:sampled", "x");
  ASSERT_TRUE(g.ok());
  int calls = 0;
  r.AddCollectHook([&] { g->Get().Set(++calls); });
  EXPECT_THAT(r.ExposeText(), HasSubstr("stoke:sampled 1"));
  EXPECT_THAT(r.ExposeText(), HasSubstr("stoke:sampled 2"));
}

TEST(MetricsRegistryTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0, 5, 3), (std::vector<double>{0, 5, 10}));
}

TEST(ServerMetricsTest, EveryDocumentedNameIsExposed) {
  auto m = ServerMetrics::Create("smol", 8192);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string text = (*m)->ExposeText();
  for (const char* name : {"stoke:time_to_first_token_seconds", "stoke:inter_token_latency_seconds",
                           "stoke:e2e_request_latency_seconds", "stoke:request_queue_time_seconds",
                           "stoke:request_prompt_tokens",       "stoke:request_generation_tokens",
                           "stoke:num_requests_running",        "stoke:num_requests_waiting",
                           "stoke:kv_cache_usage_ratio",        "stoke:kv_cache_blocks_free",
                           "stoke:kv_cache_blocks_used",        "stoke:prefix_cache_hits_total",
                           "stoke:prefix_cache_queries_total",  "stoke:prefix_cache_evictions_total",
                           "stoke:prompt_tokens_total",         "stoke:generation_tokens_total",
                           "stoke:request_success_total",       "stoke:step_prefill_tokens",
                           "stoke:step_decode_tokens",          "stoke:step_admission_stop_total",
                           "stoke:request_stage_seconds",       "stoke:step_seconds_total",
                           "stoke:step_read_bytes_total",       "stoke:step_flops_total"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + name + " ")) << name;
  }
  for (const char* stage : {"recv", "queue", "preprocess", "compute", "postprocess", "send"}) {
    EXPECT_THAT(text,
                HasSubstr(std::string("stoke:request_stage_seconds_count{model_name=\"smol\",stage=\"") +
                          stage + "\"} 0"));
  }
  EXPECT_THAT(text,
              HasSubstr("stoke:request_success_total{finished_reason=\"abort\",model_name=\"smol\"} 0"));
}

TEST(MetricsRegistryTest, PrometheusNamingExposesUnderscoresForTheSameFamilies) {
  EXPECT_EQ(MetricName(MetricNaming::kVllm, "stoke:ttft_seconds"), "stoke:ttft_seconds");
  EXPECT_EQ(MetricName(MetricNaming::kPrometheus, "stoke:ttft_seconds"), "stoke_ttft_seconds");
  EXPECT_EQ(MetricName(MetricNaming::kPrometheus, "nv_gpu_utilization"), "nv_gpu_utilization");
  EXPECT_EQ(*ParseMetricNaming("prometheus"), MetricNaming::kPrometheus);
  EXPECT_EQ(*ParseMetricNaming("vllm"), MetricNaming::kVllm);
  EXPECT_FALSE(ParseMetricNaming("statsd").ok());

  MetricsRegistry r(MetricNaming::kPrometheus);
  auto c = r.AddCounter("stoke:things_total", "Things.");
  ASSERT_TRUE(c.ok());
  c->Get().Inc(2);
  // Registering the vLLM spelling again finds the same family; a different type under it is still refused.
  auto again = r.AddCounter("stoke:things_total", "Things.");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Get().Value(), 2);
  EXPECT_EQ(r.AddGauge("stoke:things_total", "x").status().code(), StatusCode::kAlreadyExists);
  const std::string text = r.ExposeText();
  EXPECT_THAT(text, HasSubstr("# TYPE stoke_things_total counter"));
  EXPECT_THAT(text, HasSubstr("stoke_things_total 2"));
  EXPECT_THAT(text, Not(HasSubstr(":")));

  auto m = ServerMetrics::Create("smol", 8192, MetricNaming::kPrometheus);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::string server = (*m)->ExposeText();
  EXPECT_THAT(server, HasSubstr("# TYPE stoke_time_to_first_token_seconds histogram"));
  EXPECT_THAT(server, HasSubstr("stoke_request_stage_seconds_count{model_name=\"smol\",stage=\"queue\"} 0"));
  EXPECT_THAT(server, Not(HasSubstr("stoke:")));
}

TEST(ServerMetricsTest, RecordsRequestsStepsAndSnapshots) {
  auto created = ServerMetrics::Create("m", 2048);
  ASSERT_TRUE(created.ok());
  ServerMetrics& m = **created;
  RequestRecord r;
  r.finish = FinishReason::kLength;
  r.prompt_tokens = 12;
  r.completion_tokens = 5;
  r.ttft = 0.2;
  r.e2e = 0.9;
  r.inter_token = {0.1, 0.2, 0.1, 0.3};
  m.RecordRequest(r);
  r.finish = FinishReason::kCancelled;
  m.RecordRequest(r);
  m.ObserveStage(LedgerStage::kSend, 0.001);

  StepRecord step;
  step.prefill_tokens = 100;
  step.decode_tokens = 3;
  step.num_running = 4;
  step.num_waiting = 2;
  step.kv_blocks_used = 25;
  step.kv_blocks_free = 75;
  step.admission_stop = "no_blocks";
  step.duration = 3'000'000;  // 3 ms, 2 of them in the model
  step.model_ns = 2'000'000;
  step.weight_bytes = 1e9;
  step.kv_bytes = 2.5e6;
  step.matmul_flops = 4e12;
  step.attention_flops = 5e9;
  m.RecordStep(step);
  m.RecordStep(step);

  int64_t hits = 0;
  m.SetSnapshotSource([&] {
    EngineSnapshot s;
    s.num_running = 1;
    s.kv_blocks_used = 10;
    s.kv_blocks_free = 30;
    s.kv_blocks_total = 40;
    s.prefix_cache_hits = hits;
    s.prefix_cache_queries = 2 * hits;
    return s;
  });
  hits = 64;
  std::string text = m.ExposeText();
  EXPECT_THAT(text, HasSubstr("stoke:request_success_total{finished_reason=\"length\",model_name=\"m\"} 1"));
  EXPECT_THAT(text, HasSubstr("stoke:request_success_total{finished_reason=\"abort\",model_name=\"m\"} 1"));
  EXPECT_THAT(text, HasSubstr("stoke:prompt_tokens_total{model_name=\"m\"} 24"));
  EXPECT_THAT(text, HasSubstr("stoke:generation_tokens_total{model_name=\"m\"} 10"));
  EXPECT_THAT(text, HasSubstr("stoke:inter_token_latency_seconds_count{model_name=\"m\"} 8"));
  EXPECT_THAT(text, HasSubstr("stoke:step_admission_stop_total{model_name=\"m\",reason=\"no_blocks\"} 2"));
  // The per-step split, summed over both steps.
  EXPECT_THAT(text, HasSubstr("stoke:step_seconds_total{model_name=\"m\",part=\"model\"} 0.004"));
  EXPECT_THAT(text, HasSubstr("stoke:step_seconds_total{model_name=\"m\",part=\"host\"} 0.002"));
  EXPECT_THAT(text, HasSubstr("stoke:step_read_bytes_total{kind=\"weights\",model_name=\"m\"} 2000000000"));
  EXPECT_THAT(text, HasSubstr("stoke:step_read_bytes_total{kind=\"kv\",model_name=\"m\"} 5000000"));
  EXPECT_THAT(text, HasSubstr("stoke:step_flops_total{kind=\"matmul\",model_name=\"m\"} 8000000000000"));
  EXPECT_THAT(text, HasSubstr("stoke:step_flops_total{kind=\"attention\",model_name=\"m\"} 10000000000"));
  EXPECT_THAT(text, HasSubstr("stoke:request_stage_seconds_count{model_name=\"m\",stage=\"send\"} 1"));
  // The snapshot (pulled at scrape time) wins over the last step's gauges.
  EXPECT_THAT(text, HasSubstr("stoke:num_requests_running{model_name=\"m\"} 1"));
  EXPECT_THAT(text, HasSubstr("stoke:kv_cache_usage_ratio{model_name=\"m\"} 0.25"));
  EXPECT_THAT(text, HasSubstr("stoke:prefix_cache_hits_total{model_name=\"m\"} 64"));
  hits = 100;
  text = m.ExposeText();
  EXPECT_THAT(text, HasSubstr("stoke:prefix_cache_hits_total{model_name=\"m\"} 100"));
  EXPECT_THAT(text, HasSubstr("stoke:prefix_cache_queries_total{model_name=\"m\"} 200"));
  hits = 10;  // engine re-based: the counter must not go down
  text = m.ExposeText();
  EXPECT_THAT(text, HasSubstr("stoke:prefix_cache_hits_total{model_name=\"m\"} 100"));
  EXPECT_THAT(text, Not(HasSubstr("NaN")));
}

}  // namespace
}  // namespace stoke
