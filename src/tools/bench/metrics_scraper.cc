#include "tools/bench/metrics_scraper.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

namespace stoke::bench {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.ends_with(suffix);
}

// The dcgm-exporter names (stoke serve's GPU telemetry, or a real dcgm-exporter) worth a chart.
bool IsChartedDcgm(std::string_view n) {
  static constexpr std::string_view kNames[] = {
      "DCGM_FI_DEV_GPU_UTIL",     "DCGM_FI_DEV_FB_USED",        "DCGM_FI_DEV_SM_CLOCK",
      "DCGM_FI_DEV_POWER_USAGE",  "DCGM_FI_DEV_GPU_TEMP",       "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
      "DCGM_FI_PROF_SM_ACTIVE",   "DCGM_FI_PROF_SM_OCCUPANCY",  "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
      "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"};
  for (std::string_view k : kNames) {
    if (n == k) return true;
  }
  return false;
}

StatusOr<double> ParseValue(std::string_view s) {
  if (s == "+Inf" || s == "Inf") return std::numeric_limits<double>::infinity();
  if (s == "-Inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return kNaN;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return InvalidArgumentError("bad value '{}'", s);
  return v;
}

// name{a="x",b="y\"z"} 1.5 [timestamp]
StatusOr<PromSample> ParseSampleLine(std::string_view line) {
  PromSample s;
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ' && line[i] != '\t') ++i;
  s.name = std::string(line.substr(0, i));
  if (s.name.empty()) return InvalidArgumentError("no metric name");
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      size_t eq = line.find('=', i);
      if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
        return InvalidArgumentError("bad labels");
      }
      std::string key(line.substr(i, eq - i));
      while (!key.empty() && (key.front() == ',' || key.front() == ' ')) key.erase(0, 1);
      std::string value;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value += line[j] == 'n' ? '\n' : line[j];
        } else {
          value += line[j];
        }
      }
      if (j >= line.size()) return InvalidArgumentError("unterminated label value");
      s.labels[key] = std::move(value);
      i = j + 1;
      while (i < line.size() && (line[i] == ',' || line[i] == ' ')) ++i;
    }
    if (i >= line.size()) return InvalidArgumentError("unterminated labels");
    ++i;
  }
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  size_t end = line.find_first_of(" \t", i);
  ASSIGN_OR_RETURN(
      s.value, ParseValue(line.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i)));
  return s;
}

}  // namespace

StatusOr<std::vector<PromSample>> ParsePrometheusText(std::string_view text,
                                                      std::map<std::string, std::string>* types) {
  std::vector<PromSample> out;
  int line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.starts_with("#")) {
      if (line.starts_with("# TYPE ") && types != nullptr) {
        std::string_view rest = line.substr(7);
        size_t sp = rest.find(' ');
        if (sp != std::string_view::npos)
          (*types)[std::string(rest.substr(0, sp))] = std::string(rest.substr(sp + 1));
      }
      continue;
    }
    StatusOr<PromSample> s = ParseSampleLine(line);
    if (!s.ok()) return InvalidArgumentError("metrics line {}: {}", line_no, s.status().message());
    out.push_back(std::move(s).value());
  }
  return out;
}

void SeriesBuilder::Put(const std::string& key, double v) {
  std::vector<double>& col = out_.series[key];
  col.resize(out_.t_s.size() - 1, kNaN);
  col.push_back(v);
}

void SeriesBuilder::Add(double t_s, const std::vector<PromSample>& samples,
                        const std::map<std::string, std::string>& types) {
  out_.t_s.push_back(t_s);
  std::map<std::string, double> gauges, counters;
  std::map<std::string, double> stage_sum, stage_count;
  double batch_items = 0, batch_execs = 0;
  bool has_batches = false;
  std::map<std::string, double> step_part;  // seconds by part
  double step_count = 0;
  for (const PromSample& s : samples) {
    auto type_it = types.find(s.name);
    const std::string type = type_it == types.end() ? "" : type_it->second;
    const std::string_view n = s.name;
    if (EndsWith(n, "step_seconds_total")) {  // the engine step's split: {part="model"|"host"}
      auto part = s.labels.find("part");
      if (part != s.labels.end()) step_part[part->second] += s.value;
      continue;
    }
    if (EndsWith(n, "step_duration_seconds_count")) {
      step_count += s.value;
      continue;
    }
    if (EndsWith(n, "request_stage_seconds_sum") || EndsWith(n, "request_stage_seconds_count")) {
      auto st = s.labels.find("stage");
      if (st == s.labels.end()) continue;
      (EndsWith(n, "_sum") ? stage_sum : stage_count)[st->second] += s.value;
      continue;
    }
    if (type == "gauge") {
      bool wanted = EndsWith(n, "num_requests_running") || EndsWith(n, "num_requests_waiting") ||
                    EndsWith(n, "pending_request_count") || EndsWith(n, "kv_cache_usage_ratio") ||
                    EndsWith(n, "kv_cache_usage_perc") || EndsWith(n, "gpu_cache_usage_perc") ||
                    (n.find("gpu") != std::string_view::npos && !EndsWith(n, "telemetry_available")) ||
                    IsChartedDcgm(n);
      if (!wanted) continue;
      std::string key = s.name;
      if (auto g = s.labels.find("gpu"); g != s.labels.end()) {
        auto r = s.labels.find("reason");  // stoke_gpu_clocks_event_reason: one series per reason
        key += "{gpu=" + g->second + (r != s.labels.end() ? ",reason=" + r->second : "") + "}";
      }
      gauges[key] += s.value;
    } else if (EndsWith(n, "generation_tokens_total") || EndsWith(n, "prompt_tokens_total")) {
      counters[s.name] += s.value;
    } else if (n == "stoke:inference_count_total" || n == "stoke_inference_count_total" ||
               n == "nv_inference_count") {
      batch_items += s.value;  // dynamic batcher: inferences and executions -> mean batch size
      has_batches = true;
    } else if (n == "stoke:inference_exec_count_total" || n == "stoke_inference_exec_count_total" ||
               n == "nv_inference_exec_count") {
      batch_execs += s.value;
    }
  }
  for (const auto& [k, v] : gauges) Put(k, v);
  const double dt = prev_t_ >= 0 ? t_s - prev_t_ : 0;
  for (const auto& [k, v] : counters) {
    auto prev = prev_counter_.find(k);
    std::string rate_key = k.substr(0, k.size() - 6) + "_per_s";  // "x_total" -> "x_per_s"
    Put(rate_key, prev != prev_counter_.end() && dt > 0 ? std::max(0.0, v - prev->second) / dt : kNaN);
    prev_counter_[k] = v;
  }
  for (const auto& [stage, sum] : stage_sum) {
    const std::string ks = "sum:" + stage, kc = "count:" + stage;
    double count = stage_count[stage];
    auto ps = prev_counter_.find(ks), pc = prev_counter_.find(kc);
    double mean = kNaN;
    if (ps != prev_counter_.end() && pc != prev_counter_.end() && count > pc->second) {
      mean = (sum - ps->second) / (count - pc->second) * 1e3;
    }
    Put("stage_ms:" + stage, mean);
    prev_counter_[ks] = sum;
    prev_counter_[kc] = count;
  }
  for (const auto& [part, sec] : step_part) {  // mean ms per engine step in the interval, by part
    const std::string ks = "step:" + part;
    auto ps = prev_counter_.find(ks), pc = prev_counter_.find("step:count");
    double mean = kNaN;
    if (ps != prev_counter_.end() && pc != prev_counter_.end() && step_count > pc->second) {
      mean = (sec - ps->second) / (step_count - pc->second) * 1e3;
    }
    Put("step_ms:" + part, mean);
    prev_counter_[ks] = sec;
  }
  if (!step_part.empty()) prev_counter_["step:count"] = step_count;
  if (has_batches) {
    auto pi = prev_counter_.find("batch:items"), pe = prev_counter_.find("batch:execs");
    double mean = kNaN;
    if (pi != prev_counter_.end() && pe != prev_counter_.end() && batch_execs > pe->second) {
      mean = (batch_items - pi->second) / (batch_execs - pe->second);
    }
    Put("mean_batch_size", mean);
    prev_counter_["batch:items"] = batch_items;
    prev_counter_["batch:execs"] = batch_execs;
  }
  prev_t_ = t_s;
  for (auto& [k, col] : out_.series) col.resize(out_.t_s.size(), kNaN);
}

ServerSeries SeriesBuilder::Take() {
  return std::move(out_);
}

bool MetricsScraper::ScrapeOnce() {
  const Nanos t = MonotonicNanos();
  StatusOr<SimpleResponse> r = HttpFetch(endpoint_, "GET", endpoint_.base_path + target_, "", 2.0);
  if (!r.ok()) {
    note_ = fmt::format("GET {}: {}", target_, r.status().message());
    return false;
  }
  if (r->status != 200) {
    note_ = fmt::format("GET {}: HTTP {}", target_, r->status);
    return false;
  }
  std::map<std::string, std::string> types;
  StatusOr<std::vector<PromSample>> samples = ParsePrometheusText(r->body, &types);
  if (!samples.ok()) {
    note_ = fmt::format("GET {}: {}", target_, samples.status().message());
    return false;
  }
  builder_.Add((t - run_start_) * 1e-9, *samples, types);
  return true;
}

void MetricsScraper::Start(Nanos run_start) {
  run_start_ = run_start;
  available_ = ScrapeOnce();
  if (!available_) return;
  note_.clear();
  thread_ = std::thread([this] { Loop(); });
}

void MetricsScraper::Loop() {
  Nanos next = MonotonicNanos();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    next += static_cast<Nanos>(interval_s_ * 1e9);
    cv_.wait_until(lock, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(next)),
                   [this] { return stop_; });
    if (stop_) break;
    lock.unlock();
    ScrapeOnce();  // a failed scrape leaves a gap; the series stay aligned on the scrapes that worked
    lock.lock();
  }
}

void MetricsScraper::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ServerSeries MetricsScraper::Take() {
  ServerSeries s = builder_.Take();
  s.available = available_;
  s.note = available_ ? "" : note_;
  return s;
}

}  // namespace stoke::bench
