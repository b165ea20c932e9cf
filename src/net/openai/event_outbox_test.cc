// EventOutbox: one drain per batch of events, each connection's events delivered in order, events of gone
// connections dropped, and order kept when the engine thread pushes while an io thread drains.
#include "net/openai/event_outbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <thread>

namespace stoke {
namespace {

// A stand-in for the io threads: every Post (from any responder) queues on one FIFO, run by RunAll / a worker.
struct IoQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> q;
  void Push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu);
      q.push_back(std::move(fn));
    }
    cv.notify_one();
  }
  bool RunOne() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (q.empty()) return false;
      fn = std::move(q.front());
      q.pop_front();
    }
    fn();
    return true;
  }
  int RunAll() {
    int n = 0;
    while (RunOne()) ++n;
    return n;
  }
};

class QueuedResponder final : public HttpResponder {
 public:
  explicit QueuedResponder(IoQueue* io) : io_(io) {}
  void Send(HttpResponse) override {}
  void StartStream(int, std::string, HttpHeaders) override {}
  void Write(std::string) override {}
  void End() override {}
  void Post(std::function<void()> fn) override {
    ++posts;
    io_->Push(std::move(fn));
  }
  void OnDisconnect(std::function<void()>) override {}
  void OnComplete(std::function<void(bool, Nanos)>) override {}
  bool disconnected() const override { return false; }
  std::atomic<int> posts{0};
  std::vector<int> got;  // touched only by the (single) io runner

 private:
  IoQueue* io_;
};

TEST(EventOutbox, OneDrainPerBatchAndEachConnectionInOrder) {
  IoQueue io;
  auto outbox = std::make_shared<EventOutbox>();
  std::vector<std::shared_ptr<QueuedResponder>> r;
  for (int i = 0; i < 4; ++i) r.push_back(std::make_shared<QueuedResponder>(&io));
  // A step's worth of events (25 per connection) before any io thread runs: one hand-off (the drain), not 100.
  for (int k = 0; k < 25; ++k) {
    for (int i = 0; i < 4; ++i) {
      QueuedResponder* to = r[i].get();
      outbox->Push(r[i], [to, k] { to->got.push_back(k); });
    }
  }
  EXPECT_EQ(outbox->drains(), 1);
  int posts = 0;
  for (auto& x : r) posts += x->posts;
  EXPECT_EQ(posts, 1);
  io.RunAll();  // the drain hands each event to its connection; those run too
  for (auto& x : r) {
    ASSERT_EQ(x->got.size(), 25u);
    for (int k = 0; k < 25; ++k) EXPECT_EQ(x->got[k], k);
  }
  // The next step's events start a new drain.
  outbox->Push(r[0], [to = r[0].get()] { to->got.push_back(99); });
  EXPECT_EQ(outbox->drains(), 2);
  io.RunAll();
  EXPECT_EQ(r[0]->got.back(), 99);
}

TEST(EventOutbox, EventsOfGoneConnectionsAreDropped) {
  IoQueue io;
  auto outbox = std::make_shared<EventOutbox>();
  auto alive = std::make_shared<QueuedResponder>(&io);
  int ran = 0;
  {
    auto gone = std::make_shared<QueuedResponder>(&io);
    std::weak_ptr<HttpResponder> w = gone;
    gone.reset();
    outbox->Push(w, [&] { ++ran; });  // nobody to deliver to: no drain at all
    EXPECT_EQ(outbox->drains(), 0);
  }
  auto soon_gone = std::make_shared<QueuedResponder>(&io);
  outbox->Push(alive, [&] { ++ran; });
  outbox->Push(soon_gone, [&] { ran += 100; });
  soon_gone.reset();  // before the drain runs
  io.RunAll();
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(outbox->drains(), 1);
}

TEST(EventOutbox, OrderHoldsWhileTheEngineThreadPushesDuringDrains) {
  IoQueue io;
  auto outbox = std::make_shared<EventOutbox>();
  constexpr int kConns = 8, kSteps = 2000;
  std::vector<std::shared_ptr<QueuedResponder>> r;
  for (int i = 0; i < kConns; ++i) r.push_back(std::make_shared<QueuedResponder>(&io));
  std::atomic<bool> stop{false};
  std::thread runner([&] {  // one io thread
    while (!stop) {
      if (!io.RunOne()) std::this_thread::yield();
    }
    io.RunAll();
  });
  for (int k = 0; k < kSteps; ++k) {
    for (int i = 0; i < kConns; ++i) {
      QueuedResponder* to = r[i].get();
      outbox->Push(r[i], [to, k] { to->got.push_back(k); });
    }
  }
  // Let the runner finish what is queued (a drain may still be going).
  for (int spin = 0; spin < 2000; ++spin) {
    bool all = true;
    for (auto& x : r) all = all && x->posts > 0;
    {
      std::lock_guard<std::mutex> lk(io.mu);
      all = all && io.q.empty();
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  runner.join();
  for (auto& x : r) {
    ASSERT_EQ(x->got.size(), static_cast<size_t>(kSteps));
    for (int k = 0; k < kSteps; ++k) ASSERT_EQ(x->got[k], k);
  }
}

}  // namespace
}  // namespace stoke
