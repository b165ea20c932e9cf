// Per-model configuration of the classic (stateless) serving path: batch size, dynamic batcher, queue policy,
// instances. Field names follow Triton's model config (kserve-v2.md §10) so a Triton user recognises them,
// and the JSON form (FromJson/ToJson) uses Triton's keys, so /v2/models/{m}/config reads like Triton's.
//
//   {"max_batch_size": 32,
//    "dynamic_batching": {"preferred_batch_size": [8, 16], "max_queue_delay_microseconds": 500,
//                         "priority_levels": 2, "default_priority_level": 2,
//                         "default_queue_policy": {"timeout_action": "REJECT",
//                                                  "default_timeout_microseconds": 0,
//                                                  "allow_timeout_override": true, "max_queue_size": 64},
//                         "priority_queue_policy": {"1": {"max_queue_size": 8}},
//                         "max_batch_tokens": 8192},
//    "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

enum class TimeoutAction : uint8_t {
  kReject,  // a request still queued at its deadline is answered 503 / UNAVAILABLE
  kDelay,   // it stays queued, behind every request of its level that has not timed out
};

struct QueuePolicy {
  TimeoutAction timeout_action = TimeoutAction::kReject;
  // Time a request may wait in the queue; 0 = no limit. Enforced by the batcher thread, which wakes for it.
  int64_t default_timeout_us = 0;
  // Whether a request's "timeout" parameter applies; it can only shorten the default (Triton's rule).
  bool allow_timeout_override = false;
  // Requests queued at this level beyond which new ones are rejected at once (503); 0 = unbounded.
  int max_queue_size = 0;
};

struct DynamicBatchingOptions {
  // A batch that reaches one of these sizes (rows) is sent at once, unless the oldest request has already
  // waited max_queue_delay. Empty: only max_batch_size counts. Triton advises leaving it empty.
  std::vector<int> preferred_batch_sizes;
  // Longest the oldest queued request is held for the batch to grow. 0 = never hold: a batch is whatever
  // queued while the instances were busy (batching only under load). Larger: bigger batches, + latency.
  int64_t max_queue_delay_us = 0;
  // Strict priority queues, 1 = highest; 0 = one queue. Lower levels can starve under load.
  int priority_levels = 0;
  int default_priority_level = 0;  // level of requests that give none; required in [1, levels] if levels > 0
  QueuePolicy default_queue_policy;
  std::map<int, QueuePolicy> priority_queue_policy;  // level -> policy overriding the default
  // stoke extension for variable-length text: a batch's padded size (rows x longest row's tokens) stays at
  // or under this; 0 = no limit. A single request larger than the budget still runs, alone.
  int64_t max_batch_tokens = 0;

  const QueuePolicy& PolicyFor(int level) const;
};

struct BatcherConfig {
  // Upper bound of the batch dim; 0 = the model does not batch (inputs have no batch dim, one request per
  // execution).
  int max_batch_size = 0;
  // Absent: dynamic batching off (each request runs alone, still queued for a free instance).
  std::optional<DynamicBatchingOptions> dynamic_batching;
  // Model instances, each with its own thread; a closed batch goes to the first free one.
  int instance_count = 1;

  bool batching() const { return max_batch_size > 0 && dynamic_batching.has_value(); }
  Status Validate() const;

  // Reads the Triton-named keys above (numbers may be JSON numbers or numeric strings); unknown keys inside
  // "dynamic_batching" are errors naming `source`. Keys of the top level other than these are ignored (the
  // caller reads its own, e.g. "type").
  static StatusOr<BatcherConfig> FromJson(const nlohmann::json& j, std::string_view source);
  // Triton-shaped: max_batch_size, dynamic_batching (when on), instance_group.
  nlohmann::json ToJson() const;
};

}  // namespace stoke
