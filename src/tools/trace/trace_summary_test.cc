#include "tools/trace/trace_summary.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

constexpr const char* kTrace = R"({"traceEvents":[
 {"name":"process_name","ph":"M","ts":0,"pid":1,"tid":0,"args":{"name":"requests"}},
 {"name":"thread_name","ph":"M","ts":0,"pid":1,"tid":1,"args":{"name":"r1 #1"}},
 {"name":"process_name","ph":"M","ts":0,"pid":2,"tid":0,"args":{"name":"GPU 0"}},
 {"name":"thread_name","ph":"M","ts":0,"pid":2,"tid":2,"args":{"name":"stream 7"}},
 {"name":"thread_name","ph":"M","ts":0,"pid":2,"tid":3,"args":{"name":"counters"}},
 {"name":"POST /v2","ph":"X","ts":0,"dur":10,"pid":1,"tid":1,"args":{"id":"r1"}},
 {"name":"queue","ph":"X","ts":0,"dur":10,"pid":1,"tid":1,"args":{}},
 {"name":"gemm","ph":"X","ts":100,"dur":50,"pid":2,"tid":2,"args":{}},
 {"name":"gemm","ph":"X","ts":120,"dur":50,"pid":2,"tid":2,"args":{}},
 {"name":"norm","ph":"X","ts":1300,"dur":100,"pid":2,"tid":2,"args":{}},
 {"name":"SM active","ph":"C","ts":0,"pid":2,"tid":0,"args":{"value":0.5}}],
 "displayTimeUnit":"ms","otherData":{"dropped_events":3,"kernel_track":"cupti"}})";

TEST(TraceSummaryTest, CountsAndGpuIdleGaps) {
  auto s = SummarizeTrace(kTrace);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->events, 11);
  EXPECT_EQ(s->tracks, 3);
  EXPECT_EQ(s->dropped, 3);
  EXPECT_EQ(s->requests, 1);
  EXPECT_EQ(s->counters, 1);
  EXPECT_EQ(s->spans_per_process.at("requests"), 2);
  const GpuIdle& g = s->gpu.at("GPU 0");
  EXPECT_EQ(g.records, 3);
  EXPECT_DOUBLE_EQ(g.span_us, 1300);  // 100 -> 1400
  EXPECT_DOUBLE_EQ(g.busy_us, 170);   // [100,170) + [1300,1400)
  EXPECT_EQ(g.gaps, 1);
  EXPECT_EQ(g.gaps_over_1ms, 1);
  EXPECT_DOUBLE_EQ(g.largest_gap_us, 1130);
  EXPECT_NE(FormatTraceSummary(*s).find("1 idle gaps"), std::string::npos);
}

TEST(TraceSummaryTest, KernelTimeByShortNameAndPerStep) {
  constexpr const char* kSteps = R"J({"traceEvents":[
 {"name":"process_name","ph":"M","ts":0,"pid":1,"tid":0,"args":{"name":"engine llama"}},
 {"name":"thread_name","ph":"M","ts":0,"pid":1,"tid":1,"args":{"name":"llm loop"}},
 {"name":"process_name","ph":"M","ts":0,"pid":2,"tid":0,"args":{"name":"GPU 0"}},
 {"name":"thread_name","ph":"M","ts":0,"pid":2,"tid":2,"args":{"name":"stream 7"}},
 {"name":"step (decode)","ph":"X","ts":0,"dur":1000,"pid":1,"tid":1,"args":{"prefill_tokens":0,"decode_tokens":8}},
 {"name":"step (mixed)","ph":"X","ts":1000,"dur":3000,"pid":1,"tid":1,"args":{"prefill_tokens":100,"decode_tokens":8}},
 {"name":"_ZN5stoke4cuda12_GLOBAL__N_116DecodeFragKernelILi128ELb1EEEvPK13__nv_bfloat16PKiiS7_","ph":"X","ts":10,"dur":300,"pid":2,"tid":2,"args":{}},
 {"name":"void stoke::cuda::(anonymous namespace)::DecodeFragKernel<128, true>(const __nv_bfloat16*)","ph":"X","ts":1010,"dur":500,"pid":2,"tid":2,"args":{}},
 {"name":"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN","ph":"X","ts":400,"dur":200,"pid":2,"tid":2,"args":{}},
 {"name":"step (decode)","ph":"X","ts":9000,"dur":5,"pid":2,"tid":2,"args":{}}]})J";
  auto s = SummarizeTrace(kSteps);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->steps.steps, 2);  // the GPU span named like a step is not an engine step
  EXPECT_DOUBLE_EQ(s->steps.total_us, 4000);
  EXPECT_EQ(s->steps.prefill_tokens, 100);
  EXPECT_EQ(s->steps.decode_tokens, 16);
  ASSERT_EQ(s->kernels.size(), 3u);
  EXPECT_EQ(s->kernels[0].name, "DecodeFragKernel<128, true>");  // mangled and demangled forms merge
  EXPECT_EQ(s->kernels[0].count, 2);
  EXPECT_DOUBLE_EQ(s->kernels[0].total_us, 800);
  EXPECT_EQ(s->kernels[1].name, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN");
  const std::string text = FormatTraceSummary(*s);
  EXPECT_NE(text.find("engine steps: 2, 2.00 ms each"), std::string::npos) << text;
  EXPECT_NE(text.find("0.400 ms/step"), std::string::npos) << text;  // 800 us over 2 steps
  EXPECT_NE(text.find("by kind: attention 79.6%, matmul 19.9%, other 0.5%, copy 0.0%"), std::string::npos)
      << text;
}

TEST(TraceSummaryTest, KernelShortNames) {
  EXPECT_EQ(KernelShortName("void stoke::cuda::RmsNormKernel<256>(float const*, int)"), "RmsNormKernel<256>");
  EXPECT_EQ(KernelShortName("void f<stoke::cuda::DevicePagedKvQuant>(int)"), "f<DevicePagedKvQuant>");
  EXPECT_EQ(KernelShortName("memcpy HtoD"), "memcpy HtoD");
  EXPECT_EQ(KernelShortName("_Znot_a_valid_mangling"), "_Znot_a_valid_mangling");
}

TEST(TraceSummaryTest, KernelKinds) {
  // The kernels of a served 8B step (bench/results/gpu_served_kernel_split_h100_2026-12-05.json).
  EXPECT_EQ(KernelKind("DecodeFragKernel<128, true>"), "attention");
  EXPECT_EQ(KernelKind("DecodeReduceKernel<__nv_bfloat16>"), "attention");
  EXPECT_EQ(KernelKind("FlashPrefillKernel<128, 4, false, 1, 2>"), "attention");
  EXPECT_EQ(KernelKind("EncoderAttentionTiledKernel<64>"), "attention");
  EXPECT_EQ(KernelKind("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_TNT"), "matmul");
  EXPECT_EQ(KernelKind("Bf16GemvKernel<4>"), "matmul");
  EXPECT_EQ(KernelKind("SiluMulFusedKernel<__nv_bfloat16>"), "other");
  EXPECT_EQ(KernelKind("QuantizeRowsKernel"), "other");
  EXPECT_EQ(KernelKind("memcpy HtoD"), "copy");
}

TEST(TraceSummaryTest, RefusesWhatIsNotATrace) {
  EXPECT_FALSE(SummarizeTrace("[1,2]").ok());
  EXPECT_FALSE(SummarizeTrace("{\"traceEvents\": 3}").ok());
  EXPECT_FALSE(SummarizeTrace("not json").ok());
}

}  // namespace
}  // namespace stoke
