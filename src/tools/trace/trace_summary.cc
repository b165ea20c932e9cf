#include "tools/trace/trace_summary.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
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

// Erases every occurrence of `what` in s.
void EraseAll(std::string& s, std::string_view what) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at)) s.erase(at, what.size());
}

}  // namespace

std::string KernelShortName(std::string_view name) {
  std::string s(name);
  if (s.starts_with("_Z")) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status),
                                             std::free);
    if (status == 0 && d) s = d.get();
  }
  EraseAll(s, "(anonymous namespace)::");
  // The name ends at the parameter list: the first '(' outside template arguments.
  int depth = 0;
  size_t end = s.size(), last_scope = std::string::npos, last_space = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>' && depth > 0) --depth;
    if (depth > 0) continue;
    if (c == '(') {
      end = i;
      break;
    }
    if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') last_scope = i + 1;
    if (c == ' ') last_space = i;
  }
  if (end == s.size() && last_scope == std::string::npos) return s;  // not a C++ signature
  size_t begin = 0;
  if (last_scope != std::string::npos && last_scope < end)
    begin = last_scope + 1;
  else if (last_space != std::string::npos && last_space < end)
    begin = last_space + 1;  // the return type
  std::string out = s.substr(begin, end - begin);
  EraseAll(out, "stoke::cuda::");
  EraseAll(out, "stoke::");
  return out;
}

std::string_view KernelKind(std::string_view n) {
  const auto has = [&](std::string_view s) { return n.find(s) != std::string_view::npos; };
  if (n.starts_with("memcpy") || n == "memset") return "copy";
  if (has("Attention") || has("Attn") || n.starts_with("Decode") || n.starts_with("FlashPrefill") ||
      n.starts_with("Prefill")) {
    return "attention";
  }
  if (n.starts_with("nvjet") || n.starts_with("sm90_") || n.starts_with("sm80_") || has("gemm") ||
      has("Gemm") || has("Gemv") || has("cutlass") || has("xmma")) {
    return "matmul";
  }
  return "other";
}

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
  std::map<std::string, KernelTime> by_record_name;  // shortened once per distinct name below
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
    if (p.starts_with("engine ") && e.value("name", "").starts_with("step (")) {
      ++s.steps.steps;
      s.steps.total_us += e.value("dur", 0.0);
      if (e.contains("args") && e["args"].is_object()) {
        s.steps.prefill_tokens += e["args"].value("prefill_tokens", int64_t{0});
        s.steps.decode_tokens += e["args"].value("decode_tokens", int64_t{0});
      }
    }
    if (p.starts_with("GPU ") && thread[{pid, e.value("tid", 0)}] != "counters") {
      const double ts = e.value("ts", 0.0);
      // A kernel record CUPTI flushed unfinished (start = end = 0; older traces kept them): not on the clock.
      if (ts <= 0) {
        ++s.gpu_incomplete;
        continue;
      }
      gpu_spans[p].emplace_back(ts, ts + e.value("dur", 0.0));
      KernelTime& k = by_record_name[e.value("name", "kernel")];
      ++k.count;
      k.total_us += e.value("dur", 0.0);
    }
  }
  for (auto& [p, spans] : gpu_spans) s.gpu[p] = Idle(std::move(spans));
  std::map<std::string, KernelTime> kernels;  // a kernel's mangled and demangled records merge here
  for (const auto& [record_name, r] : by_record_name) {
    const std::string name = KernelShortName(record_name);
    KernelTime& k = kernels[name];
    k.name = name;
    k.count += r.count;
    k.total_us += r.total_us;
  }
  for (auto& [name, k] : kernels) s.kernels.push_back(std::move(k));
  std::stable_sort(s.kernels.begin(), s.kernels.end(),
                   [](const KernelTime& a, const KernelTime& b) { return a.total_us > b.total_us; });
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
  if (s.steps.steps > 0) {
    const double n = static_cast<double>(s.steps.steps);
    out += fmt::format(
        "  engine steps: {}, {:.2f} ms each on average, {:.1f} prefill + {:.1f} decode tokens per step\n",
        s.steps.steps, s.steps.total_us / n / 1000, s.steps.prefill_tokens / n, s.steps.decode_tokens / n);
  }
  if (!s.kernels.empty()) {
    double total = 0;
    for (const KernelTime& k : s.kernels) total += k.total_us;
    // Per step where the trace has steps (kernels of other work, a load's tuning say, are counted in too).
    const double per = s.steps.steps > 0 ? static_cast<double>(s.steps.steps) : 1.0;
    const char* unit = s.steps.steps > 0 ? "ms/step" : "ms";
    out += fmt::format("  GPU time by kernel ({:.1f} ms in all{}):\n", total / 1000,
                       s.steps.steps > 0 ? fmt::format(", {:.2f} ms per step", total / per / 1000) : "");
    std::map<std::string_view, double> kinds;
    for (const KernelTime& k : s.kernels) kinds[KernelKind(k.name)] += k.total_us;
    out += "    by kind:";
    for (const char* kind : {"attention", "matmul", "other", "copy"}) {
      out += fmt::format(" {} {:.1f}%{}", kind, 100 * kinds[kind] / total, kind[0] == 'c' ? "" : ",");
    }
    out += "\n";
    constexpr size_t kShown = 15;
    for (size_t i = 0; i < s.kernels.size() && i < kShown; ++i) {
      const KernelTime& k = s.kernels[i];
      out += fmt::format("    {:5.1f}%  {:8.3f} {}  {:7.1f} us x {:<8} {}\n", 100 * k.total_us / total,
                         k.total_us / per / 1000, unit, k.total_us / k.count, k.count, k.name);
    }
    if (s.kernels.size() > kShown) {
      double rest = 0;
      for (size_t i = kShown; i < s.kernels.size(); ++i) rest += s.kernels[i].total_us;
      out += fmt::format("    {:5.1f}%  {:8.3f} {}  ({} more kernels)\n", 100 * rest / total,
                         rest / per / 1000, unit, s.kernels.size() - kShown);
    }
  }
  if (s.gpu_incomplete > 0)
    out += fmt::format("  ({} GPU records without timestamps skipped)\n", s.gpu_incomplete);
  return out;
}

}  // namespace stoke
