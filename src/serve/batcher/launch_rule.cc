#include "serve/batcher/launch_rule.h"

#include <algorithm>

namespace stoke {

const char* CloseReasonName(CloseReason r) {
  static const char* const kNames[kNumCloseReasons] = {"full",      "preferred",    "delay",
                                                       "immediate", "token_budget", "unbatched"};
  return kNames[static_cast<int>(r)];
}

LaunchDecision DecideLaunch(std::span<const PendingRequest> pending, Nanos oldest_enqueue, Nanos now,
                            const LaunchRuleParams& params) {
  LaunchDecision d;
  if (pending.empty()) return d;
  if (!params.batching || params.max_batch_size <= 0) {
    d.launch = true;
    d.count = 1;
    d.rows = pending[0].rows;
    d.reason = CloseReason::kUnbatched;
    return d;
  }
  const DynamicBatchingOptions& o = params.options;
  const int64_t max_rows = params.max_batch_size;

  int64_t rows = 0;
  int64_t longest = 0;
  size_t count = 0;
  bool stopped = false;  // the next request did not fit, or the batch is full
  CloseReason stop_reason = CloseReason::kFull;
  size_t preferred_count = 0;
  int64_t preferred_rows = 0;
  for (const PendingRequest& p : pending) {
    const int64_t new_rows = rows + p.rows;
    const int64_t new_longest = std::max(longest, p.tokens);
    if (count > 0 && new_rows > max_rows) {
      stopped = true;
      stop_reason = CloseReason::kFull;
      break;
    }
    if (count > 0 && o.max_batch_tokens > 0 && new_rows * new_longest > o.max_batch_tokens) {
      stopped = true;
      stop_reason = CloseReason::kTokenBudget;
      break;
    }
    rows = new_rows;
    longest = new_longest;
    ++count;
    if (std::find(o.preferred_batch_sizes.begin(), o.preferred_batch_sizes.end(), rows) !=
        o.preferred_batch_sizes.end()) {
      preferred_count = count;
      preferred_rows = rows;
    }
    if (rows >= max_rows) {
      stopped = true;
      stop_reason = CloseReason::kFull;
      break;
    }
  }

  const Nanos delay = o.max_queue_delay_us * 1000;
  const bool delay_exceeded = delay == 0 || now - oldest_enqueue >= delay;
  auto launch = [&](size_t n, int64_t r, CloseReason why) {
    d.launch = true;
    d.count = n;
    d.rows = r;
    d.reason = why;
    return d;
  };
  if (preferred_count > 0 && !delay_exceeded)
    return launch(preferred_count, preferred_rows, CloseReason::kPreferred);
  if (stopped) return launch(count, rows, stop_reason);
  if (!delay_exceeded && !o.preferred_batch_sizes.empty() &&
      rows >= *std::max_element(o.preferred_batch_sizes.begin(), o.preferred_batch_sizes.end())) {
    return launch(count, rows, CloseReason::kPreferred);
  }
  if (delay_exceeded) return launch(count, rows, delay == 0 ? CloseReason::kImmediate : CloseReason::kDelay);
  d.wake_at = oldest_enqueue + delay;
  return d;
}

}  // namespace stoke
