#include "serve/batcher/batch_queue.h"

#include <algorithm>
#include <limits>

namespace stoke {

BatchQueue::BatchQueue(const BatcherConfig& config) {
  params_.max_batch_size = config.max_batch_size;
  params_.batching = config.batching();
  if (config.dynamic_batching) params_.options = *config.dynamic_batching;
  const DynamicBatchingOptions& o = params_.options;
  const int n = std::max(1, o.priority_levels);
  default_level_ = o.priority_levels > 0 ? o.default_priority_level : 1;
  levels_.resize(n);
  for (int i = 0; i < n; ++i) levels_[i].policy = o.PolicyFor(i + 1);
}

Status BatchQueue::Enqueue(std::unique_ptr<ClassicRequest> request, Nanos now) {
  int level = default_level_;
  const int num_levels = params_.options.priority_levels;
  if (request->priority < 0 || (num_levels > 0 && request->priority > num_levels)) {
    return InvalidArgumentError("priority {} is outside [0, {}] (0 = the model's default)", request->priority,
                                num_levels);
  }
  if (num_levels > 0 && request->priority > 0) level = request->priority;
  Level& l = levels_[level - 1];
  const QueuePolicy& p = l.policy;
  if (p.max_queue_size > 0 && static_cast<int>(l.on_time.size() + l.delayed.size()) >= p.max_queue_size) {
    return UnavailableError("the queue is full ({} requests queued at priority {}); retry later",
                            p.max_queue_size, level);
  }
  int64_t timeout_us = p.default_timeout_us;
  if (p.allow_timeout_override && request->timeout_us > 0 &&
      (timeout_us == 0 || request->timeout_us < timeout_us)) {
    timeout_us = request->timeout_us;
  }
  QueueEntry e;
  e.enqueue = now;
  e.deadline = timeout_us > 0 ? now + timeout_us * 1000 : 0;
  e.level = level;
  e.request = std::move(request);
  l.on_time.push_back(std::move(e));
  ++size_;
  return OkStatus();
}

std::vector<QueueEntry> BatchQueue::TakeExpired(Nanos now) {
  std::vector<QueueEntry> rejected;
  for (Level& l : levels_) {
    const bool any_late = std::any_of(l.on_time.begin(), l.on_time.end(), [now](const QueueEntry& e) {
      return e.deadline != 0 && e.deadline <= now;
    });
    if (!any_late) continue;
    std::deque<QueueEntry> keep;
    std::vector<QueueEntry> late;
    for (QueueEntry& e : l.on_time) {
      if (e.deadline != 0 && e.deadline <= now) {
        late.push_back(std::move(e));
      } else {
        keep.push_back(std::move(e));
      }
    }
    l.on_time = std::move(keep);
    for (QueueEntry& e : late) {
      if (l.policy.timeout_action == TimeoutAction::kReject) {
        rejected.push_back(std::move(e));
        --size_;
      } else {
        e.deadline = 0;
        // Keep the delayed queue in arrival order.
        auto pos = std::upper_bound(l.delayed.begin(), l.delayed.end(), e.enqueue,
                                    [](Nanos t, const QueueEntry& x) { return t < x.enqueue; });
        l.delayed.insert(pos, std::move(e));
      }
    }
  }
  return rejected;
}

template <typename Fn>
void BatchQueue::ForEachInScanOrder(Fn&& fn) const {
  for (const Level& l : levels_) {
    for (const QueueEntry& e : l.on_time) {
      if (!fn(e)) return;
    }
    for (const QueueEntry& e : l.delayed) {
      if (!fn(e)) return;
    }
  }
}

LaunchDecision BatchQueue::Decide(Nanos now) const {
  if (size_ == 0) return {};
  // The rule never looks past max_batch_size + 1 requests (each has at least one row).
  const size_t cap = static_cast<size_t>(std::max(1, params_.max_batch_size)) + 1;
  std::vector<PendingRequest> pending;
  pending.reserve(std::min(cap, size_));
  Nanos oldest = std::numeric_limits<Nanos>::max();
  for (const Level& l : levels_) {
    if (!l.on_time.empty()) oldest = std::min(oldest, l.on_time.front().enqueue);
    if (!l.delayed.empty()) oldest = std::min(oldest, l.delayed.front().enqueue);
  }
  const Nanos next_deadline = NextDeadline();
  ForEachInScanOrder([&](const QueueEntry& e) {
    pending.push_back({e.request->rows, e.request->tokens, e.enqueue});
    return pending.size() < cap;
  });
  LaunchDecision d = DecideLaunch(pending, oldest, now, params_);
  if (!d.launch && next_deadline != 0 && (d.wake_at == 0 || next_deadline < d.wake_at))
    d.wake_at = next_deadline;
  return d;
}

std::vector<QueueEntry> BatchQueue::Pop(const LaunchDecision& d) {
  std::vector<QueueEntry> out;
  out.reserve(d.count);
  for (Level& l : levels_) {
    for (auto* q : {&l.on_time, &l.delayed}) {
      while (out.size() < d.count && !q->empty()) {
        out.push_back(std::move(q->front()));
        q->pop_front();
      }
    }
  }
  size_ -= out.size();
  return out;
}

Nanos BatchQueue::NextDeadline() const {
  Nanos next = 0;
  for (const Level& l : levels_) {
    for (const QueueEntry& e : l.on_time) {
      if (e.deadline != 0 && (next == 0 || e.deadline < next)) next = e.deadline;
    }
  }
  return next;
}

std::vector<QueueEntry> BatchQueue::TakeAll() {
  LaunchDecision all;
  all.count = size_;
  return Pop(all);
}

}  // namespace stoke
