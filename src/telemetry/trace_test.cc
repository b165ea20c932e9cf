// The trace recorder: nothing when off, the budget and its drop count, valid trace-event JSON with named
// tracks, requests whose stages nest inside their span and sum to it.
#include "telemetry/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "telemetry/cupti_tracer.h"

namespace stoke {
namespace {

using nlohmann::json;

json Parse(const TraceResult& r) {
  json j = json::parse(r.json, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << r.json;
  return j;
}

// The name a metadata event gives (pid, tid); "" if none.
std::string MetaName(const json& j, const char* kind, int pid, int tid) {
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == kind && e["pid"] == pid && (tid < 0 || e["tid"] == tid))
      return e["args"]["name"];
  }
  return "";
}

TEST(TraceRecorderTest, OffRecordsNothing) {
  TraceRecorder r;
  EXPECT_FALSE(r.on());
  const TraceTrack t = r.Track("engine", "loop");
  EXPECT_EQ(t.pid, 0);
  r.Span(t, "step", 100, 50);
  r.Counter(t, "gpu", 100, {{"sm_active", 0.5}});
  const TraceStage stages[] = {{"queue", 10}, {"compute", 20}};
  r.Request("r1", "request", 0, stages);
  TraceResult res = r.Stop();
  EXPECT_EQ(res.events, 0u);
  EXPECT_EQ(res.dropped, 0u);
  json j = Parse(res);
  EXPECT_TRUE(j["traceEvents"].empty());
}

TEST(TraceRecorderTest, OneTraceAtATime) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  EXPECT_EQ(r.Start({}).code(), StatusCode::kFailedPrecondition);
  r.Stop();
  EXPECT_FALSE(r.on());
  EXPECT_TRUE(r.Start({}).ok());
  r.Stop();
}

TEST(TraceRecorderTest, WritesTraceEventJsonWithNamedTracks) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  const Nanos t0 = MonotonicNanos();
  const TraceTrack loop = r.Track("engine", "llm loop");
  const TraceTrack inst = r.Track("batcher minilm", "instance 1");
  EXPECT_EQ(r.Track("engine", "llm loop").tid, loop.tid);  // same pair, same track
  EXPECT_NE(loop.pid, inst.pid);
  r.Span(loop, "step", t0, 2500, {{"batch", 4}, {"admission_stop", "queue_empty"}});
  r.Counter(r.Track("GPU 0", "counters"), "DCGM_FI_PROF_SM_ACTIVE", t0 + 10, {{"value", 0.25}});
  r.Instant(inst, "close", t0 + 20, {{"reason", "full"}});
  r.SetInfo("kernel_track", "off: no CUPTI");
  TraceResult res = r.Stop();
  json j = Parse(res);
  EXPECT_EQ(j["displayTimeUnit"], "ms");
  EXPECT_EQ(j["otherData"]["kernel_track"], "off: no CUPTI");
  EXPECT_EQ(j["otherData"]["dropped_events"], 0);
  EXPECT_EQ(j["otherData"]["events"], res.events);
  EXPECT_EQ(res.tracks, 3u);
  EXPECT_EQ(MetaName(j, "process_name", loop.pid, -1), "engine");
  EXPECT_EQ(MetaName(j, "thread_name", loop.pid, loop.tid), "llm loop");
  EXPECT_EQ(MetaName(j, "thread_name", inst.pid, inst.tid), "instance 1");
  std::set<std::string> phases;
  for (const json& e : j["traceEvents"]) {
    ASSERT_TRUE(e["name"].is_string());
    ASSERT_TRUE(e["ph"].is_string());
    ASSERT_TRUE(e["ts"].is_number());
    ASSERT_TRUE(e["pid"].is_number_integer());
    ASSERT_TRUE(e["tid"].is_number_integer());
    ASSERT_TRUE(e["args"].is_object());
    phases.insert(e["ph"]);
    if (e["ph"] == "X") {
      EXPECT_EQ(e["name"], "step");
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2.5);  // µs
      EXPECT_EQ(e["args"]["batch"], 4);
      EXPECT_EQ(e["args"]["admission_stop"], "queue_empty");
    }
    if (e["ph"] == "C") {
      EXPECT_DOUBLE_EQ(e["args"]["value"].get<double>(), 0.25);
    }
    if (e["ph"] == "i") {
      EXPECT_EQ(e["s"], "t");
    }
  }
  EXPECT_EQ(phases, (std::set<std::string>{"M", "X", "C", "i"}));
}

TEST(TraceRecorderTest, RequestStagesNestAndSumToTheRequest) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  const TraceStage stages[] = {{"recv", 1000}, {"queue", 0}, {"compute", 5500}, {"send", 250}};
  r.Request("cmpl-1", "POST /v1/completions", 1'000'000, stages, {{"model", "m"}});
  r.Request("cmpl-1", "POST /v1/completions", 1'002'000, stages);  // same id: its own track
  json j = Parse(r.Stop());
  std::map<int, std::vector<json>> by_tid;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") by_tid[e["tid"].get<int>()].push_back(e);
  }
  ASSERT_EQ(by_tid.size(), 2u);
  for (const auto& [tid, spans] : by_tid) {
    ASSERT_EQ(spans.size(), 4u);  // the request + 3 non-empty stages
    const json& req = spans[0];
    EXPECT_EQ(req["args"]["id"], "cmpl-1");
    EXPECT_DOUBLE_EQ(req["dur"].get<double>(), 6.75);
    double sum = 0, at = req["ts"].get<double>();
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_DOUBLE_EQ(spans[i]["ts"].get<double>(), at);  // back to back, inside the parent
      at += spans[i]["dur"].get<double>();
      sum += spans[i]["dur"].get<double>();
    }
    EXPECT_DOUBLE_EQ(sum, req["dur"].get<double>());
  }
}

TEST(TraceRecorderTest, BudgetCountsDropsAndSaysSo) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({.max_events = 10}).ok());
  const TraceTrack t = r.Track("engine", "loop");  // 3 events: process name, sort index, thread name
  for (int i = 0; i < 20; ++i) r.Span(t, "step", i * 10, 5);
  TraceResult res = r.Stop();
  EXPECT_EQ(res.events, 10u);
  EXPECT_EQ(res.dropped, 13u);
  json j = Parse(res);
  EXPECT_EQ(j["traceEvents"].size(), 10u);
  EXPECT_EQ(j["otherData"]["dropped_events"], 13);
  EXPECT_EQ(j["otherData"]["max_events"], 10);
  EXPECT_NE(j["otherData"]["note"].get<std::string>().find("13 events"), std::string::npos);
}

TEST(TraceRecorderTest, ThreadSafeAndNothingAfterStop) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&r, k] {
      const TraceTrack t = r.Track("engine", "thread " + std::to_string(k));
      for (int i = 0; i < 500; ++i) r.Span(t, "work", i, 1);
    });
  }
  for (auto& t : threads) t.join();
  TraceResult res = r.Stop();
  EXPECT_EQ(res.events, 2u + 4u + 4u * 500u);
  EXPECT_EQ(res.tracks, 4u);
  r.Span({1, 1}, "late", 0, 1);
  EXPECT_EQ(r.Stop().events, 0u);
}

TEST(TraceRecorderTest, EscapesNamesAndNonFiniteValues) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  r.Span(r.Track("p\"q", "t\n"), "a\\b", 0, 1, {{"x", std::numeric_limits<double>::quiet_NaN()}});
  json j = Parse(r.Stop());
  EXPECT_EQ(MetaName(j, "process_name", 1, -1), "p\"q");
  bool found = false;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      found = true;
      EXPECT_EQ(e["name"], "a\\b");
      EXPECT_TRUE(e["args"]["x"].is_null());
    }
  }
  EXPECT_TRUE(found);
}

// Without CUPTI (a CPU build, no libcupti, no GPU) there is no kernel track, and the file says why.
TEST(TraceRecorderTest, KernelTrackSaysWhyInTheFile) {
  TraceRecorder r;
  ASSERT_TRUE(r.Start({}).ok());
  const bool cupti = CuptiTracer::Get().Start(r);
  CuptiTracer::Get().Stop(r);
  json j = Parse(r.Stop());
  const std::string why = j["otherData"]["kernel_track"];
  EXPECT_EQ(why.rfind(cupti ? "cupti" : "off: ", 0), 0u) << why;
}

}  // namespace
}  // namespace stoke
