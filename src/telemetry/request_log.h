// The last N finished requests with their ledgers, for GET /v1/debug/requests: a bounded ring buffer of
// plain records, filled by the net layer once a response's last byte is written. Thread-safe (one mutex,
// held only to copy a record in or the records out).
//
//   RequestLog log(1000);                       // capacity 0: disabled (Add does nothing)
//   log.Add(entry);                             // any thread
//   auto q = RequestLog::ParseQuery("model=smol&slowest=5");   // 400 on a bad value
//   std::string body = log.Json(*q);            // {"capacity":1000,"recorded":..., "requests":[...]}
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "telemetry/ledger.h"

namespace stoke {

struct RequestLogEntry {
  std::string id;
  std::string model;
  std::string api;            // "chat" | "completion" | "embeddings" | "kserve_http" | "kserve_grpc"
  int status = 200;           // HTTP status of the response (gRPC: the HTTP equivalent of its code)
  std::string finish;         // generation: "stop" | "length" | "abort" | "error"; "" otherwise
  int64_t start_unix_ms = 0;  // wall clock when its first byte arrived
  Ledger ledger;              // stages and e2e (first byte -> last byte written)
  int64_t tokens_in = 0;      // prompt tokens (embeddings: input tokens)
  int64_t tokens_out = 0;     // generated tokens
  Nanos ttft = -1;            // generation: first byte -> first token; -1 otherwise
  Nanos tpot = -1;            // generation: mean gap between its tokens after the first; -1 otherwise
};

// Wall-clock milliseconds of a moment given on the monotonic clock (MonotonicNanos).
int64_t UnixMillisAt(Nanos monotonic);

class RequestLog {
 public:
  struct Query {
    std::string model;   // "" = every model
    size_t slowest = 0;  // > 0: only the K slowest by e2e, slowest first
    size_t limit = 0;    // > 0: at most this many
  };

  explicit RequestLog(size_t capacity);
  size_t capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0; }

  void Add(RequestLogEntry e);
  // Matching entries: newest first, or slowest first when q.slowest > 0.
  std::vector<RequestLogEntry> Find(const Query& q) const;
  // Requests added since the start (including those the ring has dropped).
  uint64_t recorded() const;

  // "model=NAME&slowest=K&limit=K" (URL-encoded, any order, each optional). Unknown keys are refused.
  static StatusOr<Query> ParseQuery(std::string_view query);
  std::string Json(const Query& q) const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<RequestLogEntry> ring_;  // guarded by mu_; grows to capacity_, then wraps at next_
  size_t next_ = 0;                    // guarded by mu_
  uint64_t recorded_ = 0;              // guarded by mu_
};

std::string RequestLogEntryJson(const RequestLogEntry& e);

}  // namespace stoke
