// Plain HTTP request/response types and the responder interface handlers answer through. No Asio here, so
// handlers (and their tests, with a fake responder) don't depend on the socket layer.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/clock.h"

namespace stoke {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // as sent: "/v1/models?x=1"
  std::string path;                            // target without the query: "/v1/models"
  std::string query;                           // after '?', undecoded
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  Nanos recv_time = 0;    // monotonic: first byte of this request read
  Nanos parsed_time = 0;  // monotonic: whole request read and parsed
  bool keep_alive = true;
  int read_calls = 0;  // socket reads that returned this request's bytes (a diagnostic; tests count them)

  // "" when absent. `name` is lower-case.
  std::string Header(std::string_view name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;  // extra headers (Retry-After, Allow, ...)
};

// How a handler answers one request: either Send() once, or StartStream() + Write()* + End(). Every method is
// thread-safe: the work is handed to the connection's strand (never touching the socket on the caller's
// thread).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(HttpResponse response) = 0;
  // Chunked response (SSE: content_type "text/event-stream").
  virtual void StartStream(int status, std::string content_type, HttpHeaders headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // End() with HTTP trailers after the last chunk (announce them with a "Trailer" header in StartStream).
  // Clients that ignore trailers see an ordinary end. The default drops them.
  virtual void EndWithTrailers(HttpHeaders trailers) {
    (void)trailers;
    End();
  }
  // Runs `fn` on the connection's strand (inline when already there). Engine callbacks use this to hand their
  // data over; fn runs after every earlier Post/Write/Send from the same thread.
  virtual void Post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, if the client goes away before the response is complete (socket closed,
  // reset, or a write failed). Set it at most once; if the client is already gone it runs soon after.
  virtual void OnDisconnect(std::function<void()> fn) = 0;
  // `fn(ok, when)` runs once, on the strand, when the response's last byte has been written (ok) or the
  // response was abandoned (client gone, server stopping).
  virtual void OnComplete(std::function<void(bool ok, Nanos when)> fn) = 0;
  virtual bool disconnected() const = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

// Body of the error responses the server itself produces (404 route, 405, 413, 400 malformed HTTP).
// status: HTTP code; the default writes OpenAI's {"error": {...}} shape.
using HttpErrorFormatter = std::function<std::string(int status, std::string_view message)>;
std::string DefaultHttpErrorBody(int status, std::string_view message);

// The reason phrase for a status code ("Not Found"); "Unknown" if unknown.
std::string_view HttpReason(int status);

}  // namespace stoke
