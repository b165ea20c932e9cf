// The connection state machine. Each connection lives on its own strand:
//
//   reading ──request parsed──> handling ──last byte of the response written──> reading (keep-alive)
//                                  │                                          └─> closed (Connection: close,
//                                  │                                              draining, write error)
//                                  └─ meanwhile: a wait for readability on the socket; if it fires with
//                                     nothing to read, the peer closed -> the exchange is "disconnected"
//
// Responses are serialised by hand (status line, headers, body or chunks) into a write queue; Beast parses
// requests (incrementally, so the first byte's arrival is stamped for the time ledger).
#include "net/http/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "base/logging.h"
#include "net/http/http_connection.h"

namespace stoke {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

int HttpServer::active_requests() const {
  return impl_->active_requests.load();
}
int HttpServer::open_connections() const {
  return impl_->open_connections.load();
}

HttpServer::HttpServer(HttpServerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

HttpServer::~HttpServer() {
  Shutdown(std::chrono::milliseconds(0));
}

void HttpServer::Handle(const std::string& method, const std::string& path, HttpHandler handler) {
  impl_->routes[path][method] = std::move(handler);
}

void HttpServer::HandlePrefix(const std::string& prefix, HttpHandler handler) {
  impl_->prefix_routes[prefix] = std::move(handler);
}

namespace {

// Thousands of keep-alive connections need thousands of descriptors: lift the soft limit to the hard one.
void RaiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// Over --max-connections: a short 503 written without waiting (it fits any socket buffer), then close. The
// client learns to come back; the server spends no strand, parser or timer on it.
void RefuseConnection(const std::shared_ptr<HttpServer::Impl>& impl, tcp::socket socket) {
  const std::string body = impl->options.error_body(
      503,
      fmt::format("too many connections (--max-connections {}); retry later", impl->options.max_connections));
  const std::string response = fmt::format(
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Retry-After: 1\r\nConnection: close\r\n\r\n{}",
      body.size(), body);
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  if (!ec) socket.write_some(asio::buffer(response), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
  impl->refused_connections.fetch_add(1);
}

void Accept(const std::shared_ptr<HttpServer::Impl>& impl) {
  impl->acceptor->async_accept(asio::make_strand(*impl->ioc), [impl](boost::system::error_code ec,
                                                                     tcp::socket socket) {
    if (!impl->acceptor->is_open() || impl->draining.load()) return;
    if (ec) {
      // EMFILE and friends: back off instead of spinning, then keep accepting.
      LOG_WARN("http: accept failed: {}", ec.message());
      impl->accept_retry->expires_after(std::chrono::milliseconds(50));
      impl->accept_retry->async_wait([impl](boost::system::error_code) { Accept(impl); });
      return;
    }
    if (impl->options.max_connections > 0 && impl->open_connections.load() >= impl->options.max_connections) {
      RefuseConnection(impl, std::move(socket));
    } else {
      StartConnection(impl, std::move(socket));
    }
    Accept(impl);
  });
}

// The first signal is reported to WaitForSignal; the wait is re-armed so that a second one, typically an
// impatient operator during the drain, ends the process at once.
// The handler holds the Impl weakly: it owns the signal set, whose pending wait would otherwise keep it
// alive.
void WaitForSignals(const std::shared_ptr<HttpServer::Impl>& shared) {
  std::weak_ptr<HttpServer::Impl> weak = shared;
  shared->signals->async_wait([weak](boost::system::error_code ec, int signo) {
    std::shared_ptr<HttpServer::Impl> impl = weak.lock();
    if (ec || impl == nullptr) return;
    bool second;
    {
      std::lock_guard lock(impl->stop_mu);
      second = impl->signal != 0;
      if (!second) impl->signal = signo;
      impl->stop_cv.notify_all();
    }
    if (second && impl->options.second_signal_exits) {
      std::fprintf(stderr, "stoke: second signal (%d) during shutdown; exiting now\n", signo);
      std::fflush(stderr);
      std::_Exit(128 + signo);
    }
    WaitForSignals(impl);
  });
}

}  // namespace

Status HttpServer::Start() {
  if (started_) return FailedPreconditionError("http server already started");
  RaiseFileLimit();
  Impl& impl = *impl_;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(impl.options.host, ec);
  if (ec)
    return InvalidArgumentError("--host '{}' is not an IP address: {}", impl.options.host, ec.message());
  if (impl.options.port < 0 || impl.options.port > 65535) {
    return InvalidArgumentError("--port {} is out of range", impl.options.port);
  }
  tcp::endpoint endpoint(address, static_cast<uint16_t>(impl.options.port));
  tcp::acceptor& acceptor = *impl.acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return UnavailableError("cannot listen on {}:{}: {}", impl.options.host, impl.options.port, ec.message());
  }
  bound_port_ = acceptor.local_endpoint().port();
  started_ = true;

  // Signals are caught here so WaitForSignal sees them, whichever thread is busy.
  impl.signals->add(SIGINT);
  impl.signals->add(SIGTERM);
  std::shared_ptr<Impl> shared = impl_;
  WaitForSignals(shared);
  Accept(impl_);
  const int n = std::max(1, impl.options.threads);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([shared] { shared->ioc->run(); });
  }
  return OkStatus();
}

int HttpServer::WaitForSignal(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->stop_mu);
  auto done = [&] { return impl_->signal != 0 || impl_->stop_requested; };
  if (timeout == std::chrono::milliseconds::max()) {
    impl_->stop_cv.wait(lock, done);
  } else {
    impl_->stop_cv.wait_for(lock, timeout, done);
  }
  return impl_->signal;
}

void HttpServer::Shutdown(std::chrono::milliseconds drain) {
  if (!started_ || stopped_) return;
  stopped_ = true;
  std::shared_ptr<Impl> impl = impl_;
  {
    std::lock_guard lock(impl->stop_mu);
    impl->stop_requested = true;
    impl->stop_cv.notify_all();
  }
  impl->draining = true;
  asio::post(impl->acceptor->get_executor(), [impl] {
    boost::system::error_code ignored;
    impl->acceptor->close(ignored);
    impl->accept_retry->cancel();
  });
  // The signal wait stays armed while draining: a second signal exits at once (WaitForSignals).
  ForEachConnection(impl, /*force=*/false);  // idle connections close now, busy ones after their response
  const auto deadline = std::chrono::steady_clock::now() + drain;
  while (impl->active_requests.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (impl->active_requests.load() > 0) {
    LOG_WARN("http: {} request(s) still in flight at shutdown; closing their connections",
             impl->active_requests.load());
  }
  ForEachConnection(impl, /*force=*/true);
  // Let the closes run, then stop the threads.
  const auto close_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (impl->open_connections.load() > 0 && std::chrono::steady_clock::now() < close_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  impl->ioc->stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Run what the closes left queued (aborted operations) so connections release the Impl.
  impl->ioc->restart();
  impl->ioc->poll();
}

std::string HttpRequest::Header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

std::string_view HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

}  // namespace stoke
