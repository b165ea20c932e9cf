// ExtractTraceSignals on recorded traces (tests/fixtures: CUPTI records from the H200, a CPU server's trace)
// and on constructed ones: counts of kernels, copies, requests, batches and gaps.
#include "tools/doctor/trace_signals.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "base/file_util.h"
#include "tools/doctor/rules.h"

namespace stoke::doctor {
namespace {

std::string Fixture(const std::string& name) {
  StatusOr<std::string> text = ReadFileToString(std::string(STOKE_SOURCE_DIR) + "/tests/fixtures/" + name);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? *text : std::string();
}

// A standalone program's CUPTI records on the H200: 2 HtoD copies, 10 kernels, a memset, a DtoH, on one
// stream; no requests (it is not a server).
TEST(DoctorTraceSignals, RecordedCuptiTraceCountsKernelsCopiesAndGaps) {
  StatusOr<TraceSignals> t = ExtractTraceSignals(Fixture("trace_cupti_h200.json"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->taken);
  EXPECT_TRUE(t->gpu_timeline);
  EXPECT_TRUE(t->note.empty());
  EXPECT_EQ(t->kernels, 10);
  EXPECT_EQ(t->copies, 4);
  EXPECT_EQ(t->requests, 0);
  EXPECT_FALSE(Has(t->kernels_per_request));
  EXPECT_NEAR(t->mean_kernel_us, 3.4916, 1e-3);
  EXPECT_EQ(t->gaps, 13);  // 14 records back to back on one stream, none overlapping
  EXPECT_NEAR(t->largest_gap_us, 2741.283, 1e-2);
  EXPECT_NEAR(t->gap_mean_us, 223.798, 1e-2);
  EXPECT_NEAR(t->seconds, 0.019327805, 1e-9);
  EXPECT_EQ(t->dropped, 0);
}

// Two engine steps of `stoke serve` (8B shape, fp8 KV, c=512) on an H100 and the CUPTI records inside them
// (mangled names, as CUPTI gives them): the kernel time by kind and the largest kernels.
TEST(DoctorTraceSignals, RecordedServedStepsSplitKernelTimeByKind) {
  StatusOr<TraceSignals> t = ExtractTraceSignals(Fixture("trace_served_8b_h100_c512.json"));
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_TRUE(t->gpu_timeline);
  EXPECT_EQ(t->batches, 2);
  EXPECT_EQ(t->kernels, 686);
  // nvjet (cuBLASLt) kernels are 44.2 % of the kernel time (counted from the file by name).
  EXPECT_NEAR(t->matmul_share, 0.442, 0.001);
  EXPECT_NEAR(t->attention_share + t->matmul_share + t->other_share, 1.0, 1e-9);
  ASSERT_FALSE(t->top_kernels.empty());
  EXPECT_EQ(t->top_kernels[0].name, "DecodeFragKernel<128, true>");
  EXPECT_EQ(t->top_kernels[0].kind, "attention");
  EXPECT_EQ(t->top_kernels[1].name, "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT");
  EXPECT_EQ(t->top_kernels[1].kind, "matmul");
  EXPECT_NEAR(t->top_kernels[1].share, 0.3517, 0.001);
  EXPECT_GT(t->top_kernels[0].share, t->top_kernels[1].share);
  EXPECT_GT(t->attention_share, t->top_kernels[0].share);  // the split merge and the prefill kernel too
  EXPECT_NEAR(t->top_kernels[0].us_per_batch * 2, t->top_kernels[0].share * t->mean_kernel_us * t->kernels,
              1.0);
  for (size_t i = 1; i < t->top_kernels.size(); ++i)
    EXPECT_LE(t->top_kernels[i].share, t->top_kernels[i - 1].share);
}

// A trace of `stoke serve` with a synthetic model on the CPU (recorded with stoke trace while stoke bench
// drove it): requests and batches, no kernel records; the server said why in otherData.kernel_track.
TEST(DoctorTraceSignals, RecordedCpuTraceSaysThereIsNoGpuTimeline) {
  const std::string text = Fixture("trace_cpu_synthetic.json");
  StatusOr<TraceSignals> t = ExtractTraceSignals(text);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->taken);
  EXPECT_FALSE(t->gpu_timeline);
  EXPECT_EQ(t->kernels, 0);
  EXPECT_GT(t->requests, 0);
  EXPECT_GT(t->batches, 0);
  EXPECT_LE(t->batches, t->requests);
  EXPECT_TRUE(t->note.starts_with("no GPU timeline (CPU model or no CUPTI)")) << t->note;
  EXPECT_FALSE(Has(t->mean_kernel_us));
  EXPECT_FALSE(Has(t->kernels_per_request));
}

// A server's trace as telemetry/trace.cc writes it: `requests` request spans, `batches` batches, and per
// batch `per_batch` kernels of 3 us 2 us apart on GPU 0 (plus a copy), a GPU 1 with fewer kernels and an
// NVML counter track that is not GPU work.
std::string ServerTrace(int requests, int batches, int per_batch) {
  std::string ev = R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"requests"}},
    {"name":"process_name","ph":"M","pid":2,"tid":0,"args":{"name":"batcher m"}},
    {"name":"thread_name","ph":"M","pid":2,"tid":1,"args":{"name":"instance 0"}},
    {"name":"process_name","ph":"M","pid":3,"tid":0,"args":{"name":"GPU 0"}},
    {"name":"thread_name","ph":"M","pid":3,"tid":1,"args":{"name":"stream 7"}},
    {"name":"thread_name","ph":"M","pid":3,"tid":2,"args":{"name":"counters"}},
    {"name":"process_name","ph":"M","pid":4,"tid":0,"args":{"name":"GPU 1"}},
    {"name":"thread_name","ph":"M","pid":4,"tid":1,"args":{"name":"stream 9"}},
    {"name":"SM active","ph":"C","ts":1,"pid":3,"tid":2,"args":{"value":0.1}},
    {"name":"power","ph":"X","ts":1,"dur":5,"pid":3,"tid":2,"args":{}})";
  for (int r = 0; r < requests; ++r) {
    ev += fmt::format(
        R"(,{{"name":"kserve_http","ph":"X","ts":{},"dur":900,"pid":1,"tid":{},)"
        R"("args":{{"id":"r{}"}}}},{{"name":"queue","ph":"X","ts":{},"dur":10,"pid":1,"tid":{}}})",
        10 + r, 10 + r, r, 10 + r, 10 + r);
  }
  double ts = 100;
  for (int b = 0; b < batches; ++b) {
    ev += fmt::format(R"(,{{"name":"batch","ph":"X","ts":{},"dur":800,"pid":2,"tid":1,"args":{{"rows":4}}}})",
                      ts);
    ev += fmt::format(R"(,{{"name":"compute","ph":"X","ts":{},"dur":700,"pid":2,"tid":1}})", ts);
    ev += fmt::format(R"(,{{"name":"memcpy HtoD","ph":"X","ts":{},"dur":3,"pid":3,"tid":1,)"
                      R"("args":{{"bytes":256,"src":"pinned","dst":"device"}}}})",
                      ts);
    ts += 5;
    for (int k = 0; k < per_batch; ++k, ts += 5) {
      ev += fmt::format(R"(,{{"name":"one_block","ph":"X","ts":{},"dur":3,"pid":3,"tid":1,)"
                        R"("args":{{"grid":"1x1x1","block":"32x1x1"}}}})",
                        ts);
    }
    ev += fmt::format(
        R"(,{{"name":"k","ph":"X","ts":{},"dur":50,"pid":4,"tid":1,"args":{{"grid":"8x1x1"}}}})", ts);
    ts += 1000;
  }
  return R"({"traceEvents":[)" + ev +
         R"j(],"otherData":{"window_us":2000000,"kernel_track":"cupti (libcupti.so.13)"}})j";
}

TEST(DoctorTraceSignals, KernelsPerRequestAndBatchOnTheBusiestGpu) {
  StatusOr<TraceSignals> t =
      ExtractTraceSignals(ServerTrace(/*requests=*/8, /*batches=*/2, /*per_batch=*/200));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->gpu_timeline);
  EXPECT_EQ(t->kernels, 400);  // GPU 0's; GPU 1 ran 2
  EXPECT_EQ(t->copies, 2);
  EXPECT_EQ(t->requests, 8);
  EXPECT_EQ(t->batches, 2);
  EXPECT_DOUBLE_EQ(t->kernels_per_request, 50);
  EXPECT_DOUBLE_EQ(t->kernels_per_batch, 200);
  EXPECT_DOUBLE_EQ(t->mean_kernel_us, 3);
  // Per batch: copy, then 200 kernels, each 2 us after the previous one's end: 200 gaps; and one between
  // the batches.
  EXPECT_EQ(t->gaps, 2 * 200 + 1);
  EXPECT_DOUBLE_EQ(t->seconds, 2.0);
}

TEST(DoctorTraceSignals, NotATraceIsAnError) {
  EXPECT_FALSE(ExtractTraceSignals("{}").ok());
  EXPECT_FALSE(ExtractTraceSignals("not json").ok());
}

// Without GPM counters (no SM activity), the trace alone says launch_bound: many launch-sized kernels per
// request, the device stages dominating.
TEST(DoctorTraceSignals, TraceAloneFiresLaunchBoundWithoutSmCounters) {
  Signals s;
  s.kind = "classic";
  s.requests = 100;
  s.device_s = 0.9e-3;
  s.service_s = 1e-3;
  s.latency_s = 1.2e-3;
  s.queue_s = 0.1e-3;
  s.instance_busy = 0.95;
  StatusOr<TraceSignals> t = ExtractTraceSignals(ServerTrace(8, 2, 200));
  ASSERT_TRUE(t.ok());
  s.trace = *t;
  const std::vector<Verdict> v = Diagnose(s, Thresholds{});
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].bottleneck, "launch_bound");
  EXPECT_LT(v[0].confidence, 0.75);  // inferred from kernel sizes, not seen on the SMs
  bool kernel_evidence = false;
  for (const Evidence& e : v[0].evidence) kernel_evidence |= e.signal == "trace.mean_kernel_us";
  EXPECT_TRUE(kernel_evidence);

  // Few kernels per request: not launch-bound by the trace.
  s.trace = *ExtractTraceSignals(ServerTrace(8, 2, 20));
  for (const Verdict& x : Diagnose(s, Thresholds{})) EXPECT_NE(x.bottleneck, "launch_bound");
  // A CPU trace (no kernels) never fires it.
  s.trace = *ExtractTraceSignals(Fixture("trace_cpu_synthetic.json"));
  for (const Verdict& x : Diagnose(s, Thresholds{})) EXPECT_NE(x.bottleneck, "launch_bound");
}

}  // namespace
}  // namespace stoke::doctor

namespace stoke::doctor {
namespace {

// No CUPTI: the engine's steps timed by CUDA events ("gpu step" on "gpu (cuda events)") give the busy share
// and the gaps; a "gpu step" on another thread (not the event track) is not counted.
TEST(DoctorTraceSignals, CudaEventStepsGiveBusyAndGapsWithoutKernels) {
  const std::string text = R"J({"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "engine m"}},
    {"ph": "M", "name": "thread_name", "pid": 3, "tid": 1, "args": {"name": "llm loop"}},
    {"ph": "M", "name": "thread_name", "pid": 3, "tid": 2, "args": {"name": "gpu (cuda events)"}},
    {"ph": "X", "pid": 3, "tid": 1, "name": "step (decode)", "ts": 100, "dur": 12},
    {"ph": "X", "pid": 3, "tid": 1, "name": "step (decode)", "ts": 120, "dur": 12},
    {"ph": "X", "pid": 3, "tid": 1, "name": "step (decode)", "ts": 140, "dur": 12},
    {"ph": "X", "pid": 3, "tid": 2, "name": "gpu step", "ts": 102, "dur": 10},
    {"ph": "X", "pid": 3, "tid": 2, "name": "gpu step", "ts": 122, "dur": 10},
    {"ph": "X", "pid": 3, "tid": 2, "name": "gpu step", "ts": 146, "dur": 6},
    {"ph": "X", "pid": 3, "tid": 1, "name": "gpu step", "ts": 400, "dur": 6}],
    "otherData": {"kernel_track": "off: libcupti not found"}})J";
  StatusOr<TraceSignals> t = ExtractTraceSignals(text);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FALSE(t->gpu_timeline);
  EXPECT_TRUE(t->gpu_events);
  EXPECT_EQ(t->kernels, 0);
  EXPECT_EQ(t->batches, 3);
  EXPECT_EQ(t->gaps, 2);                 // 112 -> 122 and 132 -> 146
  EXPECT_NEAR(t->gap_mean_us, 12, 1e-9);  // (10 + 14) / 2
  EXPECT_NEAR(t->largest_gap_us, 14, 1e-9);
  EXPECT_NEAR(t->busy_share, 26.0 / 50.0, 1e-9);  // 10 + 10 + 6 busy of 102 -> 152
  EXPECT_NE(t->note.find("CUDA events around 3 engine steps"), std::string::npos) << t->note;
  EXPECT_NE(t->note.find("libcupti not found"), std::string::npos) << t->note;
}

}  // namespace
}  // namespace stoke::doctor
