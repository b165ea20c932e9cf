// Diagnose() on hand-made Signals: one case per bottleneck name, the boundaries of the thresholds, and
// signals that are missing (never fire a rule).
#include "tools/doctor/rules.h"

#include <gtest/gtest.h>

#include <string>

#include "tools/doctor/extract.h"

namespace stoke::doctor {
namespace {

// A classic model under load with a healthy split: 100 requests, 10 ms latency, instances 60% busy.
Signals Classic(double queue_ms, double pre_ms, double h2d_ms, double compute_ms, double busy) {
  Signals s;
  s.kind = "classic";
  s.window_s = 5;
  s.requests = 100;
  s.requests_per_s = 20;
  s.stage_s = {{"recv", 1e-4},         {"queue", queue_ms * 1e-3},     {"preprocess", pre_ms * 1e-3},
               {"h2d", h2d_ms * 1e-3}, {"compute", compute_ms * 1e-3}, {"send", 1e-4}};
  s.queue_s = queue_ms * 1e-3;
  s.io_s = 2e-4;
  s.host_s = pre_ms * 1e-3;
  s.copy_s = h2d_ms * 1e-3;
  s.device_s = compute_ms * 1e-3;
  s.service_s = s.host_s + s.copy_s + s.device_s;
  s.latency_s = s.queue_s + s.io_s + s.service_s;
  s.instance_busy = busy;
  s.instances = 1;
  s.max_batch_size = 8;
  s.max_queue_delay_us = 100;
  s.mean_batch_size = 3;
  return s;
}

// A decoder under load: `requests` finished, each queue_s waiting, device_s in the model's steps and host_s
// in its postprocess (service = device + host, latency = queue + service), no I/O or copies.
Signals Llm(int64_t requests, double queue_s, double device_s, double host_s, double kv_usage_max) {
  Signals s;
  s.kind = "llm";
  s.requests = requests;
  s.stage_s = {{"queue", queue_s}, {"compute", device_s}, {"postprocess", host_s}};
  s.queue_s = queue_s;
  s.device_s = device_s;
  s.host_s = host_s;
  s.io_s = s.copy_s = 0;
  s.service_s = device_s + host_s;
  s.latency_s = queue_s + s.service_s;
  s.kv_usage_max = kv_usage_max;
  return s;
}

// The GPU's counters over the window (10 samples).
void Gpu(Signals* s, double util, double sm_active, double tensor_active, double dram_active) {
  s->gpu_samples = 10;
  s->gpu_util = util;
  s->sm_active = sm_active;
  s->tensor_active = tensor_active;
  s->dram_active = dram_active;
}

const Evidence* FindEvidence(const Verdict& v, const std::string& signal) {
  for (const Evidence& e : v.evidence) {
    if (e.signal == signal) return &e;
  }
  return nullptr;
}

std::string Top(const Signals& s) {
  return Diagnose(s).front().bottleneck;
}

TEST(DoctorRules, HostBoundWhenPreprocessDominatesTheServiceTime) {
  Signals s = Classic(/*queue*/ 20, /*pre*/ 8, /*h2d*/ 0.1, /*compute*/ 1, /*busy*/ 0.95);
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "host_bound");
  EXPECT_EQ(v.front().evidence.front().signal, "ledger.host_share");
  EXPECT_NEAR(v.front().evidence.front().value, 8 / 9.1, 1e-9);
  EXPECT_EQ(v.front().evidence.front().threshold, 0.5);
  EXPECT_NE(v.front().next_step.find("--instances 2"), std::string::npos) << v.front().next_step;
  EXPECT_GE(v.front().confidence, 0.75);
}

// An image classifier on the CPU under 8 clients, JPEG photos in: the ledger as the doctor read it from a
// served ppocr-mobile-v2-cls (decode + resize of a 12-Mpixel photo per row, a 48x192 CNN): preprocess is the
// request, the instance never idles.
TEST(DoctorRules, ImageModelDecodingLargePhotosIsHostBoundNamingPreprocess) {
  Signals s = Classic(/*queue*/ 280, /*pre*/ 45, /*h2d*/ 0, /*compute*/ 2.5, /*busy*/ 0.99);
  s.stage_s["postprocess"] = 0.05e-3;
  s.host_s += 0.05e-3;
  s.service_s += 0.05e-3;
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "host_bound");
  EXPECT_NE(v.front().summary.find("preprocess"), std::string::npos) << v.front().summary;
  ASSERT_NE(FindEvidence(v.front(), "ledger.host_share"), nullptr);
  EXPECT_GE(FindEvidence(v.front(), "ledger.host_share")->value, 0.9);
  ASSERT_NE(FindEvidence(v.front(), "ledger.preprocess_ms"), nullptr);
  EXPECT_NEAR(FindEvidence(v.front(), "ledger.preprocess_ms")->value, 45, 1e-9);
  EXPECT_EQ(FindEvidence(v.front(), "ledger.postprocess_ms"), nullptr);
  ASSERT_NE(FindEvidence(v.front(), "ledger.device_ms"), nullptr);
  EXPECT_NEAR(FindEvidence(v.front(), "ledger.device_ms")->value, 2.5, 1e-9);
  EXPECT_NE(v.front().next_step.find("--preprocess nvjpeg"), std::string::npos) << v.front().next_step;
  EXPECT_NE(v.front().next_step.find("--instances 2"), std::string::npos) << v.front().next_step;
  // The queue is long (8 clients, one busy instance) but the instance is saturated: the host is the limit.
  for (const Verdict& x : v) EXPECT_NE(x.bottleneck, "queue_bound");
}

// The same model, the same 8 clients, small photos: decoding costs little beside the CNN, which now fills
// the instance. Not host_bound (blind compute_bound: no GPU counters on the CPU).
TEST(DoctorRules, ImageModelWhoseComputeDominatesIsNotHostBound) {
  Signals s = Classic(/*queue*/ 20, /*pre*/ 0.2, /*h2d*/ 0, /*compute*/ 2.5, /*busy*/ 0.99);
  std::vector<Verdict> v = Diagnose(s);
  for (const Verdict& x : v) EXPECT_NE(x.bottleneck, "host_bound");
  EXPECT_EQ(v.front().bottleneck, "compute_bound");
  // On the GPU with the preprocessing moved there: the device stages dominate, the host share is small.
  Signals g = Classic(/*queue*/ 3, /*pre*/ 0.15, /*h2d*/ 0.05, /*compute*/ 1.2, /*busy*/ 0.95);
  g.stage_s["d2h"] = 0.01e-3;
  g.copy_s += 0.01e-3;
  g.service_s += 0.01e-3;
  for (const Verdict& x : Diagnose(g)) EXPECT_NE(x.bottleneck, "host_bound");
}

TEST(DoctorRules, HostShareThatDoesNotMatterIsNotAVerdict) {
  // Preprocess is most of a tiny service time, but the instance idles and it is 2% of the latency.
  Signals s = Classic(/*queue*/ 50, /*pre*/ 0.8, 0, 0.2, /*busy*/ 0.02);
  for (const Verdict& v : Diagnose(s)) EXPECT_NE(v.bottleneck, "host_bound");
}

TEST(DoctorRules, CopyBound) {
  Signals s = Classic(2, 0.1, /*h2d*/ 3, /*compute*/ 1, 0.8);
  EXPECT_EQ(Top(s), "copy_bound");
  EXPECT_NE(Diagnose(s).front().next_step.find("pinned"), std::string::npos);
}

TEST(DoctorRules, QueueBoundOnTheDelayNamesALowerDelay) {
  Signals s = Classic(/*queue*/ 40, 0, 0, /*compute*/ 1, /*busy*/ 0.05);
  s.max_queue_delay_us = 50000;
  s.close_share = {{"delay", 0.9}, {"full", 0.1}};
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "queue_bound");
  EXPECT_NE(v.front().next_step.find("\"max_queue_delay_microseconds\": 1000"), std::string::npos)
      << v.front().next_step;
}

TEST(DoctorRules, QueueWithSaturatedInstancesIsTheModelNotThePolicy) {
  Signals s = Classic(/*queue*/ 40, 0, 0, /*compute*/ 5, /*busy*/ 0.98);
  std::vector<Verdict> v = Diagnose(s);
  EXPECT_EQ(v.front().bottleneck, "compute_bound");  // no GPU counters: blind, lower confidence
  EXPECT_LT(v.front().confidence, 0.5);
}

TEST(DoctorRules, UnderFed) {
  Signals s = Classic(/*queue*/ 0.05, 0, 0, 1, /*busy*/ 0.04);
  EXPECT_EQ(Top(s), "under_fed");
  Signals idle;  // no request at all
  idle.kind = "classic";
  EXPECT_EQ(Top(idle), "under_fed");
}

// The H200's c=512 window of 2026-12-06: 1000-token requests (~30 s each) against a 30 s window, so none
// finished inside it, while the engine stepped 99 % of the time and the GPU was 87 % busy: not idle.
TEST(DoctorRules, NoRequestFinishedWhileTheEngineIsBusyIsNotUnderFed) {
  Signals s;
  s.kind = "llm";
  s.requests = 0;
  s.gpu_util = 0.87;
  s.engine_busy = 0.99;
  s.running_mean = 512;
  for (const Verdict& v : Diagnose(s)) EXPECT_NE(v.bottleneck, "under_fed");
  s.gpu_util = kNaN;  // the engine thread's busy time alone says the same
  for (const Verdict& v : Diagnose(s)) EXPECT_NE(v.bottleneck, "under_fed");
  s.engine_busy = 0.02;  // both idle: under-fed, as before
  EXPECT_EQ(Top(s), "under_fed");
}

// The H200's 8B at c=64, fp8 (bench/results/gpu_served_valid_windows_h200_2026-12-06.json): the engine
// stepped 99.9 % of the time with ~62 sequences a step, ~1 waiting (a closed loop's turnover), KV 7 % used,
// SM active 0.66, tensor 0.21, DRAM 0.38, power-capped a fifth of the window. c=256 then served 1.84x the
// tokens: the load set the batch. Under-fed, with throttling beside it.
TEST(DoctorRules, AnLlmsSmallBatchesOnAGpuWithRoomAreUnderFed) {
  Signals s = Llm(/*requests*/ 448, /*queue*/ 0.135, /*device*/ 8.669, /*host*/ 0.0155, /*kv max*/ 0.07);
  Gpu(&s, /*util*/ 0.99, /*sm*/ 0.66, /*tensor*/ 0.21, /*dram*/ 0.38);
  s.gr_active = 0.99;
  s.engine_busy = 0.999;
  s.running_mean = 61.8;
  s.waiting_mean = 0.97;
  s.power_violation_share = 0.20;
  s.thermal_violation_share = 0;
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].bottleneck, "under_fed");
  EXPECT_TRUE(v[0].next_step.starts_with("send more concurrent requests")) << v[0].next_step;
  ASSERT_NE(FindEvidence(v[0], "llm.running_mean"), nullptr);
  EXPECT_EQ(v[1].bottleneck, "throttled");
  s.waiting_mean = 12;  // a backlog: the server, not the load, sets the batch
  EXPECT_NE(Top(s), "under_fed");
  s.waiting_mean = 0.97;
  s.kv_usage_max = 0.95;  // the cache is what holds the batch down
  EXPECT_NE(Top(s), "under_fed");
  s.kv_usage_max = 0.07;
  s.sm_active = 0.85;  // the GPU is busy: compute-bound, not the load
  EXPECT_NE(Top(s), "under_fed");
  s.sm_active = kNaN;  // no counters: nothing to say about room on the GPU
  s.gr_active = s.gpu_util = s.dram_active = s.tensor_active = kNaN;
  for (const Verdict& x : Diagnose(s)) EXPECT_NE(x.bottleneck, "under_fed");
}

// The 8B shape in bf16 served at c=64 on an H100
// (bench/results/gpu_served_vs_llama_server_h100_2026-12-06.json), two windows of the same load: SM active
// 0.79 and 0.83 put them on either side of sm_high (under_fed, then compute_bound with the tensor pipes at
// 0.18). Each step reads 27.6 GB for 1.94 TFLOP (70 FLOP per byte; at the device's rates 9.2 ms against 2.3
// ms of math): memory-heavy by its model, so both are bandwidth_bound with or without the rates; without the
// step's model the counters alone decide as before.
TEST(DoctorRules, AnLlmStepMemoryHeavyByItsModelIsBandwidthBound) {
  auto window = [](double sm) {
    Signals s = Llm(/*requests*/ 192, /*queue*/ 0.179, /*device*/ 13.32, /*host*/ 0.0002, /*kv max*/ 0.29);
    Gpu(&s, /*util*/ 1.0, sm, /*tensor*/ 0.18, /*dram*/ 0.66);
    s.gr_active = 0.99;
    s.engine_busy = 1.0;
    s.running_mean = 62.2;
    s.waiting_mean = 0.89;
    s.steps = 2947;
    s.step_ms = 13.57;
    s.step_model_ms = 13.54;
    s.step_host_ms = 0.03;
    s.step_weight_bytes = 15.010e9;
    s.step_kv_bytes = 12.626e9;
    s.step_matmul_flops = 1.868e12;
    s.step_attention_flops = 0.068e12;
    return s;
  };
  for (const double sm : {0.79, 0.83}) {
    Signals s = window(sm);
    Signals counters = s;  // no step model: the counters alone
    counters.step_weight_bytes = counters.step_kv_bytes = kNaN;
    counters.step_matmul_flops = counters.step_attention_flops = kNaN;
    EXPECT_EQ(Top(counters), sm < 0.8 ? "under_fed" : "compute_bound") << sm;
    // The step's model without the device's rates: FLOPs per byte.
    Verdict by_intensity = Diagnose(s).front();
    EXPECT_EQ(by_intensity.bottleneck, "bandwidth_bound") << sm;
    const Evidence* fpb = FindEvidence(by_intensity, "step.flop_per_byte");
    ASSERT_NE(fpb, nullptr);
    EXPECT_NEAR(fpb->value, 1.936e12 / 27.636e9, 0.1);
    EXPECT_EQ(FindEvidence(by_intensity, "step.memory_ms"), nullptr);
    ApplyDeviceRates(/*hbm_gbps*/ 3012, /*tensor_tflops*/ 830, &s);
    const Verdict v = Diagnose(s).front();
    EXPECT_EQ(v.bottleneck, "bandwidth_bound") << sm;
    for (const Verdict& x : Diagnose(s)) EXPECT_NE(x.bottleneck, "compute_bound") << sm;
    const Evidence* e = FindEvidence(v, "step.memory_ms");
    ASSERT_NE(e, nullptr);
    EXPECT_NEAR(e->value, 27.636e9 / 3012e9 * 1e3, 0.01);
    EXPECT_NE(v.summary.find("27.6 GB"), std::string::npos) << v.summary;
    // ~62 running and nobody waiting: the clients set the batch.
    EXPECT_NE(v.next_step.find("more concurrent requests (~62 running"), std::string::npos) << v.next_step;
    s.waiting_mean = 20;  // a backlog: the running-set cap holds them back
    EXPECT_NE(Diagnose(s).front().next_step.find("--max-num-seqs 2x"), std::string::npos);
  }
  // The H200 at c=512, fp8 weights + fp8 KV (gpu_served_valid_windows_h200_2026-12-06.json): 8.0 GB of
  // weights + 52.6 GB of KV per step; its 511 decode + 327 prefill tokens through the 6.98 B layer parameters
  // and 511 through the 0.53 B lm_head make 12.2 TFLOP of matmuls (201 FLOP per byte; at the H200's measured
  // 4,235 GB/s and 901 TFLOP/s, gpu_llm_8b_h200_2026-12-02.json: 14.3 ms against 13.5 ms): not memory-heavy,
  // so busy SMs still read as compute.
  Signals s = window(0.9);
  s.step_weight_bytes = 8.03e9;
  s.step_kv_bytes = 52.61e9;
  s.step_matmul_flops = 12.2e12;
  s.step_attention_flops = kNaN;
  s.waiting_mean = 3.4;
  s.running_mean = 507;
  EXPECT_EQ(Top(s), "compute_bound");  // by FLOPs per byte
  ApplyDeviceRates(4235, 901, &s);
  EXPECT_EQ(Top(s), "compute_bound");  // at the device's rates
}

// Sparse traffic against a model with a batching delay (the H200's "sparse" scenario: 10 req/s, 500 us
// delay): each lone request waits the delay out, so the queue is 35 % of a short latency; still under-fed.
TEST(DoctorRules, UnderFedWhileLoneRequestsWaitOutTheBatchingDelay) {
  Signals s = Classic(/*queue*/ 0.64, 0, 0, /*compute*/ 1.2, /*busy*/ 0.005);
  s.max_batch_size = 8;
  s.max_queue_delay_us = 500;
  s.mean_batch_size = 1.0;
  s.close_share = {{"delay", 1.0}};
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "under_fed");
  EXPECT_NE(v.front().next_step.find("\"max_queue_delay_microseconds\": 0"), std::string::npos)
      << v.front().next_step;
  // The queue-share evidence names the threshold it was judged against (queue_share, not idle_queue_share).
  for (const Evidence& e : v.front().evidence) {
    if (e.signal == "ledger.queue_share") {
      EXPECT_EQ(e.threshold, Thresholds{}.queue_share);
    }
  }
  // Batches that fill (or close for another reason) with the same queue share: not explained by the delay.
  s.close_share = {{"full", 1.0}};
  s.mean_batch_size = 8;
  EXPECT_NE(Diagnose(s).front().bottleneck, "under_fed");
  // A queue that dominates is the policy's: queue_bound, as before.
  Signals q = Classic(/*queue*/ 40, 0, 0, 1, /*busy*/ 0.005);
  q.max_batch_size = 64;
  q.max_queue_delay_us = 30000;
  q.mean_batch_size = 2;
  q.close_share = {{"delay", 1.0}};
  EXPECT_EQ(Diagnose(q).front().bottleneck, "queue_bound");
}

TEST(DoctorRules, LaunchBoundWhenGpuUtilLiesAboutSmActivity) {
  Signals s = Classic(5, 0.1, 0.1, /*compute*/ 5, 0.9);
  s.gpu_samples = 5;
  s.gpu_util = 0.99;
  s.gr_active = 0.98;
  s.sm_active = 0.02;
  s.dram_active = 0.01;
  s.tensor_active = 0;
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "launch_bound");
  EXPECT_EQ(v.front().evidence[1].signal, "gpu.sm_active");
  EXPECT_EQ(v.front().evidence[1].op, "<");
  s.kind = "llm";
  s.instance_busy = kNaN;
  EXPECT_NE(Diagnose(s).front().next_step.find("--cuda-graphs on"), std::string::npos);
}

TEST(DoctorRules, BandwidthAndComputeBound) {
  Signals s = Classic(5, 0.1, 0.1, 5, 0.9);
  s.gpu_samples = 5;
  s.gpu_util = 1;
  s.gr_active = 0.99;
  s.sm_active = 0.6;
  s.dram_active = 0.78;
  s.instances = 2;
  EXPECT_EQ(Top(s), "bandwidth_bound");
  EXPECT_NE(Diagnose(s).front().next_step.find("--instances 1"), std::string::npos);
  s.dram_active = 0.2;
  s.sm_active = 0.95;
  s.tensor_active = 0.85;
  EXPECT_EQ(Top(s), "compute_bound");
  EXPECT_GE(Diagnose(s).front().confidence, 0.75);
}

TEST(DoctorRules, GpuRulesWaitForTheDeviceToDominate) {
  // Same counters, but preprocess dominates: the host is the bottleneck, whatever the GPU reads.
  Signals s = Classic(5, /*pre*/ 8, 0.1, 1, 0.95);
  s.gpu_samples = 5;
  s.gpu_util = 0.99;
  s.sm_active = 0.02;
  EXPECT_EQ(Top(s), "host_bound");
}

TEST(DoctorRules, KvCapacityBound) {
  Signals s = Llm(/*requests*/ 40, /*queue*/ 2.0, /*device*/ 1.0, /*host*/ 0, /*kv max*/ 0.97);
  s.kv_blocks_total = 64;
  s.preemptions = 12;
  s.running_mean = 4;
  s.admission_share = {{"no_blocks", 0.6}, {"queue_empty", 0.4}};
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.front().bottleneck, "kv_capacity_bound");
  EXPECT_NE(v.front().next_step.find("--kv-blocks 128"), std::string::npos) << v.front().next_step;
  EXPECT_GE(v.front().confidence, 0.75);
  // On a GPU whose memory is allocated (the H200 at c=1024, fp8 KV: FB used 0.89 at the default fraction):
  // no --kv-blocks 2x, but fewer sequences; and fp8 where the cache is not 8-bit yet.
  s.fb_used_ratio = 0.89;
  s.kv_cache_dtype = "fp8";
  std::string next = Diagnose(s).front().next_step;
  EXPECT_TRUE(next.starts_with("--max-num-seqs 3 (the GPU's memory is 89% allocated")) << next;
  EXPECT_EQ(next.find("--kv-blocks 128"), std::string::npos) << next;
  s.kv_cache_dtype = "bf16";
  next = Diagnose(s).front().next_step;
  EXPECT_TRUE(next.starts_with("--kv-cache-dtype fp8 (now bf16)")) << next;
  EXPECT_NE(next.find("; --max-num-seqs 3"), std::string::npos) << next;
  ASSERT_NE(FindEvidence(Diagnose(s).front(), "gpu.fb_used_ratio"), nullptr);
  s.fb_used_ratio = 0.3;  // room on the GPU: more blocks, as before
  EXPECT_NE(Diagnose(s).front().next_step.find("--kv-blocks 128"), std::string::npos);
  s.fb_used_ratio = kNaN;
  s.kv_cache_dtype = "";
  s.preemptions = 0;  // full but nobody waits for blocks: not capacity-bound
  s.admission_share = {{"queue_empty", 1.0}};
  for (const Verdict& x : Diagnose(s)) EXPECT_NE(x.bottleneck, "kv_capacity_bound");
}

TEST(DoctorRules, ThrottledComesAlongsideTheMainVerdict) {
  Signals s = Classic(5, 0.1, 0.1, 5, 0.9);
  s.gpu_samples = 5;
  s.gpu_util = 1;
  s.sm_active = 0.95;
  s.tensor_active = 0.9;
  s.dram_active = 0.2;
  s.power_violation_share = 0.6;
  s.thermal_violation_share = 0;
  s.clock_reason_share = {{"sw_power_cap", 1.0}};
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].bottleneck, "compute_bound");
  EXPECT_EQ(v[1].bottleneck, "throttled");
  // The reason bit alone, with a counter that does not move, is not throttling.
  s.power_violation_share = 0;
  for (const Verdict& x : Diagnose(s)) EXPECT_NE(x.bottleneck, "throttled");
  // Without the counters, the reason bits decide.
  s.power_violation_share = kNaN;
  s.thermal_violation_share = kNaN;
  EXPECT_EQ(Diagnose(s).back().bottleneck, "throttled");
}

TEST(DoctorRules, TheIssuesH200ReadingIsComputeBoundAndThrottled) {
  // Issue 12: the 8B shape at c=64 read GPU-Util 98 %, SM active 0.93, tensor 0.58, DRAM 0.21, 686 of 700 W
  // with the power-violation counter rising.
  Signals s = Llm(/*requests*/ 500, /*queue*/ 0.05, /*device*/ 2.0, /*host*/ 0.02, /*kv max*/ 0.4);
  Gpu(&s, /*util*/ 0.98, /*sm*/ 0.93, /*tensor*/ 0.58, /*dram*/ 0.21);
  s.power_w = 686;
  s.power_limit_w = 700;
  s.power_violation_share = 0.8;
  s.thermal_violation_share = 0;
  s.clock_reason_share = {{"sw_power_cap", 1.0}};
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].bottleneck, "compute_bound");
  EXPECT_EQ(v[1].bottleneck, "throttled");
}

TEST(DoctorRules, TheKernelSplitNamesWhatToShrink) {
  // The 8B shape at c=512 on an H100 (bench/results/gpu_served_kernel_split_h100_2026-12-05.json): SM active
  // 0.89, tensor 0.36, DRAM 0.46; the trace put 52 % of the kernel time in attention, 36 % in GEMMs.
  Signals s = Llm(/*requests*/ 219, /*queue*/ 0.02, /*device*/ 49.2, /*host*/ 0.004, /*kv max*/ 0.5);
  s.running_max = 512;
  Gpu(&s, /*util*/ 0.95, /*sm*/ 0.89, /*tensor*/ 0.36, /*dram*/ 0.46);
  EXPECT_EQ(Top(s), "compute_bound");
  const std::string plain = Diagnose(s).front().next_step;  // no trace: the generic advice
  EXPECT_EQ(plain.find("--kv-cache-dtype"), std::string::npos) << plain;

  s.trace.taken = s.trace.gpu_timeline = true;
  s.trace.attention_share = 0.52;
  s.trace.matmul_share = 0.36;
  s.trace.other_share = 0.12;
  s.trace.top_kernels = {{"DecodeFragKernel<128, true>", "attention", 0.5, 29213, 1523}};
  s.kv_cache_dtype = "bf16";
  Verdict v = Diagnose(s).front();
  EXPECT_EQ(v.bottleneck, "compute_bound");
  EXPECT_TRUE(v.next_step.starts_with("--kv-cache-dtype fp8 (now bf16): attention over the KV cache is 52%"))
      << v.next_step;
  bool cited = false;
  for (const Evidence& e : v.evidence) cited |= e.signal == "trace.attention_share";
  EXPECT_TRUE(cited);

  s.kv_cache_dtype = "fp8";  // 8-bit already: fewer sequences per step is what is left
  v = Diagnose(s).front();
  EXPECT_NE(v.next_step.find("--max-num-seqs 256 (now 512)"), std::string::npos) << v.next_step;

  s.trace.attention_share = 0.2;  // GEMM-heavy with bf16 weights: fp8 weights
  s.trace.matmul_share = 0.65;
  s.weight_quantization = "none";
  v = Diagnose(s).front();
  EXPECT_TRUE(v.next_step.starts_with("--quantization fp8: the matmuls are 65%")) << v.next_step;
  s.weight_quantization = "fp8";  // quantised already: back to the generic advice
  EXPECT_EQ(Diagnose(s).front().next_step, plain);
}

TEST(DoctorRules, AnLlmsPostprocessNamesAsyncOutputUnlessItIsOn) {
  Signals s;
  s.kind = "llm";
  s.requests = 100;
  s.stage_s = {{"queue", 0.0}, {"decode", 0.01}, {"postprocess", 0.03}};
  s.host_s = 0.03;
  s.device_s = 0.01;
  s.service_s = 0.04;
  s.latency_s = 0.041;
  s.io_s = s.copy_s = s.queue_s = 0;
  Verdict v = Diagnose(s).front();
  EXPECT_EQ(v.bottleneck, "host_bound");
  EXPECT_TRUE(v.next_step.starts_with("--async-output on")) << v.next_step;
  s.step_output_ms = 0.4;  // on already: sampling is what is left to move
  v = Diagnose(s).front();
  EXPECT_TRUE(v.next_step.starts_with("--sampling device")) << v.next_step;
  s.step_output_ms = kNaN;
  s.device = "cpu";  // a CPU model (its /v1/models "device"): no GPU-only knob
  v = Diagnose(s).front();
  EXPECT_EQ(v.bottleneck, "host_bound");
  EXPECT_EQ(v.next_step.find("--async-output on"), std::string::npos) << v.next_step;
  EXPECT_EQ(v.next_step.find("--sampling device"), std::string::npos) << v.next_step;
  EXPECT_TRUE(v.next_step.starts_with("--device cuda")) << v.next_step;
}

TEST(DoctorRules, AnLlmsHostGapBetweenStepsNamesAsyncOutput) {
  // The served 8B at c=512 on an H100 (gpu_served_fp8_c512_h100_2026-12-05.json): steps of 44.9 ms, of which
  // 2.5 ms on the host with the GPU idle.
  Signals s = Llm(/*requests*/ 396, /*queue*/ 0.02, /*device*/ 44.0, /*host*/ 0.004, /*kv max*/ 0.5);
  Gpu(&s, /*util*/ 0.95, /*sm*/ 0.89, /*tensor*/ 0.36, /*dram*/ 0.46);
  s.steps = 1500;
  s.step_ms = 44.9;
  s.step_model_ms = 42.4;
  s.step_host_ms = 2.5;
  auto cites = [](const Verdict& v) {
    for (const Evidence& e : v.evidence) {
      if (e.signal == "step.host_share") return true;
    }
    return false;
  };
  Verdict v = Diagnose(s).front();
  EXPECT_EQ(v.bottleneck, "compute_bound");
  EXPECT_NE(v.next_step.find("; then --async-output on: the host's 2.50 ms of each 44.90 ms step"),
            std::string::npos)
      << v.next_step;
  EXPECT_TRUE(cites(v));

  s.device = "cpu";  // the same split from a CPU model: the share is cited, the GPU-only knob is not named
  v = Diagnose(s).front();
  EXPECT_EQ(v.next_step.find("--async-output"), std::string::npos) << v.next_step;
  EXPECT_TRUE(cites(v));
  s.device = "cuda:0 (NVIDIA H100 80GB HBM3)";

  s.step_output_ms = 1.9;  // async output on already: the share is cited, no knob to turn
  s.step_host_ms = 1.5;
  v = Diagnose(s).front();
  EXPECT_EQ(v.next_step.find("--async-output"), std::string::npos) << v.next_step;
  EXPECT_TRUE(cites(v));

  s.step_output_ms = kNaN;  // a host share under 3 %: not worth a word
  s.step_host_ms = 1.0;
  v = Diagnose(s).front();
  EXPECT_EQ(v.next_step.find("--async-output"), std::string::npos) << v.next_step;
  EXPECT_FALSE(cites(v));
}

TEST(DoctorRules, SmallKernelsCaseIsLaunchBound) {
  // examples/synthetic/small_kernels.json on the H200: GPU-Util ~100 % while one block runs on 1 of 132 SMs.
  Signals s = Classic(1, 0.01, 0.01, 13.5, 0.95);
  s.gpu_samples = 5;
  s.gpu_util = 1.0;
  s.gr_active = 1.0;
  s.sm_active = 1.0 / 132;
  s.dram_active = 0.0;
  s.tensor_active = 0.0;
  EXPECT_EQ(Top(s), "launch_bound");
}

TEST(DoctorRules, BatchOneDecodeStreamsMemory) {
  // The 8B shape at c=1 on the H200 (bench/results/gpu_doctor_scenarios_h200_2026-12-03.json): decode 609 of
  // 620 ms per request, GPU-Util 0.95, SM active 0.73, tensor 0.00, DRAM 0.60 (77 % of the HBM roofline by
  // `stoke bench step`). Below dram_high, yet memory-bound: the streaming rule names it.
  Signals s;
  s.kind = "llm";
  s.requests = 26;
  s.stage_s = {{"prefill", 0.0115}, {"decode", 0.609}, {"postprocess", 0.0012}};
  s.device_s = 0.6205;
  s.host_s = 0.0017;
  s.queue_s = s.io_s = s.copy_s = 0;
  s.service_s = 0.6222;
  s.latency_s = 0.6225;
  s.kv_usage_max = 0.0;
  s.gpu_samples = 30;
  s.gpu_util = 0.95;
  s.gr_active = 0.91;
  s.sm_active = 0.73;
  s.tensor_active = 0.0;
  s.dram_active = 0.60;
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].bottleneck, "bandwidth_bound");
  EXPECT_NE(v[0].next_step.find("--max-num-seqs"), std::string::npos) << v[0].next_step;
  // The same reading with the tensor cores busy is not streaming work.
  s.tensor_active = 0.3;
  EXPECT_NE(Diagnose(s).front().bottleneck, "bandwidth_bound");
}

TEST(DoctorRules, NoneWhenBusyAndBalanced) {
  Signals s = Classic(/*queue*/ 1, 0.5, 0.2, 4, 0.6);
  std::vector<Verdict> v = Diagnose(s);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].bottleneck, "none");
}

TEST(DoctorRules, UnknownSignalsNeverFireAndNamesStayInTheVocabulary) {
  Signals s;  // everything NaN, no requests, kind unknown
  s.requests = 5;
  for (const Verdict& v : Diagnose(s)) {
    bool known = false;
    for (const char* b : kBottlenecks) known |= v.bottleneck == b;
    EXPECT_TRUE(known) << v.bottleneck;
    EXPECT_NE(v.bottleneck, "unknown");
  }
}

TEST(DoctorRules, FewRequestsLowerTheConfidence) {
  Signals s = Classic(20, 8, 0.1, 1, 0.95);
  const double many = Diagnose(s).front().confidence;
  s.requests = 5;
  EXPECT_LT(Diagnose(s).front().confidence, many);
}

}  // namespace
}  // namespace stoke::doctor
