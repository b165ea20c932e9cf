// One HTTP/1.1 connection on its strand, and the exchange (HttpResponder) for the request it is answering.
// See the state diagram at the top of http_server.cc.
#include "net/http/http_connection.h"

#include <sys/socket.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <deque>
#include <exception>
#include <optional>

#include "base/constant_time.h"
#include "base/logging.h"

namespace stoke {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

HttpServer::Impl::Impl(HttpServerOptions o)
    : options(std::move(o)),
      ioc(std::make_unique<asio::io_context>()),
      acceptor(std::make_unique<tcp::acceptor>(asio::make_strand(*ioc))),
      signals(std::make_unique<asio::signal_set>(*ioc)),
      accept_retry(std::make_unique<asio::steady_timer>(acceptor->get_executor())) {
  if (!options.error_body) options.error_body = DefaultHttpErrorBody;
}

HttpServer::Impl::~Impl() {
  accept_retry.reset();
  signals.reset();
  acceptor.reset();
  ioc.reset();  // destroys queued handlers (and the connections only they held) while the rest is alive
}

namespace {

constexpr size_t kReadChunk = 64 * 1024;  // Beast's largest single read

std::string SerializeHead(int status, std::string_view content_type, const HttpHeaders& headers,
                          bool keep_alive, std::optional<size_t> content_length) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", status, HttpReason(status));
  if (!content_type.empty()) out += fmt::format("Content-Type: {}\r\n", content_type);
  if (content_length) {
    out += fmt::format("Content-Length: {}\r\n", *content_length);
  } else {
    out += "Transfer-Encoding: chunked\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  for (const auto& [name, value] : headers) out += fmt::format("{}: {}\r\n", name, value);
  out += "\r\n";
  return out;
}

std::string SerializeResponse(const HttpResponse& r, bool keep_alive) {
  std::string out = SerializeHead(r.status, r.content_type, r.headers, keep_alive, r.body.size());
  out += r.body;
  return out;
}

std::string Chunk(std::string_view data) {
  return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
}
constexpr std::string_view kLastChunk = "0\r\n\r\n";

// Routes open without an API key: health checks (load balancers and orchestrators probe them without
// credentials) and, unless told otherwise, the Prometheus scrape.
bool IsOpenPath(std::string_view path, bool metrics_require_key) {
  if (path == "/health" || path.starts_with("/health/") || path.starts_with("/v2/health/")) return true;
  return path == "/metrics" && !metrics_require_key;
}

// "Authorization: Bearer <key>" (the scheme's case does not matter), the key compared in constant time.
bool HasApiKey(const HttpRequest& req, std::string_view key) {
  const std::string value = req.Header("authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() || !beast::iequals(beast::string_view(value.data(), kScheme.size()),
                                                       beast::string_view(kScheme.data(), kScheme.size()))) {
    return false;
  }
  std::string_view token = std::string_view(value).substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  return ConstantTimeEquals(key, token);
}

}  // namespace

class HttpExchange;

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<HttpServer::Impl> impl, tcp::socket socket)
      : impl_(std::move(impl)), stream_(std::move(socket)) {}

  ~HttpConnection() {
    if (state_ == State::kClosed) return;
    impl_->open_connections.fetch_sub(1);
    std::lock_guard lock(impl_->conns_mu);
    impl_->conns.erase(this);
  }

  auto executor() { return stream_.get_executor(); }
  // Whether the response being written may promise keep-alive (not once the server is draining).
  bool KeepAlive() const { return keep_alive_ && !impl_->draining.load(); }

  void Start() {
    impl_->open_connections.fetch_add(1);
    {
      std::lock_guard lock(impl_->conns_mu);
      impl_->conns[this] = weak_from_this();
    }
    error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);  // SSE chunks go out as they come
    asio::dispatch(executor(), [self = shared_from_this()] { self->DoRead(); });
  }

  // On the strand, from the exchange.
  void QueueWrite(uint64_t exchange_id, std::string data, bool ends_response);
  void Abandon(uint64_t exchange_id, bool streaming);

  void CloseIfIdle() {
    if (state_ == State::kReading && recv_time_ == 0) Close();
  }
  void Close();

 private:
  enum class State { kReading, kHandling, kDraining, kClosed };

  void DoRead();
  void ReadSome();
  void OnSocketRead(error_code ec, size_t bytes);
  void OnRead(error_code ec);
  void ReadBody();
  void OnBody(error_code ec, size_t bytes);
  void OnReadError(error_code ec);
  void OnRequest();
  void Dispatch(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);
  // Calls a route's handler; one that throws answers 500 (a bug in a handler must not take the server down).
  void Run(const HttpHandler& handler, const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);
  void FailRequest(int status, std::string_view message);  // reading-state errors: respond, then close
  void DoWrite();
  void OnWrite(error_code ec);
  void ResponseDone(Nanos written_at);
  void StartWatch();
  void OnWatch(error_code ec, uint64_t gen);
  void ClientGone();
  void DrainAndClose();

  std::shared_ptr<HttpServer::Impl> impl_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  State state_ = State::kReading;
  Nanos recv_time_ = 0;
  bool continue_sent_ = false;
  int read_calls_ = 0;       // socket reads for the request being read (HttpRequest::read_calls)
  size_t header_bytes_ = 0;  // header bytes the parser consumed so far (the request being read)

  struct PendingWrite {
    std::string data;
    bool ends_response = false;
  };
  Nanos written_at_ = 0;  // when the front write's last byte went to the socket, if it went at once
  std::deque<PendingWrite> writes_;
  bool writing_ = false;
  bool close_after_write_ = false;

  // The exchange being answered (kHandling). Weak: the handler (or an engine callback) owns it.
  std::weak_ptr<HttpExchange> exchange_;
  uint64_t exchange_id_ = 0;
  bool keep_alive_ = true;
  bool active_ = false;  // counted in impl_->active_requests
  uint64_t watch_gen_ = 0;
  char drain_buf_[4096];
};

class HttpExchange final : public HttpResponder, public std::enable_shared_from_this<HttpExchange> {
 public:
  HttpExchange(std::shared_ptr<HttpConnection> conn, uint64_t id) : conn_(std::move(conn)), id_(id) {}

  ~HttpExchange() override {
    // The handler dropped its responder without finishing: answer 500 (or end the stream) so the client
    // isn't left hanging. Posted: the connection may be on another thread.
    if (phase_ != Phase::kDone && !disconnected_.load()) {
      asio::post(conn_->executor(), [c = conn_, id = id_, streaming = phase_ == Phase::kStreaming] {
        c->Abandon(id, streaming);
      });
    }
  }

  void Send(HttpResponse response) override {
    Post([self = shared_from_this(), r = std::move(response)]() mutable {
      if (self->phase_ != Phase::kPending) return;
      self->phase_ = Phase::kDone;
      self->conn_->QueueWrite(self->id_, SerializeResponse(r, self->conn_->KeepAlive()), true);
    });
  }

  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    Post([self = shared_from_this(), status, ct = std::move(content_type), h = std::move(headers)]() mutable {
      if (self->phase_ != Phase::kPending) return;
      self->phase_ = Phase::kStreaming;
      h.emplace_back("Cache-Control", "no-cache");
      self->conn_->QueueWrite(self->id_, SerializeHead(status, ct, h, self->conn_->KeepAlive(), std::nullopt),
                              false);
    });
  }

  void Write(std::string data) override {
    if (data.empty()) return;  // an empty chunk would end the stream
    Post([self = shared_from_this(), d = std::move(data)] {
      if (self->phase_ != Phase::kStreaming) return;
      self->conn_->QueueWrite(self->id_, Chunk(d), false);
    });
  }

  void End() override {
    Post([self = shared_from_this()] {
      if (self->phase_ != Phase::kStreaming) return;
      self->phase_ = Phase::kDone;
      self->conn_->QueueWrite(self->id_, std::string(kLastChunk), true);
    });
  }

  void EndWithTrailers(HttpHeaders trailers) override {
    Post([self = shared_from_this(), t = std::move(trailers)] {
      if (self->phase_ != Phase::kStreaming) return;
      self->phase_ = Phase::kDone;
      std::string last = "0\r\n";
      for (const auto& [name, value] : t) last += fmt::format("{}: {}\r\n", name, value);
      last += "\r\n";
      self->conn_->QueueWrite(self->id_, std::move(last), true);
    });
  }

  void Post(std::function<void()> fn) override { asio::dispatch(conn_->executor(), std::move(fn)); }

  void OnDisconnect(std::function<void()> fn) override {
    Post([self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (self->disconnected_.load()) {
        fn();
      } else {
        self->on_disconnect_ = std::move(fn);
      }
    });
  }

  void OnComplete(std::function<void(bool, Nanos)> fn) override {
    Post([self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (self->completed_) {
        fn(self->completed_ok_, self->completed_at_);
      } else {
        self->on_complete_ = std::move(fn);
      }
    });
  }

  bool disconnected() const override { return disconnected_.load(); }

  // On the strand, from the connection.
  void MarkDisconnected() {
    if (disconnected_.exchange(true)) return;
    if (on_disconnect_) std::exchange(on_disconnect_, nullptr)();
  }
  void Complete(bool ok, Nanos when) {
    if (completed_) return;
    completed_ = true;
    completed_ok_ = ok;
    completed_at_ = when;
    phase_ = Phase::kDone;
    if (on_complete_) std::exchange(on_complete_, nullptr)(ok, when);
  }

 private:
  enum class Phase { kPending, kStreaming, kDone };
  std::shared_ptr<HttpConnection> conn_;
  const uint64_t id_;
  // Strand-only state.
  Phase phase_ = Phase::kPending;
  std::function<void()> on_disconnect_;
  std::function<void(bool, Nanos)> on_complete_;
  bool completed_ = false;
  bool completed_ok_ = false;
  Nanos completed_at_ = 0;
  std::atomic<bool> disconnected_{false};
};

void HttpConnection::DoRead() {
  if (state_ == State::kClosed) return;
  if (impl_->draining.load()) {
    Close();
    return;
  }
  state_ = State::kReading;
  parser_.emplace();
  parser_->body_limit(impl_->options.max_body_bytes);
  parser_->header_limit(static_cast<uint32_t>(impl_->options.max_header_bytes));
  continue_sent_ = false;
  read_calls_ = 0;
  header_bytes_ = 0;
  // Beast reads at most what the buffer has room for (at least 512 bytes, at most 64 KiB): without room, a
  // body came in 512-byte reads, each a trip through the event loop (a 1 MiB body: ~2,000 of them).
  if (buffer_.capacity() < kReadChunk) buffer_.reserve(kReadChunk);
  recv_time_ = buffer_.size() > 0 ? MonotonicNanos() : 0;  // a pipelined request already arrived
  if (buffer_.size() == 0) {
    ReadSome();
    return;
  }
  // Parsing what is buffered may dispatch the next request at once: never inside the caller (OnWrite, still
  // working on its write queue), so through the strand.
  asio::post(executor(), [self = shared_from_this()] {
    if (self->state_ == State::kReading) self->ReadSome();
  });
}

// Parses what is buffered, and reads from the socket when the parser needs more. This is Beast's
// http::async_read_some done by hand, for one reason: Beast checks its header limit per parse call, not over
// the whole header, so header lines that arrive a few at a time (10,000 lines of 11 bytes) passed a 64 KiB
// limit, and a client could grow a header without bound until the request timeout.
void HttpConnection::ReadSome() {
  if (buffer_.size() > 0) {
    error_code ec;
    const bool header_was_done = parser_->is_header_done();
    const size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    if (!header_was_done) {
      // What the parser consumed is header (it stops at the header's end); while the header is unfinished,
      // what is still buffered is too.
      header_bytes_ += used;
      const size_t pending = parser_->is_header_done() ? 0 : buffer_.size();
      if (header_bytes_ + pending > impl_->options.max_header_bytes) ec = http::error::header_limit;
    }
    if (ec != http::error::need_more) {
      OnRead(ec);
      return;
    }
  }
  if (recv_time_ == 0) {
    stream_.expires_after(impl_->options.idle_timeout);
  } else {
    const auto left = std::chrono::nanoseconds(
        recv_time_ + std::chrono::nanoseconds(impl_->options.request_timeout).count() - MonotonicNanos());
    stream_.expires_after(std::max(left, std::chrono::nanoseconds(1)));
  }
  stream_.async_read_some(buffer_.prepare(kReadChunk), [self = shared_from_this()](error_code ec, size_t n) {
    self->OnSocketRead(ec, n);
  });
}

void HttpConnection::OnSocketRead(error_code ec, size_t bytes) {
  if (state_ != State::kReading) return;
  buffer_.commit(bytes);
  if (bytes > 0) {
    ++read_calls_;
    if (recv_time_ == 0) recv_time_ = MonotonicNanos();
  }
  if (ec == asio::error::eof) {
    if (!parser_->got_some()) {
      OnRead(http::error::end_of_stream);  // a quiet close between requests
      return;
    }
    error_code eof_ec;
    parser_->put_eof(eof_ec);  // a message whose end is the close, or a truncated one
    OnRead(eof_ec);
    return;
  }
  if (ec) {
    OnRead(ec);
    return;
  }
  ReadSome();
}

void HttpConnection::OnRead(error_code ec) {
  if (state_ != State::kReading) return;
  if (ec) {
    OnReadError(ec);
    return;
  }
  if (!continue_sent_ && parser_->is_header_done() && !parser_->is_done()) {
    auto expect = parser_->get()[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      continue_sent_ = true;
      QueueWrite(0, "HTTP/1.1 100 Continue\r\n\r\n", false);
    }
  }
  if (parser_->is_done()) {
    OnRequest();
  } else if (parser_->is_header_done() && !parser_->chunked() && parser_->content_length()) {
    ReadBody();
  } else {
    ReadSome();
  }
}

// A body of known length: read straight into the request's body string (sized once, from Content-Length), in
// reads as large as the socket has bytes, instead of through the parser's buffer.
void HttpConnection::ReadBody() {
  auto& body = parser_->get().body();
  const size_t total = static_cast<size_t>(*parser_->content_length());
  const size_t have = body.size();  // what the parser already moved into the body
  body.resize(total);               // no reallocation: the parser reserved Content-Length
  const size_t from_buffer = std::min(buffer_.size(), total - have);
  if (from_buffer > 0) {
    asio::buffer_copy(asio::buffer(body.data() + have, from_buffer), buffer_.data());
    buffer_.consume(from_buffer);
  }
  const size_t filled = have + from_buffer;
  if (filled == total) {
    OnBody({}, 0);
    return;
  }
  const auto left = std::chrono::nanoseconds(
      recv_time_ + std::chrono::nanoseconds(impl_->options.request_timeout).count() - MonotonicNanos());
  stream_.expires_after(std::max(left, std::chrono::nanoseconds(1)));
  // Each read asks for everything still missing (asio's transfer_all would cap a read at 64 KiB). The
  // condition runs on this strand before each read (first with 0 done), so it also counts them.
  const size_t want = total - filled;
  auto until_done = [this, first = true, want](const error_code& ec, size_t done) mutable -> size_t {
    if (!first) ++read_calls_;
    first = false;
    return ec || done >= want ? 0 : want - done;
  };
  asio::async_read(stream_, asio::buffer(body.data() + filled, want), std::move(until_done),
                   [self = shared_from_this()](error_code ec, size_t n) { self->OnBody(ec, n); });
}

void HttpConnection::OnBody(error_code ec, size_t bytes) {
  (void)bytes;
  if (state_ != State::kReading) return;
  if (ec) {
    // Mid-body, an end of stream is a truncated message, not a quiet close between requests.
    OnReadError(ec == asio::error::eof ? http::error::partial_message : ec);
    return;
  }
  OnRequest();
}

void HttpConnection::OnReadError(error_code ec) {
  if (ec == http::error::body_limit) {
    FailRequest(413, fmt::format("request body is larger than the limit of {} bytes (--max-body-bytes)",
                                 impl_->options.max_body_bytes));
  } else if (ec == http::error::header_limit) {
    FailRequest(431, "request headers are too large");
  } else if (ec == beast::error::timeout && recv_time_ != 0) {
    FailRequest(408, "the request did not arrive in time");
  } else if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
             ec != http::error::end_of_stream && ec != http::error::partial_message) {
    FailRequest(400, fmt::format("malformed HTTP request: {}", ec.message()));
  } else {
    Close();  // EOF between requests, idle timeout, reset
  }
}

void HttpConnection::OnRequest() {
  auto msg = parser_->release();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  const size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& field : msg) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[name] = std::string(field.value());
  }
  req.body = std::move(msg.body());
  req.recv_time = recv_time_ != 0 ? recv_time_ : MonotonicNanos();
  req.parsed_time = MonotonicNanos();
  req.read_calls = read_calls_;
  req.keep_alive = msg.keep_alive() && !impl_->draining.load();

  state_ = State::kHandling;
  stream_.expires_never();
  keep_alive_ = req.keep_alive;
  auto ex = std::make_shared<HttpExchange>(shared_from_this(), ++exchange_id_);
  exchange_ = ex;
  active_ = true;
  impl_->active_requests.fetch_add(1);
  StartWatch();
  Dispatch(req, ex);
}

void HttpConnection::Dispatch(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  auto error = [&](int status, std::string_view message, HttpHeaders headers = {}) {
    ex->Send({.status = status,
              .body = impl_->options.error_body(status, message),
              .headers = std::move(headers)});
  };
  const HttpServerOptions& o = impl_->options;
  if (!o.api_key.empty() && !IsOpenPath(req.path, o.metrics_require_key) && !HasApiKey(req, o.api_key)) {
    error(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
          {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  auto route = impl_->routes.find(req.path);
  if (route == impl_->routes.end()) {
    const HttpHandler* prefix_handler = nullptr;
    size_t longest = 0;
    for (const auto& [prefix, h] : impl_->prefix_routes) {
      if (req.path.starts_with(prefix) && prefix.size() >= longest) {
        prefix_handler = &h;
        longest = prefix.size();
      }
    }
    if (prefix_handler == nullptr) {
      error(404, fmt::format("no route for {} {}", req.method, req.path));
      return;
    }
    Run(*prefix_handler, req, ex);
    return;
  }
  auto handler = route->second.find(req.method);
  if (handler == route->second.end()) {
    std::string allow;
    for (const auto& [method, h] : route->second) allow += (allow.empty() ? "" : ", ") + method;
    error(405, fmt::format("{} does not support {} (allowed: {})", req.path, req.method, allow),
          {{"Allow", allow}});
    return;
  }
  Run(handler->second, req, ex);
}

void HttpConnection::Run(const HttpHandler& handler, const HttpRequest& req,
                         const std::shared_ptr<HttpExchange>& ex) {
  try {
    handler(req, ex);
  } catch (const std::exception& e) {  // a bug in a handler must not take the server down
    LOG_ERROR("http: handler for {} {} threw: {}", req.method, req.path, e.what());
    ex->Send({.status = 500, .body = impl_->options.error_body(500, "internal error")});
  }
}

void HttpConnection::FailRequest(int status, std::string_view message) {
  LOG_DEBUG("http: {} {}", status, message);
  state_ = State::kHandling;
  close_after_write_ = true;
  HttpResponse r{.status = status, .body = impl_->options.error_body(status, message)};
  QueueWrite(0, SerializeResponse(r, /*keep_alive=*/false), false);
}

void HttpConnection::QueueWrite(uint64_t exchange_id, std::string data, bool ends_response) {
  if (state_ == State::kClosed || state_ == State::kDraining) return;
  if (exchange_id != 0 && (exchange_id != exchange_id_ || !active_)) return;  // a stale exchange
  writes_.push_back({std::move(data), ends_response});
  if (!writing_) DoWrite();
}

void HttpConnection::DoWrite() {
  writing_ = true;
  // Try the write now, without blocking: a response that fits the socket's send buffer (nearly every one) is
  // on the wire here and its "last byte written" stamped at the syscall, not when the event loop gets round
  // to the completion. The completion itself is still posted, never run inside the caller's Send/Write (which
  // may hold a lock its on_complete callback takes). Anything not written at once, and every error, takes the
  // asynchronous path as before.
  const std::string& data = writes_.front().data;
  error_code ec;
  size_t n = 0;
  auto& socket = stream_.socket();
  if (!socket.non_blocking()) socket.non_blocking(true, ec);
  if (!ec) n = socket.write_some(asio::buffer(data), ec);
  if (!ec && n == data.size()) {
    written_at_ = MonotonicNanos();
    asio::post(executor(), [self = shared_from_this()] { self->OnWrite({}); });
    return;
  }
  if (ec) n = 0;
  asio::async_write(socket, asio::buffer(data.data() + n, data.size() - n),
                    [self = shared_from_this()](error_code ec, size_t) { self->OnWrite(ec); });
}

void HttpConnection::OnWrite(error_code ec) {
  writing_ = false;
  if (state_ == State::kClosed) return;
  if (ec) {
    Close();  // the client went away mid-response: Close reports it to the exchange
    return;
  }
  const bool ends = writes_.front().ends_response;
  writes_.pop_front();
  const Nanos written_at = std::exchange(written_at_, 0);
  if (ends) ResponseDone(written_at != 0 ? written_at : MonotonicNanos());
  if (state_ == State::kClosed) return;
  if (!writes_.empty()) {
    DoWrite();
  } else if (close_after_write_) {
    DrainAndClose();
  }
}

void HttpConnection::ResponseDone(Nanos written_at) {
  if (!active_) return;
  active_ = false;
  impl_->active_requests.fetch_sub(1);
  ++watch_gen_;  // the readability wait, if still pending, is now stale
  if (auto ex = exchange_.lock()) ex->Complete(true, written_at);
  if (!keep_alive_ || impl_->draining.load()) {
    close_after_write_ = true;
  } else if (writes_.empty()) {
    DoRead();
  }
}

void HttpConnection::Abandon(uint64_t exchange_id, bool streaming) {
  if (exchange_id != exchange_id_ || !active_) return;
  if (streaming) {
    QueueWrite(exchange_id, std::string(kLastChunk), true);
  } else {
    LOG_ERROR("http: a handler returned no response; answering 500");
    HttpResponse r{.status = 500, .body = impl_->options.error_body(500, "internal error: no response")};
    QueueWrite(exchange_id, SerializeResponse(r, KeepAlive()), true);
  }
}

void HttpConnection::StartWatch() {
  const uint64_t gen = ++watch_gen_;
  stream_.socket().async_wait(tcp::socket::wait_read,
                              [self = shared_from_this(), gen](error_code ec) { self->OnWatch(ec, gen); });
}

void HttpConnection::OnWatch(error_code ec, uint64_t gen) {
  if (gen != watch_gen_ || state_ != State::kHandling || !active_ || ec == asio::error::operation_aborted)
    return;
  if (!ec) {
    // Readiness alone proves nothing: with edge-triggered epoll, the event for bytes the last read already
    // consumed can arrive after this wait was armed. Peek without blocking to see what is really there.
    char c;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;  // the client pipelined its next request: still there (stop watching)
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      StartWatch();  // spurious: nothing to read, the peer has not closed
      return;
    }
    // n == 0: the peer shut down its side; n < 0 otherwise: reset or another socket error.
  }
  // The response's last bytes are already being written: the client may have read them all and closed before
  // this thread ran the write's completion (both events ready at once on a busy machine). The write's outcome
  // decides, not the close: OnWrite completes the exchange, or closes on an error.
  if (writing_ && !writes_.empty() && writes_.front().ends_response) return;
  LOG_DEBUG("http: client closed the connection while its response was pending");
  Close();
}

void HttpConnection::ClientGone() {
  if (!active_) return;
  active_ = false;
  impl_->active_requests.fetch_sub(1);
  if (auto ex = exchange_.lock()) {
    ex->MarkDisconnected();
    ex->Complete(false, MonotonicNanos());
  }
}

// After an error response on a connection we won't read from again: stop sending, read and discard what the
// client is still sending (briefly), then close, so the client sees our response rather than a reset.
void HttpConnection::DrainAndClose() {
  error_code ignored;
  if (state_ != State::kDraining) {
    state_ = State::kDraining;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(std::chrono::seconds(2));
  }
  stream_.async_read_some(asio::buffer(drain_buf_), [self = shared_from_this()](error_code ec, size_t) {
    if (ec) {
      self->Close();
    } else {
      self->DrainAndClose();  // keep discarding until EOF or the deadline
    }
  });
}

void HttpConnection::Close() {
  if (state_ == State::kClosed) return;
  ClientGone();
  state_ = State::kClosed;
  error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  impl_->open_connections.fetch_sub(1);
  std::lock_guard lock(impl_->conns_mu);
  impl_->conns.erase(this);
}

void StartConnection(const std::shared_ptr<HttpServer::Impl>& impl, tcp::socket socket) {
  std::make_shared<HttpConnection>(impl, std::move(socket))->Start();
}

void ForEachConnection(const std::shared_ptr<HttpServer::Impl>& impl, bool force) {
  std::vector<std::shared_ptr<HttpConnection>> conns;
  {
    std::lock_guard lock(impl->conns_mu);
    for (auto& [ptr, weak] : impl->conns) {
      if (auto c = weak.lock()) conns.push_back(std::move(c));
    }
  }
  for (auto& c : conns) {
    asio::post(c->executor(), [c, force] { force ? c->Close() : c->CloseIfIdle(); });
  }
}

std::string DefaultHttpErrorBody(int status, std::string_view message) {
  // OpenAI's error shape. Hand-built to keep nlohmann out of this layer; message is escaped for JSON.
  std::string escaped;
  for (unsigned char c : message) {
    switch (c) {
      case '"':
        escaped += "\\\"";
        break;
      case '\\':
        escaped += "\\\\";
        break;
      case '\n':
        escaped += "\\n";
        break;
      case '\r':
        escaped += "\\r";
        break;
      case '\t':
        escaped += "\\t";
        break;
      default:
        if (c < 0x20) {
          escaped += fmt::format("\\u{:04x}", c);
        } else {
          escaped += static_cast<char>(c);
        }
    }
  }
  const char* type = status >= 500 ? "server_error" : "invalid_request_error";
  return fmt::format(R"({{"error":{{"message":"{}","type":"{}","param":null,"code":{}}}}})", escaped, type,
                     status);
}

}  // namespace stoke
