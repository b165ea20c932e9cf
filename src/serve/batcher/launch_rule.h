// The launch rule of the dynamic batcher: given the queued requests in scan order (priority 1 first, then
// arrival) and the time, close a batch now or say when to look again. Pure: no clock, no threads, so tests
// replay timelines by hand. docs/batching.md states the rule in prose; this is the reference.
//
// Scan the queue adding requests (their rows) while
//   - the batch stays within max_batch_size rows            (else: closes "full")
//   - rows x longest tokens stays within max_batch_tokens   (else: closes "token_budget")
// remembering the longest prefix whose rows equal a preferred size. Then, in order:
//   1. a preferred size was reached and the oldest request has not waited max_queue_delay yet
//        -> send the largest preferred prefix                                    ("preferred")
//   2. the scan stopped because the next request did not fit, or the batch is max_batch_size rows
//        -> send what fits                                                        ("full" / "token_budget")
//   3. rows >= the largest preferred size, the delay not expired                  ("preferred")
//   4. the oldest queued request has waited max_queue_delay (or the delay is 0)
//        -> send what is pending                                                  ("delay" / "immediate")
//   5. otherwise hold: look again at oldest_enqueue + max_queue_delay.
// Batching off: each request is its own batch ("unbatched"). The scan never skips a request (FIFO within a
// level), so one large request ends a batch early; that is the price of never reordering.
#pragma once

#include <cstdint>
#include <span>

#include "base/clock.h"
#include "serve/batcher/batcher_config.h"

namespace stoke {

enum class CloseReason : uint8_t { kFull, kPreferred, kDelay, kImmediate, kTokenBudget, kUnbatched };
inline constexpr int kNumCloseReasons = 6;
const char* CloseReasonName(CloseReason r);  // "full", "preferred", "delay", "immediate", "token_budget", ...

// One queued request as the rule sees it.
struct PendingRequest {
  int64_t rows = 1;    // its batch dim
  int64_t tokens = 0;  // longest row in tokens (0: not counted against max_batch_tokens)
  Nanos enqueue = 0;   // when it entered the queue
};

struct LaunchDecision {
  bool launch = false;
  size_t count = 0;  // requests to take from the front of the scan order
  int64_t rows = 0;  // their rows
  CloseReason reason = CloseReason::kImmediate;
  Nanos wake_at = 0;  // !launch: when the rule may change its mind without new arrivals (0: never)
};

struct LaunchRuleParams {
  int max_batch_size = 0;  // 0: the model does not batch
  bool batching = false;   // dynamic batching on
  DynamicBatchingOptions options;
};

// `pending` in scan order; `oldest_enqueue` = the earliest enqueue time of any queued request (it is what
// the delay holds, and it may sit behind higher-priority requests).
LaunchDecision DecideLaunch(std::span<const PendingRequest> pending, Nanos oldest_enqueue, Nanos now,
                            const LaunchRuleParams& params);

}  // namespace stoke
