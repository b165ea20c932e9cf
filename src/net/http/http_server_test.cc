#include "net/http/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <future>
#include <mutex>
#include <thread>

namespace stoke {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using ::testing::HasSubstr;

// A blocking test client on its own io_context.
class Client {
 public:
  explicit Client(int port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)));
  }
  void SendRaw(const std::string& data) { asio::write(socket_, asio::buffer(data)); }
  void Send(const std::string& method, const std::string& target, const std::string& body = "",
            const std::string& extra_headers = "") {
    SendRaw(method + " " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\n" + extra_headers + "\r\n" + body);
  }
  http::response<http::string_body> Read() {
    http::response<http::string_body> res;
    beast::error_code ec;
    http::read(socket_, buffer_, res, ec);
    last_error_ = ec;
    return res;
  }
  // True if the server closed the connection (read returns EOF).
  bool ServerClosed() {
    char c;
    beast::error_code ec;
    if (buffer_.size() > 0) return false;
    socket_.read_some(asio::buffer(&c, 1), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
  void Close() { socket_.close(); }
  tcp::socket& socket() { return socket_; }
  beast::error_code last_error_;

 private:
  asio::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

HttpServerOptions TestOptions() {
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.threads = 2;
  o.max_body_bytes = 1000;
  return o;
}

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void Echo(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  r->Send({.status = 200,
           .content_type = "text/plain",
           .body = req.method + " " + req.path + " " + req.query + " " + req.body});
}

TEST(HttpServerTest, RoutesMethodsAndErrors) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/ok", Echo);
  server.Handle("POST", "/ok", Echo);
  server.Handle("GET", "/only-get", Echo);
  ASSERT_TRUE(server.Start().ok());
  ASSERT_GT(server.port(), 0);
  Client c(server.port());

  c.Send("GET", "/ok?a=1");
  auto res = c.Read();
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res.body(), "GET /ok a=1 ");

  c.Send("POST", "/ok", "hello");
  res = c.Read();
  EXPECT_EQ(res.body(), "POST /ok  hello");

  c.Send("GET", "/nope");
  res = c.Read();
  EXPECT_EQ(res.result_int(), 404);
  EXPECT_THAT(res.body(), HasSubstr(R"("error":{"message":"no route for GET /nope")"));
  EXPECT_EQ(res[http::field::content_type], "application/json");

  c.Send("DELETE", "/only-get");
  res = c.Read();
  EXPECT_EQ(res.result_int(), 405);
  EXPECT_EQ(res[http::field::allow], "GET");
  // All of that on one keep-alive connection.
  EXPECT_EQ(server.open_connections(), 1);
  server.Shutdown(std::chrono::seconds(1));
}

// A path without an exact route goes to the longest matching prefix handler, whatever the method; none: 404.
TEST(HttpServerTest, PrefixHandlersTakeUnroutedPaths) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/v2/exact", Echo);
  auto tagged = [](std::string tag) {
    return [tag](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
      r->Send({.status = 404, .content_type = "text/plain", .body = tag + " " + req.method + " " + req.path});
    };
  };
  server.HandlePrefix("/v2/", tagged("v2"));
  server.HandlePrefix("/v2/models/", tagged("models"));
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  const std::pair<std::string, std::string> cases[] = {
      {"/v2/exact", "GET /v2/exact  "},                   // an exact route wins
      {"/v2/other", "v2 GET /v2/other"},                  // the only prefix that matches
      {"/v2/models/x/infer", "models GET /v2/models/x/infer"},  // the longest prefix
  };
  for (const auto& [path, body] : cases) {
    c.Send("GET", path);
    EXPECT_EQ(c.Read().body(), body) << path;
  }
  c.Send("DELETE", "/v2/models/x");  // any method
  EXPECT_EQ(c.Read().body(), "models DELETE /v2/models/x");
  c.Send("GET", "/v1/nope");
  auto res = c.Read();
  EXPECT_EQ(res.result_int(), 404);
  EXPECT_THAT(res.body(), HasSubstr("no route for GET /v1/nope"));
  server.Shutdown(std::chrono::seconds(1));
}

TEST(HttpServerTest, BodyOverLimitGets413AndClose) {
  HttpServer server(TestOptions());
  server.Handle("POST", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.Send("POST", "/ok", std::string(5000, 'x'));
  auto res = c.Read();
  EXPECT_EQ(res.result_int(), 413);
  EXPECT_THAT(res.body(), HasSubstr("limit of 1000 bytes"));
  EXPECT_TRUE(c.ServerClosed());
  // A body at the limit is fine.
  Client c2(server.port());
  c2.Send("POST", "/ok", std::string(1000, 'y'));
  EXPECT_EQ(c2.Read().result_int(), 200);
}

TEST(HttpServerTest, ChunkedBodyOverLimitGets413) {
  HttpServer server(TestOptions());
  server.Handle("POST", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  std::string chunk(800, 'z');
  c.SendRaw("POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n320\r\n" + chunk +
            "\r\n320\r\n" + chunk + "\r\n0\r\n\r\n");
  EXPECT_EQ(c.Read().result_int(), 413);
}

TEST(HttpServerTest, MalformedRequestGets400) {
  HttpServer server(TestOptions());
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.SendRaw("GARBAGE\r\n\r\n");
  auto res = c.Read();
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_THAT(res.body(), HasSubstr("malformed HTTP request"));
}

// Header lines that arrive a few at a time add up: the limit is on the whole header, not on each read
// (Beast's own check let 10,000 short lines through a 64 KiB limit).
TEST(HttpServerTest, ManyShortHeaderLinesPastTheLimitGet431) {
  HttpServerOptions o = TestOptions();
  o.max_header_bytes = 4096;
  HttpServer server(o);
  server.Handle("GET", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.SendRaw("GET /ok HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < 200; ++i) c.SendRaw("X-Line-" + std::to_string(i) + ": v\r\n");  // ~3.4 KiB so far
  for (int i = 200; i < 2000; ++i) {
    boost::system::error_code ec;
    const std::string line = "X-Line-" + std::to_string(i) + ": v\r\n";
    asio::write(c.socket(), asio::buffer(line), ec);
    if (ec) break;  // the server answered and closed
  }
  EXPECT_EQ(c.Read().result_int(), 431);
  // Just under the limit is fine.
  Client c2(server.port());
  std::string headers;
  for (int i = 0; i < 200; ++i) headers += "X-Line-" + std::to_string(i) + ": v\r\n";
  c2.SendRaw("GET /ok HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
  EXPECT_EQ(c2.Read().result_int(), 200);
}

TEST(HttpServerTest, ApiKeyGuardsEveryRouteButHealthAndMetrics) {
  for (bool metrics_require_key : {false, true}) {
    HttpServerOptions o = TestOptions();
    o.api_key = "s3cret";
    o.metrics_require_key = metrics_require_key;
    HttpServer server(o);
    for (const char* path : {"/ok", "/health/live", "/health", "/v2/health/ready", "/metrics"}) {
      server.Handle("GET", path, Echo);
    }
    ASSERT_TRUE(server.Start().ok());
    auto status = [&](const std::string& path, const std::string& auth) {
      Client c(server.port());
      c.Send("GET", path, "", auth.empty() ? "" : "Authorization: " + auth + "\r\n");
      auto res = c.Read();
      if (res.result_int() == 401) {
        EXPECT_EQ(res[http::field::www_authenticate], "Bearer");
        EXPECT_THAT(res.body(), HasSubstr("Authorization: Bearer"));
      }
      return res.result_int();
    };
    EXPECT_EQ(status("/ok", ""), 401);
    EXPECT_EQ(status("/ok", "Bearer s3cret"), 200);
    EXPECT_EQ(status("/ok", "bearer s3cret"), 200);
    EXPECT_EQ(status("/ok", "Bearer s3cre"), 401);
    EXPECT_EQ(status("/ok", "Bearer s3crett"), 401);
    EXPECT_EQ(status("/ok", "Basic s3cret"), 401);
    EXPECT_EQ(status("/ok", "s3cret"), 401);
    EXPECT_EQ(status("/nothing", ""), 401);  // no probing for routes without the key
    EXPECT_EQ(status("/health/live", ""), 200);
    EXPECT_EQ(status("/health", ""), 200);
    EXPECT_EQ(status("/v2/health/ready", ""), 200);
    EXPECT_EQ(status("/metrics", ""), metrics_require_key ? 401 : 200);
    EXPECT_EQ(status("/metrics", "Bearer s3cret"), 200);
  }
}

TEST(HttpServerTest, ConnectionsPastTheCapGet503AndClose) {
  HttpServerOptions o = TestOptions();
  o.max_connections = 2;
  HttpServer server(o);
  server.Handle("GET", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  auto a = std::make_unique<Client>(server.port());
  Client b(server.port());
  a->Send("GET", "/ok");
  b.Send("GET", "/ok");
  ASSERT_EQ(a->Read().result_int(), 200);
  ASSERT_EQ(b.Read().result_int(), 200);
  Client c(server.port());
  auto res = c.Read();
  EXPECT_EQ(res.result_int(), 503);
  EXPECT_EQ(res[http::field::retry_after], "1");
  EXPECT_THAT(res.body(), HasSubstr("--max-connections 2"));
  EXPECT_TRUE(c.ServerClosed());
  // A connection that closes makes room.
  a.reset();
  ASSERT_TRUE(WaitFor([&] { return server.open_connections() == 1; }));
  Client d(server.port());
  d.Send("GET", "/ok");
  EXPECT_EQ(d.Read().result_int(), 200);
}

TEST(HttpServerTest, PipelinedRequestsAnsweredInOrder) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.SendRaw("GET /ok?n=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /ok?n=2 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(c.Read().body(), "GET /ok n=1 ");
  EXPECT_EQ(c.Read().body(), "GET /ok n=2 ");
}

TEST(HttpServerTest, ExpectContinueIsAnswered) {
  HttpServer server(TestOptions());
  server.Handle("POST", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.SendRaw("POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  auto interim = c.Read();  // beast reads the 100 as its own message
  EXPECT_EQ(interim.result_int(), 100);
  c.SendRaw("abc");
  EXPECT_EQ(c.Read().body(), "POST /ok  abc");
}

TEST(HttpServerTest, StreamsChunksFromAnotherThread) {
  HttpServer server(TestOptions());
  std::thread producer;
  server.Handle("GET", "/stream", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->StartStream(200, "text/event-stream");
    producer = std::thread([r] {
      for (int i = 0; i < 5; ++i) r->Write("data: " + std::to_string(i) + "\n\n");
      r->End();
    });
  });
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.Send("GET", "/stream");
  auto res = c.Read();
  producer.join();
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res[http::field::content_type], "text/event-stream");
  EXPECT_TRUE(res.chunked());
  EXPECT_EQ(res.body(), "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  // The connection is still usable.
  c.Send("GET", "/stream");
  EXPECT_EQ(c.Read().result_int(), 200);
  producer.join();
}

// EndWithTrailers: the trailer rides after the last chunk; the framing (and the keep-alive connection) is
// intact, so clients that ignore trailers see an ordinary end.
TEST(HttpServerTest, StreamEndsWithTrailers) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/stream", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->StartStream(200, "text/event-stream", {{"Trailer", "X-Stoke-Ledger"}});
    r->Write("data: 1\n\n");
    r->EndWithTrailers({{"X-Stoke-Ledger", "recv=0.001;e2e=0.002"}});
  });
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  for (int i = 0; i < 2; ++i) {
    c.Send("GET", "/stream");
    auto res = c.Read();
    ASSERT_FALSE(c.last_error_) << c.last_error_.message();
    EXPECT_EQ(res.result_int(), 200);
    EXPECT_EQ(res["Trailer"], "X-Stoke-Ledger");
    EXPECT_EQ(res.body(), "data: 1\n\n");
    EXPECT_EQ(res["X-Stoke-Ledger"], "recv=0.001;e2e=0.002");  // Beast merges trailer fields
  }
}

TEST(HttpServerTest, DisconnectWhileWaitingIsReported) {
  HttpServer server(TestOptions());
  std::promise<void> gone;
  std::shared_ptr<HttpResponder> held;
  std::mutex mu;
  server.Handle("POST", "/wait", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->OnDisconnect([&] { gone.set_value(); });
    std::lock_guard lock(mu);
    held = r;  // never answered: like a generation still running
  });
  ASSERT_TRUE(server.Start().ok());
  {
    Client c(server.port());
    c.Send("POST", "/wait", "{}");
    ASSERT_TRUE(WaitFor([&] { return server.active_requests() == 1; }));
    c.Close();
  }
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(WaitFor([&] { return server.active_requests() == 0; }));
  std::lock_guard lock(mu);
  EXPECT_TRUE(held->disconnected());
  held->Send({.status = 200, .body = "late"});  // harmless
}

TEST(HttpServerTest, DisconnectWhileStreamingIsReported) {
  HttpServer server(TestOptions());
  std::promise<void> gone;
  std::atomic<bool> stop{false};
  std::thread producer;
  server.Handle("GET", "/stream", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->OnDisconnect([&] { gone.set_value(); });
    r->StartStream(200, "text/event-stream");
    producer = std::thread([r, &stop] {
      while (!stop.load() && !r->disconnected()) {
        r->Write("data: x\n\n");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  });
  ASSERT_TRUE(server.Start().ok());
  {
    Client c(server.port());
    c.Send("GET", "/stream");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.Close();
  }
  EXPECT_EQ(gone.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  stop = true;
  producer.join();
  EXPECT_TRUE(WaitFor([&] { return server.active_requests() == 0 && server.open_connections() == 0; }));
}

// Regression: an edge-triggered readiness event for request N+1's bytes can reach the disconnect watch of
// request N+1 after the read already consumed them. Readiness alone must not count as the peer closing.
TEST(HttpServerTest, AsyncResponsesOnKeepAliveAreNotMistakenForDisconnects) {
  HttpServer server(TestOptions());
  std::atomic<int> disconnects{0};
  std::vector<std::thread> answerers;
  std::mutex mu;
  server.Handle("POST", "/later", [&](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    r->OnDisconnect([&] { disconnects.fetch_add(1); });
    std::lock_guard lock(mu);
    answerers.emplace_back([r, body = req.body] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      r->Send({.status = 200, .body = body});
    });
  });
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  for (int i = 0; i < 200; ++i) {
    // Headers and body in separate segments, as HTTP clients (httpx) often write them.
    const std::string body = std::to_string(i);
    c.SendRaw("POST /later HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
              "\r\n\r\n");
    if (i % 2) std::this_thread::sleep_for(std::chrono::microseconds(200));
    c.SendRaw(body);
    auto res = c.Read();
    ASSERT_EQ(res.result_int(), 200) << "request " << i << ": " << c.last_error_.message();
    ASSERT_EQ(res.body(), std::to_string(i));
  }
  EXPECT_EQ(disconnects.load(), 0);
  for (auto& t : answerers) t.join();
}

TEST(HttpServerTest, DroppedResponderGets500) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/forget", [](const HttpRequest&, std::shared_ptr<HttpResponder>) {});
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  c.Send("GET", "/forget");
  EXPECT_EQ(c.Read().result_int(), 500);
}

TEST(HttpServerTest, ShutdownDrainsInFlightResponses) {
  HttpServer server(TestOptions());
  std::thread late;
  server.Handle("GET", "/slow", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    late = std::thread([r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      r->Send({.status = 200, .body = "done"});
    });
  });
  ASSERT_TRUE(server.Start().ok());
  Client idle(server.port());
  Client busy(server.port());
  busy.Send("GET", "/slow");
  ASSERT_TRUE(WaitFor([&] { return server.active_requests() == 1; }));
  std::thread stopper([&] { server.Shutdown(std::chrono::seconds(60)); });
  auto res = busy.Read();
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res.body(), "done");
  EXPECT_FALSE(res.keep_alive());  // draining: the server closes after this response
  EXPECT_TRUE(idle.ServerClosed());
  stopper.join();
  late.join();
  // No longer accepting.
  EXPECT_THROW(Client(server.port()), boost::system::system_error);
}

TEST(HttpServerTest, ManyIdleKeepAliveConnections) {
  HttpServer server(TestOptions());
  server.Handle("GET", "/ok", Echo);
  ASSERT_TRUE(server.Start().ok());
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 300; ++i) clients.push_back(std::make_unique<Client>(server.port()));
  EXPECT_TRUE(WaitFor([&] { return server.open_connections() == 300; }));
  for (int i = 0; i < 300; i += 37) {
    clients[i]->Send("GET", "/ok");
    EXPECT_EQ(clients[i]->Read().result_int(), 200);
  }
  clients.clear();
  EXPECT_TRUE(WaitFor([&] { return server.open_connections() == 0; }));
}

TEST(HttpServerTest, IdleTimeoutClosesConnection) {
  HttpServerOptions o = TestOptions();
  o.idle_timeout = std::chrono::milliseconds(100);
  HttpServer server(o);
  ASSERT_TRUE(server.Start().ok());
  Client c(server.port());
  EXPECT_TRUE(c.ServerClosed());
}

// A body of known length goes from the socket straight into the request's string, in reads as large as the
// socket has: 1 MiB sent in one write arrives in a few dozen reads at most (each is one trip through the
// event loop). Before, Beast's unreserved buffer read it 512 bytes at a time: 2,049 reads.
struct SeenBody {
  std::mutex mu;
  std::vector<std::pair<std::string, int>> bodies;  // body, read_calls
};

TEST(HttpServerTest, LargeBodyArrivesWholeInFewReads) {
  auto opts = TestOptions();
  opts.max_body_bytes = 4 << 20;
  HttpServer server(opts);
  auto seen = std::make_shared<SeenBody>();
  server.Handle("POST", "/b", [seen](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    {
      std::lock_guard lock(seen->mu);
      seen->bodies.emplace_back(req.body, req.read_calls);
    }
    r->Send({.status = 200, .content_type = "text/plain", .body = std::to_string(req.body.size())});
  });
  ASSERT_TRUE(server.Start().ok());
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 11));
  auto request = [](const std::string& body) {
    return "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
           body;
  };
  Client c(server.port());
  // One write: the 1 MiB request with a small one pipelined right behind it (its bytes must stay for it).
  c.SendRaw(request(big) + request("tail"));
  EXPECT_EQ(c.Read().body(), std::to_string(big.size()));
  EXPECT_EQ(c.Read().body(), "4");
  // The header alone, then the body in three pieces: the part read with the header, then the rest.
  const std::string head = request(big).substr(0, request(big).size() - big.size());
  c.SendRaw(head + big.substr(0, 1000));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // lets the server see the first part alone
  c.SendRaw(big.substr(1000, 300000));
  c.SendRaw(big.substr(301000));
  EXPECT_EQ(c.Read().body(), std::to_string(big.size()));
  std::lock_guard lock(seen->mu);
  ASSERT_EQ(seen->bodies.size(), 3u);
  EXPECT_TRUE(seen->bodies[0].first == big);
  EXPECT_LE(seen->bodies[0].second, 64) << "socket reads for a 1 MiB body";
  EXPECT_GE(seen->bodies[0].second, 1);
  EXPECT_EQ(seen->bodies[1].first, "tail");
  EXPECT_TRUE(seen->bodies[2].first == big);
  EXPECT_LE(seen->bodies[2].second, 64);
  server.Shutdown(std::chrono::seconds(1));
}

// A client that closes in the middle of a body is a truncated request: the connection closes, nothing is
// dispatched.
TEST(HttpServerTest, BodyCutShortClosesWithoutDispatch) {
  HttpServer server(TestOptions());
  std::atomic<int> calls{0};
  server.Handle("POST", "/b", [&](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    ++calls;
    r->Send({.status = 200});
  });
  ASSERT_TRUE(server.Start().ok());
  {
    Client c(server.port());
    c.SendRaw("POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\nonly this");
    c.Close();
  }
  EXPECT_TRUE(WaitFor([&] { return server.open_connections() == 0; }));
  EXPECT_EQ(calls.load(), 0);
  server.Shutdown(std::chrono::seconds(1));
}

TEST(HttpServerTest, BindFailureIsAStatus) {
  HttpServer a(TestOptions());
  ASSERT_TRUE(a.Start().ok());
  HttpServerOptions o = TestOptions();
  o.port = a.port();
  HttpServer b(o);
  // SO_REUSEADDR lets two sockets bind only if neither listens; the second listen fails.
  Status s = b.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  HttpServerOptions bad = TestOptions();
  bad.host = "not-an-ip";
  EXPECT_EQ(HttpServer(bad).Start().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoke
