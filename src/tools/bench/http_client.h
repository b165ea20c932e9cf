// The bench's HTTP/1.1 client on Boost.Beast: keep-alive connections driven by one io_context, each
// delivering a response's body bytes the moment they are read (so streamed tokens are timed as they arrive),
// plus a small blocking fetch for set-up calls and metric scrapes.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"
#include "tools/bench/connection.h"
#include "tools/bench/protocol.h"

namespace stoke::bench {

// http://host:port[/prefix] (no TLS).
struct HttpEndpoint {
  std::string host;
  std::string port = "80";
  std::string base_path;  // "" or "/prefix" without a trailing slash
  std::string HostHeader() const { return host + ":" + port; }
};
StatusOr<HttpEndpoint> ParseHttpUrl(std::string_view url);

struct SimpleResponse {
  int status = 0;
  std::string body;
};
// One blocking request on a fresh connection (set-up calls, /metrics scrapes).
StatusOr<SimpleResponse> HttpFetch(const HttpEndpoint& ep, const std::string& method,
                                   const std::string& target, const std::string& body, double timeout_s);

// The HTTP/1.1 bytes HttpConnection would write for `request` (the same request line and headers as its
// serializer: Host, User-Agent, Content-Type, Content-Length, the request's own headers), built once so a
// pre-built request is written with no per-send encoding.
std::string SerializeHttpRequest(const WireRequest& request, const std::string& host_header);

class HttpConnection : public Connection, public std::enable_shared_from_this<HttpConnection> {
 public:
  using Endpoints = boost::asio::ip::tcp::resolver::results_type;
  HttpConnection(boost::asio::io_context& io, Endpoints endpoints, std::string host_header);

  // Opens the socket ahead of time; done(ok) on the io thread.
  void Connect(std::function<void(bool)> done) override;
  // One request at a time. Reconnects if the socket is closed; a reused connection that the server had
  // already closed (no byte of the response read) is retried once on a new socket.
  void Start(const WireRequest& request, ResponseHandlers handlers, Nanos timeout) override;
  // Closes the socket; a request in flight completes with error "closed".
  void Close() override;
  bool busy() const override { return busy_; }

 private:
  void DoConnect(std::function<void(const boost::system::error_code&)> next);
  void DoWrite();
  void DoRead();
  void OnRead(const boost::system::error_code& ec);
  void Complete(const std::string& error, const std::string& detail);

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  Endpoints endpoints_;
  std::string host_header_;
  boost::beast::flat_buffer buffer_;
  boost::beast::http::request<boost::beast::http::string_body> request_;
  std::shared_ptr<const std::string> wire_;  // a pre-built request's bytes (written as is), else request_
  std::optional<boost::beast::http::response_parser<boost::beast::http::string_body>> parser_;
  ResponseHandlers handlers_;
  bool busy_ = false;
  bool connected_ = false;
  bool reused_ = false;  // this request went out on a socket that had served one before
  bool retried_ = false;
  bool status_reported_ = false;
  bool timed_out_ = false;
  uint64_t generation_ = 0;  // bumps per request so a stale timer does nothing
};

}  // namespace stoke::bench
