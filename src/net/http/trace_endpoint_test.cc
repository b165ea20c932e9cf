// The timeline endpoint's query: seconds and max_events within their caps, unknown keys refused.
#include "net/http/trace_endpoint.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

TEST(TraceEndpointTest, ParsesSecondsAndMaxEventsWithDefaults) {
  const TraceEndpointOptions o{.max_seconds = 60, .default_seconds = 5, .default_max_events = 1000};
  auto p = ParseTraceQuery("", o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->seconds, 5);
  EXPECT_EQ(p->max_events, 1000u);
  p = ParseTraceQuery("seconds=2.5&max_events=42", o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->seconds, 2.5);
  EXPECT_EQ(p->max_events, 42u);
}

TEST(TraceEndpointTest, RefusesOutOfRangeAndUnknown) {
  const TraceEndpointOptions o{.max_seconds = 60, .max_max_events = 100};
  for (const char* q : {"seconds=0", "seconds=-1", "seconds=61", "seconds=abc", "seconds=", "seconds=1x",
                        "max_events=0", "max_events=101", "max_events=-3", "sekonds=1"}) {
    auto p = ParseTraceQuery(q, o);
    EXPECT_FALSE(p.ok()) << q;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << q;
  }
  EXPECT_NE(ParseTraceQuery("seconds=61", o).status().message().find("seconds"), std::string::npos);
}

}  // namespace
}  // namespace stoke
