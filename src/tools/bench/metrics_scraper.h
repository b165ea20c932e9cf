// Scrapes the server's Prometheus /metrics once a second during a run (on its own thread) and keeps the
// series the report charts: running/waiting/pending requests, KV-cache usage, the mean of each request stage
// over the last interval (from stoke:request_stage_seconds), the dynamic batcher's mean batch size,
// server-side token rates, and any GPU gauge.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/http_client.h"

namespace stoke::bench {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The text exposition format (version 0.0.4): samples plus the # TYPE of each family (name -> type).
StatusOr<std::vector<PromSample>> ParsePrometheusText(std::string_view text,
                                                      std::map<std::string, std::string>* types);

// Turns consecutive scrapes into chart series (stateful: rates and stage means need the previous scrape).
class SeriesBuilder {
 public:
  // Appends one row at time t_s; series first seen now get NaN for the earlier rows.
  void Add(double t_s, const std::vector<PromSample>& samples,
           const std::map<std::string, std::string>& types);
  ServerSeries Take();

 private:
  void Put(const std::string& key, double v);
  ServerSeries out_;
  std::map<std::string, double> prev_counter_;  // key -> value at the previous scrape
  double prev_t_ = -1;
};

class MetricsScraper {
 public:
  MetricsScraper(HttpEndpoint endpoint, std::string target, double interval_s)
      : endpoint_(std::move(endpoint)), target_(std::move(target)), interval_s_(interval_s) {}
  ~MetricsScraper() { Stop(); }

  // Scrapes once now (so a missing /metrics is known before the run), then every interval on a thread.
  void Start(Nanos run_start);
  void Stop();
  ServerSeries Take();  // after Stop()

 private:
  void Loop();
  bool ScrapeOnce();

  HttpEndpoint endpoint_;
  std::string target_;
  double interval_s_;
  Nanos run_start_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  SeriesBuilder builder_;
  std::string note_;
  bool available_ = false;
};

}  // namespace stoke::bench
