// The engine thread's generation events on their way to the connections that asked for them.
//
// Handing each token's event to its connection's strand from the engine thread costs a cross-thread hand-off
// (the strand's and the io_context's queue locks, and often an io thread's wake-up) per token, on the engine's
// critical path: under load the ledger put ~4.8 us of "postprocess" per token on the engine thread (an H100
// host at c=256: ~1.2 ms of a 31.6 ms step; bench/results/gpu_mixed_steps_h100_2026-12-05.json). Here the
// engine thread only appends to one queue; the first event after the queue was drained posts a drain through
// its own connection, and the drain, on an io thread, hands every queued event to its connection (from an
// io thread those hand-offs are cheap: no wake-up). One drain runs at a time and takes the events in the order
// they came, so each connection still sees its events in order. Used when OpenAiServiceOptions::
// batch_generation_events (`stoke serve --event-batching on`); on the 2-core dev VM the engine thread's
// per-token postprocess time was within noise either way (10.7-13.0 ms per 256-token request), so the default
// stays off until a GPU host measures it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "net/http/http_types.h"

namespace stoke {

class EventOutbox : public std::enable_shared_from_this<EventOutbox> {
 public:
  // Queues `fn` to run on `to`'s strand (dropped if that connection is gone by then). Any thread.
  void Push(std::weak_ptr<HttpResponder> to, std::function<void()> fn) {
    std::shared_ptr<HttpResponder> via;
    {
      std::lock_guard<std::mutex> lk(mu_);
      items_.push_back({std::move(to), std::move(fn)});
      if (draining_) return;
      // The drain goes through a connection that is still there (the newest first); none: nothing to deliver.
      for (auto it = items_.rbegin(); it != items_.rend() && !via; ++it) via = it->to.lock();
      if (!via) {
        items_.clear();
        return;
      }
      draining_ = true;
      ++drains_;
    }
    via->Post([self = shared_from_this()] { self->Drain(); });
  }

  // Drains posted so far (each carried a batch of one or more events).
  int64_t drains() const {
    std::lock_guard<std::mutex> lk(mu_);
    return drains_;
  }

 private:
  struct Item {
    std::weak_ptr<HttpResponder> to;
    std::function<void()> fn;
  };

  void Drain() {
    std::vector<Item> batch;
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (items_.empty()) {
          draining_ = false;
          return;
        }
        batch.swap(items_);
      }
      for (Item& item : batch) {
        if (std::shared_ptr<HttpResponder> r = item.to.lock()) r->Post(std::move(item.fn));
      }
      batch.clear();
    }
  }

  mutable std::mutex mu_;
  std::vector<Item> items_;
  bool draining_ = false;
  int64_t drains_ = 0;
};

}  // namespace stoke
