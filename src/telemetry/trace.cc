#include "telemetry/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace stoke {
namespace {

// A JSON string literal (invalid UTF-8 replaced, never thrown).
std::string Quote(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ns -> µs with ns precision ("12.345").
std::string Micros(Nanos ns) {
  if (ns < 0) return fmt::format("-{}.{:03}", -ns / 1000, -ns % 1000);
  return fmt::format("{}.{:03}", ns / 1000, ns % 1000);
}

void AppendArgs(std::string* out, const TraceArgs& args) {
  out->append("{");
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out->append(",");
    out->append(Quote(args[i].key)).append(":");
    if (const double* d = std::get_if<double>(&args[i].value)) {
      // JSON has no NaN/Inf: they become null.
      out->append(std::isfinite(*d) ? fmt::format("{}", *d) : std::string("null"));
    } else {
      out->append(Quote(std::get<std::string>(args[i].value)));
    }
  }
  out->append("}");
}

}  // namespace

TraceRecorder& TraceRecorder::Global() {
  static TraceRecorder* r = new TraceRecorder();  // never destroyed: hooks may run during exit
  return *r;
}

Status TraceRecorder::Start(const TraceOptions& options) {
  std::lock_guard lock(mu_);
  if (recording_) return FailedPreconditionError("a trace is already being recorded");
  if (options.max_events < 1) return InvalidArgumentError("max_events must be at least 1");
  options_ = options;
  events_.clear();
  events_.reserve(std::min<size_t>(options.max_events, 4096));
  dropped_ = 0;
  pids_.clear();
  tids_.clear();
  info_.clear();
  start_ns_ = MonotonicNanos();
  start_unix_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  recording_ = true;
  on_.store(true, std::memory_order_relaxed);
  return OkStatus();
}

bool TraceRecorder::Admit() {
  if (!recording_) return false;
  if (events_.size() >= options_.max_events) {
    ++dropped_;
    return false;
  }
  return true;
}

void TraceRecorder::Add(Event e) {
  std::lock_guard lock(mu_);
  if (Admit()) events_.push_back(std::move(e));
}

TraceTrack TraceRecorder::Track(std::string_view process, std::string_view thread) {
  if (!on()) return {};
  std::lock_guard lock(mu_);
  return TrackLocked(process, thread);
}

TraceTrack TraceRecorder::TrackLocked(std::string_view process, std::string_view thread) {
  if (!recording_) return {};
  TraceTrack t;
  auto p = pids_.find(process);
  if (p == pids_.end()) {
    t.pid = static_cast<int>(pids_.size()) + 1;
    pids_.emplace(std::string(process), t.pid);
    if (Admit()) events_.push_back({'M', t.pid, 0, 0, 0, "process_name", {{"name", std::string(process)}}});
    if (Admit()) events_.push_back({'M', t.pid, 0, 0, 0, "process_sort_index", {{"sort_index", t.pid}}});
  } else {
    t.pid = p->second;
  }
  auto key = std::make_pair(t.pid, std::string(thread));
  auto it = tids_.find(key);
  if (it != tids_.end()) {
    t.tid = it->second;
    return t;
  }
  t.tid = static_cast<int>(tids_.size()) + 1;
  tids_.emplace(std::move(key), t.tid);
  if (Admit()) events_.push_back({'M', t.pid, t.tid, 0, 0, "thread_name", {{"name", std::string(thread)}}});
  return t;
}

void TraceRecorder::Span(TraceTrack track, std::string_view name, Nanos start, Nanos duration,
                         TraceArgs args) {
  if (!on()) return;
  Add({'X', track.pid, track.tid, start, std::max<Nanos>(duration, 0), std::string(name), std::move(args)});
}

void TraceRecorder::Counter(TraceTrack track, std::string_view name, Nanos ts, TraceArgs values) {
  if (!on()) return;
  Add({'C', track.pid, 0, ts, 0, std::string(name), std::move(values)});
}

void TraceRecorder::Instant(TraceTrack track, std::string_view name, Nanos ts, TraceArgs args) {
  if (!on()) return;
  Add({'i', track.pid, track.tid, ts, 0, std::string(name), std::move(args)});
}

void TraceRecorder::Request(std::string_view id, std::string_view name, Nanos start,
                            std::span<const TraceStage> stages, TraceArgs args) {
  if (!on()) return;
  Nanos total = 0;
  for (const TraceStage& s : stages) total += std::max<Nanos>(s.ns, 0);
  // Each request has a track of its own (ids from clients may repeat): the thread name carries the id.
  std::lock_guard lock(mu_);
  if (!recording_) return;
  const TraceTrack t = TrackLocked(
      "requests", fmt::format("{} #{}", id.empty() ? std::string_view("request") : id, tids_.size() + 1));
  if (!Admit()) {
    dropped_ += stages.size();  // the stages would have followed their request
    return;
  }
  args.emplace_back("id", std::string(id));
  events_.push_back({'X', t.pid, t.tid, start, total, std::string(name), std::move(args)});
  Nanos at = start;
  for (const TraceStage& s : stages) {
    if (s.ns <= 0) continue;
    if (Admit()) events_.push_back({'X', t.pid, t.tid, at, s.ns, s.name, {}});
    at += s.ns;
  }
}

void TraceRecorder::SetInfo(std::string key, std::string value) {
  std::lock_guard lock(mu_);
  info_[std::move(key)] = std::move(value);
}

TraceResult TraceRecorder::Stop() {
  std::vector<Event> events;
  std::map<std::string, std::string> info;
  size_t dropped, max_events, tracks;
  Nanos start;
  int64_t start_unix_ms;
  {
    std::lock_guard lock(mu_);
    on_.store(false, std::memory_order_relaxed);
    recording_ = false;
    events.swap(events_);
    info.swap(info_);
    dropped = dropped_;
    max_events = options_.max_events;
    tracks = tids_.size();
    start = start_ns_;
    start_unix_ms = start_unix_ms_;
  }
  // Times are µs from the earliest event (a request that finished in the window may have begun before it).
  Nanos origin = start;
  for (const Event& e : events) {
    if (e.ph != 'M') origin = std::min(origin, e.ts);
  }
  TraceResult r;
  r.events = events.size();
  r.dropped = dropped;
  r.tracks = tracks;
  std::string& out = r.json;
  out.reserve(events.size() * 120 + 512);
  out.append("{\"traceEvents\":[");
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (i > 0) out.append(",\n");
    out.append(fmt::format("{{\"name\":{},\"ph\":\"{}\",\"ts\":{},\"pid\":{},\"tid\":{}", Quote(e.name), e.ph,
                           e.ph == 'M' ? std::string("0") : Micros(e.ts - origin), e.pid, e.tid));
    if (e.ph == 'X') out.append(",\"dur\":").append(Micros(e.dur));
    if (e.ph == 'i') out.append(",\"s\":\"t\"");
    out.append(",\"args\":");
    AppendArgs(&out, e.args);
    out.append("}");
  }
  out.append("],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{");
  out.append(fmt::format(
      "\"producer\":\"stoke\",\"start_unix_ms\":{},\"window_start_us\":{},\"window_us\":{},\"events\":{},"
      "\"max_events\":{},\"dropped_events\":{},\"tracks\":{}",
      start_unix_ms, Micros(start - origin), Micros(MonotonicNanos() - start), events.size(), max_events,
      dropped, tracks));
  if (dropped > 0) {
    info["note"] = fmt::format("{} events past the budget of {} were dropped: the timeline is incomplete",
                               dropped, max_events);
  }
  for (const auto& [k, v] : info) out.append(",").append(Quote(k)).append(":").append(Quote(v));
  out.append("}}\n");
  return r;
}

}  // namespace stoke
