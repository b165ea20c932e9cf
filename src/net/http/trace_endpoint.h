// POST /v1/debug/trace?seconds=N[&max_events=K]: records the timeline (telemetry/trace.h) for N seconds and
// answers with the trace-event JSON (Perfetto / chrome://tracing). One trace at a time: 409 while one is
// being recorded; 400 for a bad N or K. The wait happens on the endpoint's own thread, never on an io thread.
// DELETE /v1/debug/trace ends the trace in progress early (its POST answers with what was recorded): 200,
// or 404 when none is on. GET /v1/debug/trace says whether one is: {"recording": true|false}.
//
//   TraceEndpoint trace({.max_seconds = 60});
//   trace.Register(server);   // before server.Start(); `trace` must outlive the server's handlers
//
// The one serving lifecycle (src/server/server.cc) registers it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "net/http/http_server.h"
#include "telemetry/trace.h"

namespace stoke {

struct TraceEndpointOptions {
  double max_seconds = 60;     // N above it is refused (400)
  double default_seconds = 5;  // when `seconds` is absent
  size_t default_max_events = size_t{1} << 20;
  size_t max_max_events = size_t{1} << 23;  // K above it is refused (400): bounds the memory a trace takes
  bool gpu_activity = true;  // GPU kernels and copies from CUPTI where it loads (telemetry/cupti_tracer.h)
  // Called when a trace starts and just before it stops (on the endpoint's thread), e.g. to open and flush a
  // GPU activity source. May be empty.
  std::function<void(TraceRecorder&)> on_start, on_stop;
};

struct TraceRequestParams {
  double seconds = 0;
  size_t max_events = 0;
};
// Parses the query string ("seconds=2.5&max_events=1000"); InvalidArgument names the bad key or value.
StatusOr<TraceRequestParams> ParseTraceQuery(std::string_view query, const TraceEndpointOptions& o);

class TraceEndpoint {
 public:
  explicit TraceEndpoint(TraceEndpointOptions options = {},
                         TraceRecorder* recorder = &TraceRecorder::Global());
  ~TraceEndpoint();  // a trace in progress ends now (its client gets what was recorded); the thread joins
  TraceEndpoint(const TraceEndpoint&) = delete;
  TraceEndpoint& operator=(const TraceEndpoint&) = delete;

  void Register(HttpServer& server);
  // Ends a trace in progress now (its client gets what was recorded) and refuses new ones (503): call it
  // before draining the server so a long trace does not hold the drain up.
  void Finish();
  void Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder);
  void HandleDelete(std::shared_ptr<HttpResponder> responder);

 private:
  void Record(double seconds, std::shared_ptr<HttpResponder> responder);

  const TraceEndpointOptions options_;
  TraceRecorder* const recorder_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;       // guarded by mu_: end the trace in progress now and refuse new ones
  bool end_now_ = false;    // guarded by mu_: end the trace in progress now (DELETE)
  bool recording_ = false;  // guarded by mu_: a trace of this endpoint is in progress
  std::thread worker_;      // guarded by mu_: the last trace's thread
};

}  // namespace stoke
