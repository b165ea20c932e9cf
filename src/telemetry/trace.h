// The timeline (issue 12 §2): an on-demand recorder of spans, counters and instants that writes Chrome
// trace-event JSON, the format Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
//   TraceRecorder& t = TraceRecorder::Global();
//   RETURN_IF_ERROR(t.Start({.max_events = 1 << 20}));          // FailedPrecondition: one trace at a time
//   ...                                                         // hooks record while it is on
//   TraceResult r = t.Stop();                                   // r.json: {"traceEvents": [...], ...}
//
// A hook costs one relaxed atomic load when no trace is on:
//
//   if (TraceRecorder& t = TraceRecorder::Global(); t.on()) {
//     t.Span(t.Track("engine", "llm loop"), "step", start, duration, {{"batch", 8.0}});
//   }
//
// Tracks are (process, thread) name pairs: each becomes a pid/tid with "M" metadata naming it, pids in the
// order the processes first appear. Every event (a track's name included) takes one slot of a fixed budget;
// events past it are counted as dropped, and the file says how many (otherData.dropped_events).
//
// The process is one timeline, like its log: the recorder is process-wide so that hooks in every layer (the
// engine loop, the batcher, the GPU sampler, the front ends) reach it without being plumbed through. All
// methods are thread-safe; recording takes one mutex (only while a trace is on).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace stoke {

struct TraceArg {
  std::string key;
  std::variant<double, std::string> value;
  TraceArg(std::string k, double v) : key(std::move(k)), value(v) {}
  TraceArg(std::string k, int64_t v) : key(std::move(k)), value(static_cast<double>(v)) {}
  TraceArg(std::string k, int v) : key(std::move(k)), value(static_cast<double>(v)) {}
  TraceArg(std::string k, std::string v) : key(std::move(k)), value(std::move(v)) {}
  TraceArg(std::string k, const char* v) : key(std::move(k)), value(std::string(v)) {}
};
using TraceArgs = std::vector<TraceArg>;

struct TraceTrack {
  int pid = 0;
  int tid = 0;
};

// One stage of a request's ledger, laid out after the previous one inside the request's span.
struct TraceStage {
  const char* name;
  Nanos ns;
};

struct TraceOptions {
  size_t max_events = size_t{1} << 20;  // the budget (an event is ~100-200 bytes in memory)
};

struct TraceResult {
  std::string json;
  size_t events = 0;   // recorded (metadata included)
  size_t dropped = 0;  // past the budget
  size_t tracks = 0;
};

class TraceRecorder {
 public:
  static TraceRecorder& Global();
  TraceRecorder() = default;
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // The hook's test: one relaxed load.
  bool on() const { return on_.load(std::memory_order_relaxed); }

  // Starts recording (clears what an earlier trace left). FailedPrecondition when a trace is on.
  Status Start(const TraceOptions& options);
  // Stops and returns the file. With no trace on, an empty trace.
  TraceResult Stop();

  // The track for (process, thread), created on first use (one metadata event from the budget). While no
  // trace is on it returns {0, 0} and records nothing.
  TraceTrack Track(std::string_view process, std::string_view thread);

  // A complete span ("X") on a track: [start, start + duration), monotonic ns.
  void Span(TraceTrack track, std::string_view name, Nanos start, Nanos duration, TraceArgs args = {});
  // Counter values ("C") of one named counter at `ts`; each numeric arg is a series of that counter.
  void Counter(TraceTrack track, std::string_view name, Nanos ts, TraceArgs values);
  // An instant ("i", thread scope).
  void Instant(TraceTrack track, std::string_view name, Nanos ts, TraceArgs args = {});
  // A request: a span `name` over [start, start + sum(stages)) on its own track in process "requests",
  // with one child span per stage with a non-zero duration, back to back in the order given.
  void Request(std::string_view id, std::string_view name, Nanos start, std::span<const TraceStage> stages,
               TraceArgs args = {});
  // A key of otherData in the file (e.g. why there is no kernel track). Kept until the next Start.
  void SetInfo(std::string key, std::string value);

 private:
  struct Event {
    char ph;
    int pid, tid;
    Nanos ts, dur;
    std::string name;
    TraceArgs args;
  };
  bool Admit();  // with mu_ held: takes a slot of the budget, or counts a drop
  TraceTrack TrackLocked(std::string_view process, std::string_view thread);
  void Add(Event e);

  std::atomic<bool> on_{false};
  std::mutex mu_;
  bool recording_ = false;  // guarded by mu_ (on_ mirrors it for the hooks)
  TraceOptions options_;    // guarded by mu_
  Nanos start_ns_ = 0;      // guarded by mu_
  int64_t start_unix_ms_ = 0;
  std::vector<Event> events_;                        // guarded by mu_
  size_t dropped_ = 0;                               // guarded by mu_
  std::map<std::string, int, std::less<>> pids_;     // guarded by mu_
  std::map<std::pair<int, std::string>, int> tids_;  // guarded by mu_
  std::map<std::string, std::string> info_;          // guarded by mu_
};

}  // namespace stoke
