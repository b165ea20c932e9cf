// What the load generator drives: one request at a time per connection, whatever the protocol. An HTTP/1.1
// keep-alive socket (http_client.h) or a slot on a shared gRPC channel (grpc_client.h) implements it; all
// calls and callbacks happen on the generator's io_context thread.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "tools/bench/protocol.h"

namespace stoke::bench {

// What a connection reports about one request; all calls happen on the io_context's thread.
struct ResponseHandlers {
  std::function<void(Nanos)> on_sent;  // right before the first byte is written
  std::function<void(int status, int64_t json_length)>
      on_status;                                         // json_length: Inference-Header-Content-Length or -1
  std::function<void(std::string_view, Nanos)> on_body;  // new body bytes (chunked framing removed)
  // error "" when the response is complete; else a kind ("connect", "timeout", "closed", "bad_http",
  // "grpc_unavailable", ...).
  std::function<void(const std::string& error, const std::string& detail, Nanos)> on_complete;
};

class Connection {
 public:
  virtual ~Connection() = default;
  // Makes the connection ready ahead of time; done(ok) on the io thread.
  virtual void Connect(std::function<void(bool)> done) = 0;
  // One request at a time; on_complete is always called exactly once.
  virtual void Start(const WireRequest& request, ResponseHandlers handlers, Nanos timeout) = 0;
  // Stops a request in flight (it completes with an error) and releases the connection.
  virtual void Close() = 0;
  virtual bool busy() const = 0;
};

}  // namespace stoke::bench
