// Plain types shared by the bench pieces: what one request measured, what one load point reports, and what
// a whole run reports. Times on the wire side are monotonic nanoseconds (base/clock.h); everything reported
// is in milliseconds or seconds as the field name says.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"

namespace stoke::bench {

enum class Api : uint8_t { kOpenAiChat, kOpenAiCompletions, kOpenAiEmbeddings, kKserveHttp, kKserveGrpc };
inline constexpr Api kAllApis[] = {Api::kOpenAiChat, Api::kOpenAiCompletions, Api::kOpenAiEmbeddings,
                                   Api::kKserveHttp, Api::kKserveGrpc};
const char* ApiName(Api api);    // "openai-chat", ...
bool ApiStreamsTokens(Api api);  // chat and completions (when streaming)

// Closed loop: a fixed number of clients, each sending its next request when the previous one ends.
// Open loop: requests sent at scheduled times (Poisson or evenly spaced) whatever the server does.
enum class LoadMode : uint8_t { kConcurrency, kRate };
enum class Arrival : uint8_t { kPoisson, kConstant };

// Service-level objectives for goodput; 0 = not set. All in milliseconds.
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  double e2e_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0 || e2e_ms > 0; }
};

// What one request measured. Every latency is counted from `scheduled`: in open loop that is the time the
// arrival process said to send, so a generator that falls behind cannot hide the server's queueing.
// RequestRecord::error of a request still running when the point's drain timed out (cut by the generator).
inline constexpr char kIncompleteError[] = "incomplete";

struct RequestRecord {
  Nanos scheduled = 0;
  Nanos sent = 0;         // the request was handed to the socket (after connecting if needed)
  Nanos first_token = 0;  // first streamed token (0 if none)
  Nanos done = 0;         // last byte of the response (0 if never finished)
  int input_tokens = 0;   // from the server's usage when it reports it, else the workload's count
  int output_tokens = 0;
  std::string error;          // "" = success; else a kind: "http_503", "connect", "timeout", "closed", ...
  std::string error_detail;   // the server's message or the socket error, shortened
  std::vector<float> itl_ms;  // gaps between consecutive streamed tokens
  bool warmup = false;
};

// Percentiles of one quantity, milliseconds (or the quantity's unit).
struct Summary {
  int64_t count = 0;
  double mean = 0, stddev = 0, min = 0, max = 0;
  double p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

// One measurement window (stability is judged on consecutive windows).
struct WindowStats {
  double start_s = 0;  // since the point started
  double duration_s = 0;
  int64_t completed = 0;  // successful requests that finished inside the window
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  double p50_ms = 0, p99_ms = 0;                             // end-to-end latency of those requests
  double ttft_p50_ms = 0, ttft_p99_ms = 0, tpot_p50_ms = 0;  // streaming only (0 otherwise)
};

// A histogram with log-spaced bins, for the distribution charts. counts.size() == edges.size() - 1.
struct Histogram {
  std::vector<double> edges;
  std::vector<int64_t> counts;
};

struct GeneratorHealth {
  Summary send_lag_ms;        // actual send - scheduled send
  int64_t late_sends = 0;     // lag above the late threshold
  int64_t dropped_sends = 0;  // scheduled but never sent (no connection could be had in time)
  double cpu_percent = 0;     // the generator's io thread, percent of one core
  double late_threshold_ms = 0;
  int64_t reused_requests =
      0;  // sends of a pre-built request already sent once (PointOptions::prebuilt_requests)
};

struct PointResult {
  LoadMode mode = LoadMode::kConcurrency;
  double load = 0;  // concurrency, or requests/s
  bool valid = true;
  std::vector<std::string> invalid_reasons;
  bool stable = false;
  double warmup_s = 0;
  double measured_s = 0;  // the measurement period (sum of the windows)
  std::vector<WindowStats> windows;

  int64_t sent = 0;  // requests sent in the measurement period
  int64_t succeeded = 0;
  std::map<std::string, int64_t> errors;              // kind -> count (incl. "incomplete")
  std::map<std::string, std::string> error_examples;  // kind -> the first detail seen
  double requests_per_s = 0;
  double input_tokens_per_s = 0;
  double output_tokens_per_s = 0;
  double mean_input_tokens = 0;
  double mean_output_tokens = 0;

  Summary latency_ms, ttft_ms, tpot_ms, itl_ms;
  Histogram ttft_hist, itl_hist, latency_hist;

  double goodput_rps = 0;       // successful requests meeting every SLO, per second
  double goodput_fraction = 0;  // of the requests sent in the measurement period
  GeneratorHealth generator;
  double t_start_s = 0, t_end_s = 0;  // since the run started (to place it on the server-metrics charts)
};

// Server metrics scraped once a second during the run: one value per scrape per series.
struct ServerSeries {
  bool available = false;
  std::string note;                                   // why not available, or "" when it is
  std::vector<double> t_s;                            // since the run started
  std::map<std::string, std::vector<double>> series;  // name -> values (NaN where absent)
};

struct RunInfo {
  std::string schema = "stoke.bench.v1";
  std::string command;  // the command line
  std::string url;
  std::string model;
  Api api = Api::kOpenAiChat;
  LoadMode mode = LoadMode::kConcurrency;
  Arrival arrival = Arrival::kPoisson;
  std::string workload;  // "short (in 128, out 128)" etc.
  bool stream = true;
  Slo slo;
  std::string label;
  std::string started_at;  // ISO-8601 UTC
  std::string git_commit;  // of the working directory, if it is a git checkout
  std::string host;        // hostname, CPUs, OS
  double window_s = 0, warmup_s = 0, max_duration_s = 0, stability = 0;
  double ramp_up_s = 0;  // closed loop: the clients' start spread over the warm-up (PointOptions::ramp_up_s)
  uint64_t seed = 0;
};

struct BenchReport {
  RunInfo run;
  std::vector<PointResult> points;
  ServerSeries server;
};

}  // namespace stoke::bench
