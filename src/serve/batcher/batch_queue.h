// The dynamic batcher's queue: one FIFO per priority level, the queue policy (max size, per-request
// timeouts, REJECT or DELAY), and the launch rule applied to it. Single-threaded and told the time, so
// tests drive it with a FakeClock; DynamicBatcher wraps it with a lock and threads.
//
//   BatchQueue q(config);
//   RETURN_IF_ERROR(q.Enqueue(std::move(req), clock.Now()));   // Unavailable when the level is full
//   for (auto& e : q.TakeExpired(now)) reject(e);              // REJECT-policy requests past their deadline
//   LaunchDecision d = q.Decide(now);
//   if (d.launch) batch = q.Pop(d); else sleep until d.wake_at (or an arrival)
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "serve/batcher/batcher_config.h"
#include "serve/batcher/classic_model.h"
#include "serve/batcher/launch_rule.h"

namespace stoke {

struct QueueEntry {
  std::unique_ptr<ClassicRequest> request;
  Nanos enqueue = 0;
  Nanos deadline = 0;  // 0 = none
  int level = 1;
};

class BatchQueue {
 public:
  explicit BatchQueue(const BatcherConfig& config);

  // Takes the request. InvalidArgument: priority outside [0, priority_levels]; Unavailable: its level
  // already holds max_queue_size requests. On error the request is dropped (its done is not called).
  Status Enqueue(std::unique_ptr<ClassicRequest> request, Nanos now);

  // Requests whose deadline passed: REJECT-policy ones are removed and returned (answer them), DELAY-policy
  // ones move behind their level's on-time requests and lose their deadline.
  std::vector<QueueEntry> TakeExpired(Nanos now);

  // The launch rule over the queue in scan order. wake_at also covers the next request deadline.
  LaunchDecision Decide(Nanos now) const;

  // Removes the first d.count requests in scan order.
  std::vector<QueueEntry> Pop(const LaunchDecision& d);

  // Earliest deadline of a queued request (0: none). The batcher wakes for it even with every instance busy.
  Nanos NextDeadline() const;

  // Removes everything (shutdown).
  std::vector<QueueEntry> TakeAll();

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Level {
    QueuePolicy policy;
    std::deque<QueueEntry> on_time;
    std::deque<QueueEntry> delayed;  // timed out under DELAY
  };
  // Scan order: level 1 on-time, level 1 delayed, level 2 ...
  template <typename Fn>
  void ForEachInScanOrder(Fn&& fn) const;

  LaunchRuleParams params_;
  int default_level_ = 1;
  std::deque<Level> levels_;  // [0] = priority 1 (a deque: Level is move-only and never relocated)
  size_t size_ = 0;
};

}  // namespace stoke
