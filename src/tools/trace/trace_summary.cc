#include "tools/trace/trace_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace stoke {
namespace {

using nlohmann::json;

// Busy/idle of one GPU's records ([start, end) in µs).
GpuIdle Idle(std::vector<std::pair<double, double>> spans) {
  GpuIdle g;
  g.records = static_cast<int64_t>(spans.size());
  if (spans.empty()) return g;
  std::sort(spans.begin(), spans.end());
  double cur_start = spans[0].first, cur_end = spans[0].second;
  const double first = cur_start;
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first > cur_end) {
      g.busy_us += cur_end - cur_start;
      const double gap = spans[i].first - cur_end;
      ++g.gaps;
      if (gap > 1000) ++g.gaps_over_1ms;
      g.largest_gap_us = std::max(g.largest_gap_us, gap);
      cur_start = spans[i].first;
    }
    cur_end = std::max(cur_end, spans[i].second);
  }
  g.busy_us += cur_end - cur_start;
  g.span_us = cur_end - first;
  return g;
}

}  // namespace

StatusOr<TraceSummary> SummarizeTrace(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return InvalidArgumentError("not a trace-event file: no \"traceEvents\" array");
  TraceSummary s;
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
  for (const json& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "M") continue;
    const std::string name = e.contains("args") ? e["args"].value("name", "") : "";
    if (e.value("name", "") == "process_name") process[e.value("pid", 0)] = name;
    if (e.value("name", "") == "thread_name") thread[{e.value("pid", 0), e.value("tid", 0)}] = name;
  }
  s.tracks = static_cast<int64_t>(thread.size());
  std::map<std::string, std::vector<std::pair<double, double>>> gpu_spans;
  for (const json& e : j["traceEvents"]) {
    if (!e.is_object()) return InvalidArgumentError("an event is not an object");
    ++s.events;
    const std::string ph = e.value("ph", "");
    if (ph == "C") ++s.counters;
    if (ph != "X") continue;
    const int pid = e.value("pid", 0);
    const std::string& p = process[pid];
    ++s.spans_per_process[p];
    if (p == "requests" && e.contains("args") && e["args"].contains("id")) ++s.requests;
    if (p.starts_with("GPU ") && thread[{pid, e.value("tid", 0)}] != "counters") {
      const double ts = e.value("ts", 0.0);
      // A kernel record CUPTI flushed unfinished (start = end = 0; older traces kept them): not on the clock.
      if (ts <= 0) {
        ++s.gpu_incomplete;
        continue;
      }
      gpu_spans[p].emplace_back(ts, ts + e.value("dur", 0.0));
    }
  }
  for (auto& [p, spans] : gpu_spans) s.gpu[p] = Idle(std::move(spans));
  if (j.contains("otherData") && j["otherData"].is_object()) {
    const json& o = j["otherData"];
    s.dropped = o.value("dropped_events", int64_t{0});
    for (const auto& [k, v] : o.items()) {
      if (v.is_string()) s.info[k] = v.get<std::string>();
    }
  }
  return s;
}

std::string FormatTraceSummary(const TraceSummary& s) {
  std::string out =
      fmt::format("{} events on {} tracks, {} dropped{}\n", s.events, s.tracks, s.dropped,
                  s.dropped > 0 ? " (the event budget ran out: the timeline is incomplete)" : "");
  out += fmt::format("  requests: {}   counter samples: {}\n", s.requests, s.counters);
  for (const auto& [p, n] : s.spans_per_process) out += fmt::format("  {}: {} spans\n", p, n);
  for (const auto& [p, g] : s.gpu) {
    const double busy = g.span_us > 0 ? 100.0 * g.busy_us / g.span_us : 0;
    out += fmt::format(
        "  {}: {} kernel/copy records over {:.1f} ms, busy {:.1f}%, {} idle gaps ({} over 1 ms, largest "
        "{:.1f} ms)\n",
        p, g.records, g.span_us / 1000, busy, g.gaps, g.gaps_over_1ms, g.largest_gap_us / 1000);
  }
  if (s.gpu.empty()) {
    auto it = s.info.find("kernel_track");
    out += fmt::format("  GPU kernels: none recorded{}\n",
                       it != s.info.end() ? " (" + it->second + ")" : std::string());
  }
  if (s.gpu_incomplete > 0)
    out += fmt::format("  ({} GPU records without timestamps skipped)\n", s.gpu_incomplete);
  return out;
}

}  // namespace stoke
