// Asynchronous HTTP/1.1 server on Boost.Beast: one io_context run by a few threads, one strand per connection
// (no thread per connection, so thousands of idle keep-alive connections cost only their sockets),
// keep-alive, a request body limit (413), chunked streaming for SSE, and detection of clients that go away
// while their response is pending (so generation can be cancelled).
//
//   HttpServer server(opts);
//   server.Handle("GET", "/health/live", [](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
//     r->Send({.status = 200, .body = R"({"status":"live"})"});
//   });
//   RETURN_IF_ERROR(server.Start());   // binds, listens, runs the threads
//   ...
//   server.Shutdown(std::chrono::seconds(10));   // stop accepting, drain in-flight responses, stop
//
// Handlers run on the connection's strand (an io thread): they must not block; long work goes elsewhere and
// answers through the responder.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "net/http/http_types.h"

namespace stoke {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: an ephemeral port (see HttpServer::port())
  int threads = 2;                      // io threads running the io_context
  size_t max_body_bytes = 8u << 20;     // larger bodies get 413
  size_t max_header_bytes = 64u << 10;  // larger headers (request line + fields, all together) get 431
  // Open connections beyond which a new one is answered 503 (Retry-After: 1) and closed at once; 0: no cap
  // but the process's descriptor limit (raised to its hard limit at Start).
  int max_connections = 0;
  // A keep-alive connection with no request in progress is closed after this long.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(120)};
  // A request must arrive completely within this long after its first byte (else 408 and close).
  std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
  HttpErrorFormatter error_body;  // empty: DefaultHttpErrorBody
  // Non-empty: every request must carry "Authorization: Bearer <api_key>" (compared in constant time), else
  // 401 with WWW-Authenticate: Bearer, before any route is looked up. Open without it: /health, /health/*,
  // /v2/health/*, and /metrics unless metrics_require_key.
  std::string api_key;
  bool metrics_require_key = false;
  // After the first SIGINT/SIGTERM (which WaitForSignal reports), a second one ends the process at once
  // (std::_Exit(128 + signo)) even while Shutdown drains. false: it is ignored.
  bool second_signal_exits = true;
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // Shutdown(0) if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes are exact paths. A known path with another method gets 405 (with Allow); an unknown path 404.
  // Register before Start().
  void Handle(const std::string& method, const std::string& path, HttpHandler handler);
  // A path no exact route matches goes, whatever its method, to the handler of the longest prefix registered
  // here that it starts with (e.g. "/v2/", so a front end answers its own unknown paths in its own error
  // shape, naming the model); none: 404. Register before Start().
  void HandlePrefix(const std::string& prefix, HttpHandler handler);

  // Binds and listens, then runs the io threads. Fails (Unavailable) if the address can't be bound.
  Status Start();
  int port() const { return bound_port_; }

  // Stops accepting, closes idle connections, lets in-flight responses finish for up to `drain`, then closes
  // everything and joins the io threads. Idempotent; safe from any thread except an io thread.
  void Shutdown(std::chrono::milliseconds drain);

  // Blocks until a SIGINT or SIGTERM arrives, Shutdown is called, or `timeout` passes. Returns the signal
  // number (0 if none). The signals are caught from Start() on, so they never kill the process meanwhile;
  // a second one exits at once (HttpServerOptions::second_signal_exits).
  int WaitForSignal(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  // Requests whose response is not yet complete, and open connections (for tests and /metrics).
  int active_requests() const;
  int open_connections() const;

  // Internal: shared with the connection objects (http_server.cc). Connections keep it alive, so a responder
  // held past the server's destruction (e.g. by an engine callback) stays safe to call: it does nothing.
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  int bound_port_ = 0;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace stoke
