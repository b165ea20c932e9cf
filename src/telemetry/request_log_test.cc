#include "telemetry/request_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace stoke {
namespace {

RequestLogEntry Entry(int i, const std::string& model, Nanos e2e) {
  RequestLogEntry e;
  e.id = "r" + std::to_string(i);
  e.model = model;
  e.api = "chat";
  e.ledger.kind = LedgerKind::kGeneration;
  e.ledger[LedgerStage::kDecode] = e2e / 2;
  e.ledger.Close(e2e);
  return e;
}

std::vector<std::string> Ids(const std::vector<RequestLogEntry>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.id);
  return out;
}

using ::testing::ElementsAre;

TEST(RequestLogTest, RingKeepsTheLastNNewestFirst) {
  RequestLog log(3);
  for (int i = 0; i < 5; ++i) log.Add(Entry(i, "m", 1000 * (i + 1)));
  EXPECT_EQ(log.recorded(), 5u);
  EXPECT_THAT(Ids(log.Find({})), ElementsAre("r4", "r3", "r2"));
  log.Add(Entry(5, "m", 1));
  EXPECT_THAT(Ids(log.Find({})), ElementsAre("r5", "r4", "r3"));
}

TEST(RequestLogTest, FiltersByModelSlowestAndLimit) {
  RequestLog log(100);
  const Nanos e2e[] = {50, 10, 90, 30, 70, 20};
  for (int i = 0; i < 6; ++i) log.Add(Entry(i, i % 2 ? "b" : "a", e2e[i]));
  EXPECT_THAT(Ids(log.Find({.model = "a"})), ElementsAre("r4", "r2", "r0"));
  EXPECT_THAT(Ids(log.Find({.slowest = 2})), ElementsAre("r2", "r4"));
  EXPECT_THAT(Ids(log.Find({.model = "b", .slowest = 5})), ElementsAre("r3", "r5", "r1"));
  EXPECT_THAT(Ids(log.Find({.limit = 2})), ElementsAre("r5", "r4"));
  EXPECT_THAT(Ids(log.Find({.slowest = 4, .limit = 1})), ElementsAre("r2"));
  EXPECT_TRUE(log.Find({.model = "nope"}).empty());
}

TEST(RequestLogTest, DisabledRecordsNothing) {
  RequestLog log(0);
  EXPECT_FALSE(log.enabled());
  log.Add(Entry(0, "m", 1));
  EXPECT_TRUE(log.Find({}).empty());
  EXPECT_EQ(log.recorded(), 0u);
}

TEST(RequestLogTest, ParsesQueries) {
  auto q = RequestLog::ParseQuery("model=my%20model&slowest=5&limit=7");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->model, "my model");
  EXPECT_EQ(q->slowest, 5u);
  EXPECT_EQ(q->limit, 7u);
  EXPECT_TRUE(RequestLog::ParseQuery("").ok());
  EXPECT_EQ(RequestLog::ParseQuery("model=a+b")->model, "a b");
  EXPECT_FALSE(RequestLog::ParseQuery("slowest=x").ok());
  EXPECT_FALSE(RequestLog::ParseQuery("limit=-1").ok());
  EXPECT_FALSE(RequestLog::ParseQuery("sort=e2e").ok());
}

TEST(RequestLogTest, JsonHasTheLedgerAndGenerationFields) {
  RequestLog log(10);
  RequestLogEntry e = Entry(1, "m\"odd\\name", 2'000'000);
  e.tokens_in = 12;
  e.tokens_out = 64;
  e.ttft = 1'000'000;
  e.tpot = 15'000;
  e.finish = "length";
  log.Add(e);
  auto j = nlohmann::json::parse(log.Json({}));
  EXPECT_EQ(j["capacity"], 10);
  EXPECT_EQ(j["recorded"], 1);
  ASSERT_EQ(j["requests"].size(), 1u);
  const auto& r = j["requests"][0];
  EXPECT_EQ(r["id"], "r1");
  EXPECT_EQ(r["model"], "m\"odd\\name");  // escaped
  EXPECT_EQ(r["api"], "chat");
  EXPECT_EQ(r["finish_reason"], "length");
  EXPECT_DOUBLE_EQ(r["e2e_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(r["ttft_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["tpot_ms"].get<double>(), 0.015);
  EXPECT_EQ(r["tokens_out"], 64);
  double sum = 0;
  for (const auto& [stage, ms] : r["stages_ms"].items()) sum += ms.get<double>();
  EXPECT_NEAR(sum, 2.0, 1e-9);
  EXPECT_TRUE(r["stages_ms"].contains("interleave"));
}

TEST(RequestLogTest, ConcurrentWritersAndReaders) {
  RequestLog log(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) log.Add(Entry(t * 1000 + i, "m", i));
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 200; ++i) EXPECT_LE(log.Find({}).size(), 64u);
  });
  for (auto& th : threads) th.join();
  EXPECT_EQ(log.recorded(), 2000u);
  EXPECT_EQ(log.Find({}).size(), 64u);
}

}  // namespace
}  // namespace stoke
