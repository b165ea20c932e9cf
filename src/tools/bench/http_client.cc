#include "tools/bench/http_client.h"

#include <fmt/format.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <limits>

namespace stoke::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr uint32_t kHeaderLimit = 64 << 10;

void FillRequest(http::request<http::string_body>* req, const std::string& method, const std::string& target,
                 const std::string& host, const std::string& body, const std::string& content_type) {
  *req = {};
  req->method(http::string_to_verb(method));
  req->target(target);
  req->version(11);
  req->set(http::field::host, host);
  req->set(http::field::user_agent, "stoke-bench");
  req->keep_alive(true);
  if (!body.empty() || method == "POST") {
    req->set(http::field::content_type, content_type);
    req->body() = body;
  }
  req->prepare_payload();
}

std::string ReadErrorKind(const boost::system::error_code& ec) {
  if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == http::error::partial_message || ec == asio::error::broken_pipe) {
    return "closed";
  }
  if (ec.category() == http::make_error_code(http::error::end_of_stream).category()) return "bad_http";
  return "read";
}

}  // namespace

std::string SerializeHttpRequest(const WireRequest& r, const std::string& host_header) {
  std::string s = fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: stoke-bench\r\n", r.method, r.target,
                              host_header);
  if (!r.body.empty() || r.method == "POST")
    s += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", r.content_type, r.body.size());
  for (const auto& [k, v] : r.headers) s += fmt::format("{}: {}\r\n", k, v);
  s += "\r\n";
  s += r.body;
  return s;
}

StatusOr<HttpEndpoint> ParseHttpUrl(std::string_view url) {
  HttpEndpoint ep;
  std::string_view rest = url;
  if (rest.starts_with("https://")) return InvalidArgumentError("url '{}': https is not supported", url);
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash);
    while (path.ends_with('/')) path.remove_suffix(1);
    ep.base_path = std::string(path);
  }
  if (hostport.starts_with('[')) {  // [::1]:8000
    size_t close = hostport.find(']');
    if (close == std::string_view::npos) return InvalidArgumentError("url '{}': unclosed [", url);
    ep.host = std::string(hostport.substr(1, close - 1));
    hostport.remove_prefix(close + 1);
    if (hostport.starts_with(':')) ep.port = std::string(hostport.substr(1));
  } else {
    size_t colon = hostport.rfind(':');
    ep.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) ep.port = std::string(hostport.substr(colon + 1));
  }
  if (ep.host.empty()) return InvalidArgumentError("url '{}': no host", url);
  if (ep.port.empty() || ep.port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgumentError("url '{}': bad port '{}'", url, ep.port);
  }
  return ep;
}

StatusOr<SimpleResponse> HttpFetch(const HttpEndpoint& ep, const std::string& method,
                                   const std::string& target, const std::string& body, double timeout_s) {
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints = resolver.resolve(ep.host, ep.port, ec);
  if (ec) return UnavailableError("resolve {}: {}", ep.host, ec.message());
  tcp::socket socket(io);
  http::request<http::string_body> req;
  FillRequest(&req, method, target, ep.HostHeader(), body, "application/json");
  req.keep_alive(false);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code result = asio::error::timed_out;
  asio::async_connect(socket, endpoints, [&](const boost::system::error_code& e, const tcp::endpoint&) {
    if (e) {
      result = e;
      return;
    }
    http::async_write(socket, req, [&](const boost::system::error_code& e2, size_t) {
      if (e2) {
        result = e2;
        return;
      }
      http::async_read(socket, buffer, parser,
                       [&](const boost::system::error_code& e3, size_t) { result = e3; });
    });
  });
  io.run_for(std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  if (result == asio::error::timed_out) {
    return DeadlineExceededError("{} http://{}{}: no answer within {} s", method, ep.HostHeader(), target,
                                 timeout_s);
  }
  if (result)
    return UnavailableError("{} http://{}{}: {}", method, ep.HostHeader(), target, result.message());
  SimpleResponse r;
  r.status = static_cast<int>(parser.get().result_int());
  r.body = std::move(parser.get().body());
  return r;
}

HttpConnection::HttpConnection(asio::io_context& io, Endpoints endpoints, std::string host_header)
    : socket_(io), timer_(io), endpoints_(std::move(endpoints)), host_header_(std::move(host_header)) {}

void HttpConnection::DoConnect(std::function<void(const boost::system::error_code&)> next) {
  auto self = shared_from_this();
  asio::async_connect(
      socket_, endpoints_,
      [self, next = std::move(next)](const boost::system::error_code& ec, const tcp::endpoint&) {
        if (!ec) {
          self->connected_ = true;
          boost::system::error_code ignored;
          self->socket_.set_option(tcp::no_delay(true), ignored);
        }
        next(ec);
      });
}

void HttpConnection::Connect(std::function<void(bool)> done) {
  if (connected_) {
    done(true);
    return;
  }
  DoConnect([done = std::move(done)](const boost::system::error_code& ec) { done(!ec); });
}

void HttpConnection::Start(const WireRequest& request, ResponseHandlers handlers, Nanos timeout) {
  busy_ = true;
  handlers_ = std::move(handlers);
  ++generation_;
  timed_out_ = false;
  retried_ = false;
  wire_ = request.wire;
  if (!wire_) {
    FillRequest(&request_, request.method, request.target, host_header_, request.body, request.content_type);
    for (const auto& [k, v] : request.headers) request_.set(k, v);
  }

  // The deadline covers connecting, writing and reading.
  timer_.expires_after(std::chrono::nanoseconds(timeout));
  auto self = shared_from_this();
  uint64_t gen = generation_;
  timer_.async_wait([self, gen](const boost::system::error_code& ec) {
    if (ec || gen != self->generation_ || !self->busy_) return;
    self->timed_out_ = true;
    boost::system::error_code ignored;
    self->socket_.close(ignored);
    self->connected_ = false;
  });

  if (connected_) {
    reused_ = true;
    DoWrite();
    return;
  }
  reused_ = false;
  DoConnect([self](const boost::system::error_code& ec) {
    if (ec) return self->Complete(self->timed_out_ ? "timeout" : "connect", ec.message());
    self->DoWrite();
  });
}

void HttpConnection::DoWrite() {
  status_reported_ = false;
  buffer_.clear();
  parser_.emplace();
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_->header_limit(kHeaderLimit);
  if (handlers_.on_sent && !retried_) handlers_.on_sent(MonotonicNanos());
  auto self = shared_from_this();
  auto on_written = [self](const boost::system::error_code& ec, size_t) {
    if (ec) {
      if (self->timed_out_) return self->Complete("timeout", "no response in time");
      return self->Complete("write", ec.message());
    }
    self->DoRead();
  };
  if (wire_) {
    asio::async_write(socket_, asio::buffer(*wire_), std::move(on_written));
  } else {
    http::async_write(socket_, request_, std::move(on_written));
  }
}

void HttpConnection::DoRead() {
  auto self = shared_from_this();
  http::async_read_some(socket_, buffer_, *parser_,
                        [self](const boost::system::error_code& ec, size_t) { self->OnRead(ec); });
}

void HttpConnection::OnRead(const boost::system::error_code& ec) {
  const Nanos now = MonotonicNanos();
  if (ec) {
    if (timed_out_) return Complete("timeout", "no complete response in time");
    // A kept-alive socket the server closed while idle: nothing of this response arrived, so send it again
    // once on a fresh connection rather than count the server's idle timeout as an error.
    if (reused_ && !retried_ && !status_reported_ && ReadErrorKind(ec) == "closed") {
      retried_ = true;
      boost::system::error_code ignored;
      socket_.close(ignored);
      connected_ = false;
      auto self = shared_from_this();
      DoConnect([self](const boost::system::error_code& e) {
        if (e) return self->Complete("connect", e.message());
        self->reused_ = false;
        self->DoWrite();
      });
      return;
    }
    return Complete(ReadErrorKind(ec), ec.message());
  }
  if (parser_->is_header_done() && !status_reported_) {
    status_reported_ = true;
    int64_t json_length = -1;
    auto it = parser_->get().find("Inference-Header-Content-Length");
    if (it != parser_->get().end()) {
      try {
        json_length = std::stoll(std::string(it->value()));
      } catch (...) {
        json_length = -1;
      }
    }
    if (handlers_.on_status) handlers_.on_status(static_cast<int>(parser_->get().result_int()), json_length);
  }
  std::string& body = parser_->get().body();
  if (!body.empty()) {
    if (handlers_.on_body) handlers_.on_body(body, now);
    body.clear();  // string_body appends at size(): clearing between reads keeps memory flat on long streams
  }
  if (parser_->is_done()) {
    if (!parser_->keep_alive()) {
      boost::system::error_code ignored;
      socket_.close(ignored);
      connected_ = false;
    }
    return Complete("", "");
  }
  DoRead();
}

void HttpConnection::Complete(const std::string& error, const std::string& detail) {
  const Nanos now = MonotonicNanos();
  busy_ = false;
  timer_.cancel();
  if (!error.empty()) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    connected_ = false;
  }
  ResponseHandlers h = std::move(handlers_);
  handlers_ = {};
  if (h.on_complete) h.on_complete(error, detail, now);
}

void HttpConnection::Close() {
  boost::system::error_code ignored;
  timer_.cancel();
  socket_.close(ignored);
  connected_ = false;
}

}  // namespace stoke::bench
