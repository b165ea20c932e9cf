#include "tools/doctor/trace_signals.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tools/trace/trace_summary.h"

namespace stoke::doctor {
namespace {

using nlohmann::json;

struct GpuWork {
  int64_t kernels = 0, copies = 0;
  double kernel_us = 0;
  std::map<std::string, std::pair<int64_t, double>> by_name;  // record name -> (launches, µs)
  std::vector<std::pair<double, double>> spans;  // kernels and copies, [start, end) in µs
};

// Busy share and idle gaps of one GPU's records (overlapping records, e.g. on two streams, merge).
void Idle(std::vector<std::pair<double, double>> spans, TraceSignals* t) {
  if (spans.empty()) return;
  std::sort(spans.begin(), spans.end());
  double busy = 0, gap_sum = 0, largest = 0;
  int64_t gaps = 0;
  double cur_start = spans[0].first, cur_end = spans[0].second;
  const double first = cur_start;
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first > cur_end) {
      busy += cur_end - cur_start;
      const double gap = spans[i].first - cur_end;
      ++gaps;
      gap_sum += gap;
      largest = std::max(largest, gap);
      cur_start = spans[i].first;
    }
    cur_end = std::max(cur_end, spans[i].second);
  }
  busy += cur_end - cur_start;
  const double span = cur_end - first;
  t->busy_share = span > 0 ? busy / span : 1.0;
  t->gaps = gaps;
  t->gap_mean_us = gaps > 0 ? gap_sum / static_cast<double>(gaps) : 0.0;
  t->largest_gap_us = largest;
}

}  // namespace

StatusOr<TraceSignals> ExtractTraceSignals(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return InvalidArgumentError("not a trace-event file: no \"traceEvents\" array");
  TraceSignals t;
  t.taken = true;
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
  for (const json& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "M" || !e.contains("args") || !e["args"].is_object()) continue;
    const std::string name = e["args"].value("name", "");
    if (e.value("name", "") == "process_name") process[e.value("pid", 0)] = name;
    if (e.value("name", "") == "thread_name") thread[{e.value("pid", 0), e.value("tid", 0)}] = name;
  }
  std::map<std::string, GpuWork> gpus;
  std::vector<std::pair<double, double>> event_steps;  // "gpu step" spans timed by CUDA events
  for (const json& e : j["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const int pid = e.value("pid", 0);
    const std::string& p = process[pid];
    const std::string name = e.value("name", "");
    const bool has_args = e.contains("args") && e["args"].is_object();
    if (p == "requests") {
      if (has_args && e["args"].contains("id")) ++t.requests;
    } else if (p.starts_with("batcher ")) {
      if (name == "batch") ++t.batches;
    } else if (p.starts_with("GPU ")) {
      if (thread[{pid, e.value("tid", 0)}] == "counters") continue;
      const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
      if (ts <= 0) continue;  // a record flushed unfinished: not on the clock
      GpuWork& g = gpus[p];
      if (has_args && e["args"].contains("grid")) {
        ++g.kernels;
        g.kernel_us += dur;
        auto& k = g.by_name[name];
        ++k.first;
        k.second += dur;
      } else if (name.starts_with("memcpy") || name == "memset") {
        ++g.copies;
      } else {
        continue;
      }
      g.spans.emplace_back(ts, ts + dur);
    } else if (name.starts_with("step (")) {  // the engine loop's steps ("engine <model>" / "llm loop")
      ++t.batches;
    } else if (name == "gpu step" && thread[{pid, e.value("tid", 0)}] == "gpu (cuda events)") {
      const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
      if (ts > 0 && dur > 0) event_steps.emplace_back(ts, ts + dur);
    }
  }
  if (j.contains("otherData") && j["otherData"].is_object()) {
    const json& o = j["otherData"];
    if (o.contains("window_us") && o["window_us"].is_number())
      t.seconds = o["window_us"].get<double>() * 1e-6;
    if (o.contains("dropped_events") && o["dropped_events"].is_number_integer())
      t.dropped = o["dropped_events"].get<int64_t>();
    if (o.contains("kernel_track") && o["kernel_track"].is_string())
      t.note = o["kernel_track"].get<std::string>();
  }
  const GpuWork* busiest = nullptr;
  for (const auto& [name, g] : gpus) {
    if (busiest == nullptr || g.kernels > busiest->kernels) busiest = &g;
  }
  if (busiest == nullptr || busiest->kernels == 0) {
    t.gpu_timeline = false;
    if (!event_steps.empty()) {  // no CUPTI, but the engine timed its steps on the device
      t.gpu_events = true;
      t.note = fmt::format("GPU busy and gaps from CUDA events around {} engine steps (no kernel records{})",
                           event_steps.size(), t.note.empty() ? std::string() : ": " + t.note);
      Idle(std::move(event_steps), &t);
      return t;
    }
    t.note = "no GPU timeline (CPU model or no CUPTI)" + (t.note.empty() ? std::string() : ": " + t.note);
    return t;
  }
  t.gpu_timeline = true;
  t.note.clear();
  t.kernels = busiest->kernels;
  t.copies = busiest->copies;
  t.mean_kernel_us = busiest->kernel_us / static_cast<double>(busiest->kernels);
  if (t.requests > 0)
    t.kernels_per_request = static_cast<double>(t.kernels) / static_cast<double>(t.requests);
  if (t.batches > 0) t.kernels_per_batch = static_cast<double>(t.kernels) / static_cast<double>(t.batches);
  Idle(busiest->spans, &t);
  if (busiest->kernel_us > 0) {
    std::map<std::string, std::pair<int64_t, double>> by_short;  // mangled and demangled records merge
    for (const auto& [name, k] : busiest->by_name) {
      auto& s = by_short[KernelShortName(name)];
      s.first += k.first;
      s.second += k.second;
    }
    double attention = 0, matmul = 0;
    std::vector<TraceSignals::TopKernel> all;
    for (const auto& [name, k] : by_short) {
      const std::string kind(KernelKind(name));
      if (kind == "attention") attention += k.second;
      if (kind == "matmul") matmul += k.second;
      all.push_back({name, kind, k.second / busiest->kernel_us,
                     t.batches > 0 ? k.second / static_cast<double>(t.batches) : 0.0, k.first});
    }
    t.attention_share = attention / busiest->kernel_us;
    t.matmul_share = matmul / busiest->kernel_us;
    t.other_share = 1.0 - t.attention_share - t.matmul_share;
    std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.share > b.share; });
    if (all.size() > 5) all.resize(5);
    t.top_kernels = std::move(all);
  }
  return t;
}

}  // namespace stoke::doctor
