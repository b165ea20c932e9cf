// One load point, driven over HTTP (or KServe gRPC, grpc_client.h) from one io_context on the calling thread.
//
// With --api kserve-grpc a "connection" is a slot for one call on a shared HTTP/2 channel (one channel per 64
// slots, at most 16); the completion-queue poller thread's CPU counts in the generator's health with the io
// thread's (the busier of the two).
//
// Closed loop (concurrency N): N connections, each sending its next request as soon as the previous one
// ends. Open loop (rate R): requests are scheduled by a Poisson or evenly spaced arrival process and sent on
// whichever connection is idle (a new one is opened when none is, up to max_connections). Every latency is
// counted from the scheduled send time, so queueing inside the generator is charged to the point, and the
// generator watches itself: how late each send went out (send lag), sends it could not make, and its own CPU
// time. A point it could not drive is marked invalid with the reason.
//
// Timeline of a point: warm-up (not counted) | window 1 | window 2 | ... until the last `stable_windows`
// windows agree within `stability` (throughput and p99; perf_analyzer's rule) or max_duration_s is reached |
// drain: no new sends; in-flight requests finish (or are cut at drain_timeout_s and count as incomplete).
#pragma once

#include <functional>
#include <string>

#include "base/status.h"
#include "tools/bench/bench_types.h"
#include "tools/bench/http_client.h"
#include "tools/bench/protocol.h"
#include "tools/bench/workload.h"

namespace stoke::bench {

struct PointOptions {
  LoadMode mode = LoadMode::kConcurrency;
  double load = 1;  // concurrency, or requests per second
  Arrival arrival = Arrival::kPoisson;
  double warmup_s = 5;
  // Closed loop: the N clients start one after another over this many seconds (client i at i · ramp / N)
  // instead of all at once, so that long requests do not move in lockstep waves (N prompts prefilled
  // together, then N decodes, then N finishing at once). At most warmup_s: the measurement starts with every
  // client running. 0: all at once.
  double ramp_up_s = 0;
  double window_s = 5;
  double max_duration_s = 60;  // measurement time cap
  double stability = 0.10;     // max/min - 1 allowed over the last windows; 0 = always run max_duration_s
  int stable_windows = 3;
  double drain_timeout_s = 30;
  double request_timeout_s = 600;
  int max_connections = 2048;    // open loop
  double late_threshold_ms = 2;  // a send later than this counts as late
  double max_send_lag_ms = 10;   // p99 send lag above this makes the point invalid
  double max_cpu_percent = 90;   // the generator's thread busier than this makes the point invalid
  uint64_t seed = 1;
  Slo slo;
  // > 0: this many requests are built and serialized (HTTP: the whole message, headers and body) before the
  // point starts and sent in turn, so the generator encodes nothing while it measures. They repeat after that
  // many sends (GeneratorHealth::reused_requests counts it): a server with a prefix cache would serve a
  // repeated prompt from it, so size the pool above the requests a point sends. 0: built as they go.
  int prebuilt_requests = 0;
};

struct ProgressEvent {
  enum class Phase : uint8_t { kWarmup, kWindow, kDrain, kDone };
  Phase phase = Phase::kWarmup;
  double elapsed_s = 0;  // since the measurement started (negative during warm-up)
  double max_s = 0;
  int windows = 0;
  const WindowStats* window = nullptr;  // the window just closed (kWindow)
  bool stable = false;
  int in_flight = 0;
};
using ProgressFn = std::function<void(const ProgressEvent&)>;

class LoadGenerator {
 public:
  // `prompts` supplies the requests (the generator builds wire requests from them ahead of time).
  LoadGenerator(HttpEndpoint endpoint, ProtocolOptions protocol, PromptSource* prompts);

  StatusOr<PointResult> RunPoint(const PointOptions& opts, const ProgressFn& progress);

 private:
  HttpEndpoint endpoint_;
  ProtocolOptions protocol_;
  PromptSource* prompts_;
};

}  // namespace stoke::bench
