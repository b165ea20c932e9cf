#include "net/http/trace_endpoint.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <string_view>

#include "telemetry/cupti_tracer.h"

namespace stoke {
namespace {

HttpResponse Error(int status, std::string_view message) {
  std::string body = "{\"error\":\"";
  for (char c : message) {
    if (c == '"' || c == '\\') body.push_back('\\');
    body.push_back(c < 0x20 ? ' ' : c);
  }
  body += "\"}";
  return {.status = status, .body = std::move(body)};
}

}  // namespace

StatusOr<TraceRequestParams> ParseTraceQuery(std::string_view query, const TraceEndpointOptions& o) {
  TraceRequestParams p{.seconds = o.default_seconds, .max_events = o.default_max_events};
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    const std::string_view key = kv.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : kv.substr(eq + 1);
    if (key == "seconds") {
      double s = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), s);
      if (ec != std::errc() || end != value.data() + value.size() || !(s > 0) || s > o.max_seconds) {
        return InvalidArgumentError("seconds must be a number in (0, {}], got '{}'", o.max_seconds, value);
      }
      p.seconds = s;
    } else if (key == "max_events") {
      size_t k = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), k);
      if (ec != std::errc() || end != value.data() + value.size() || k < 1 || k > o.max_max_events) {
        return InvalidArgumentError("max_events must be an integer in [1, {}], got '{}'", o.max_max_events,
                                    value);
      }
      p.max_events = k;
    } else {
      return InvalidArgumentError("unknown query parameter '{}' (seconds, max_events)", key);
    }
  }
  return p;
}

TraceEndpoint::TraceEndpoint(TraceEndpointOptions options, TraceRecorder* recorder)
    : options_(std::move(options)), recorder_(recorder) {}

TraceEndpoint::~TraceEndpoint() {
  Finish();
  std::thread worker;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    worker = std::move(worker_);
  }
  cv_.notify_all();
  if (worker.joinable()) worker.join();
}

void TraceEndpoint::Finish() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void TraceEndpoint::Register(HttpServer& server) {
  server.Handle("POST", "/v1/debug/trace", [this](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    Handle(req, std::move(r));
  });
  server.Handle("GET", "/v1/debug/trace", [this](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    std::lock_guard lock(mu_);
    r->Send({.body = recording_ ? "{\"recording\":true}" : "{\"recording\":false}"});
  });
  server.Handle("DELETE", "/v1/debug/trace",
                [this](const HttpRequest&, std::shared_ptr<HttpResponder> r) { HandleDelete(std::move(r)); });
}

void TraceEndpoint::Handle(const HttpRequest& request, std::shared_ptr<HttpResponder> responder) {
  StatusOr<TraceRequestParams> p = ParseTraceQuery(request.query, options_);
  if (!p.ok()) return responder->Send(Error(400, p.status().message()));
  std::unique_lock lock(mu_);
  if (stop_) return responder->Send(Error(503, "the server is stopping"));
  if (Status s = recorder_->Start({.max_events = p->max_events}); !s.ok()) {
    const int code = s.code() == StatusCode::kFailedPrecondition ? 409 : 400;
    return responder->Send(Error(code, s.message()));
  }
  recording_ = true;
  end_now_ = false;
  // The previous trace's thread has answered (the recorder was free), so joining it does not wait long.
  if (worker_.joinable()) worker_.join();
  worker_ = std::thread(
      [this, seconds = p->seconds, r = std::move(responder)]() mutable { Record(seconds, std::move(r)); });
}

void TraceEndpoint::HandleDelete(std::shared_ptr<HttpResponder> responder) {
  {
    std::lock_guard lock(mu_);
    if (!recording_) return responder->Send(Error(404, "no trace is being recorded"));
    end_now_ = true;
  }
  cv_.notify_all();
  responder->Send({.body = "{\"stopped\":true}"});
}

void TraceEndpoint::Record(double seconds, std::shared_ptr<HttpResponder> responder) {
  if (options_.gpu_activity) CuptiTracer::Get().Start(*recorder_);  // else says why in the file
  if (options_.on_start) options_.on_start(*recorder_);
  {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stop_ || end_now_; });
  }
  if (options_.on_stop) options_.on_stop(*recorder_);
  if (options_.gpu_activity) CuptiTracer::Get().Stop(*recorder_);  // flushes its records into the trace
  TraceResult r = recorder_->Stop();
  {
    std::lock_guard lock(mu_);
    recording_ = false;
  }
  responder->Send({.status = 200,
                   .body = std::move(r.json),
                   .headers = {{"X-Stoke-Trace-Events", std::to_string(r.events)},
                               {"X-Stoke-Trace-Dropped", std::to_string(r.dropped)}}});
}

}  // namespace stoke
