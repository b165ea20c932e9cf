// Internal to net/http: the server's shared state and the connection entry points (http_connection.cc).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "net/http/http_server.h"

namespace stoke {

class HttpConnection;

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o);
  ~Impl();

  HttpServerOptions options;
  std::map<std::string, std::map<std::string, HttpHandler>>
      routes;  // path -> method -> handler; fixed at Start
  std::map<std::string, HttpHandler> prefix_routes;  // prefix -> handler, for paths without a route
  std::atomic<int> active_requests{0};
  std::atomic<int> open_connections{0};
  std::atomic<int64_t> refused_connections{0};  // over max_connections
  std::atomic<bool> draining{false};

  std::mutex stop_mu;  // guards signal, stop_requested
  std::condition_variable stop_cv;
  int signal = 0;
  bool stop_requested = false;

  std::mutex conns_mu;  // guards conns
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> conns;

  // Declared last, destroyed first (see ~Impl): the io objects before the io_context they belong to.
  std::unique_ptr<boost::asio::io_context> ioc;
  // On a strand of its own, shared with accept_retry: accepting, retrying and closing never overlap.
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor;
  std::unique_ptr<boost::asio::signal_set> signals;
  std::unique_ptr<boost::asio::steady_timer> accept_retry;
};

// Takes ownership of an accepted socket (whose executor is a fresh strand) and starts reading requests.
void StartConnection(const std::shared_ptr<HttpServer::Impl>& impl, boost::asio::ip::tcp::socket socket);

// force = false: close connections that are between requests (others close after their response, since the
// server is draining); force = true: close every connection now (pending exchanges see a disconnect).
void ForEachConnection(const std::shared_ptr<HttpServer::Impl>& impl, bool force);

}  // namespace stoke
