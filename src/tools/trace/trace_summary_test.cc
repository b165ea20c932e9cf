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

TEST(TraceSummaryTest, RefusesWhatIsNotATrace) {
  EXPECT_FALSE(SummarizeTrace("[1,2]").ok());
  EXPECT_FALSE(SummarizeTrace("{\"traceEvents\": 3}").ok());
  EXPECT_FALSE(SummarizeTrace("not json").ok());
}

}  // namespace
}  // namespace stoke
