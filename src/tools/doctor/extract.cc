#include "tools/doctor/extract.h"

#include <algorithm>
#include <set>

namespace stoke::doctor {
namespace {

using bench::PromSample;
using Samples = std::vector<PromSample>;

// "stoke:x" and "stoke_x" (--metric-names prometheus) both read as "x".
bool NameIs(const PromSample& s, std::string_view base) {
  std::string_view n = s.name;
  if (n.starts_with("stoke:") || n.starts_with("stoke_")) n.remove_prefix(6);
  return n == base;
}
bool ModelMatches(const PromSample& s, const std::string& model) {
  if (model.empty()) return true;
  auto it = s.labels.find("model_name");
  return it == s.labels.end() || it->second == model;
}
std::string Label(const PromSample& s, const std::string& key) {
  auto it = s.labels.find(key);
  return it == s.labels.end() ? "" : it->second;
}

// Sum of the series named `base`, NaN when there is none.
double Total(const Samples& ss, std::string_view base, const std::string& model) {
  double v = kNaN;
  for (const PromSample& s : ss) {
    if (NameIs(s, base) && ModelMatches(s, model)) v = (Has(v) ? v : 0) + s.value;
  }
  return v;
}
std::map<std::string, double> ByLabel(const Samples& ss, std::string_view base, const std::string& key,
                                      const std::string& model) {
  std::map<std::string, double> out;
  for (const PromSample& s : ss) {
    if (NameIs(s, base) && ModelMatches(s, model)) out[Label(s, key)] += s.value;
  }
  return out;
}
std::map<std::string, double> Delta(const std::map<std::string, double>& a,
                                    const std::map<std::string, double>& b) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : b) {
    auto it = a.find(k);
    out[k] = std::max(0.0, v - (it == a.end() ? 0.0 : it->second));
  }
  return out;
}
std::map<std::string, double> Shares(const std::map<std::string, double>& d) {
  double total = 0;
  for (const auto& [k, v] : d) total += v;
  std::map<std::string, double> out;
  if (total <= 0) return out;
  for (const auto& [k, v] : d) out[k] = v / total;
  return out;
}

struct Gauge {
  double sum = 0, max = kNaN;
  int n = 0;
  void Add(double v) {
    if (!Has(v)) return;
    sum += v;
    ++n;
    max = Has(max) ? std::max(max, v) : v;
  }
  double mean() const { return n > 0 ? sum / n : kNaN; }
};

double StageOr0(const std::map<std::string, double>& m, const char* k) {
  auto it = m.find(k);
  return it == m.end() ? 0.0 : it->second;
}

void ExtractLedger(const Samples& first, const Samples& last, const std::string& model, Signals* s) {
  auto sum = Delta(ByLabel(first, "request_stage_seconds_sum", "stage", model),
                   ByLabel(last, "request_stage_seconds_sum", "stage", model));
  auto count = Delta(ByLabel(first, "request_stage_seconds_count", "stage", model),
                     ByLabel(last, "request_stage_seconds_count", "stage", model));
  double requests = 0;
  for (const auto& [stage, n] : count) requests = std::max(requests, n);
  s->requests = static_cast<int64_t>(requests);
  if (requests <= 0) return;
  double latency = 0;
  for (const auto& [stage, n] : count) {
    if (n <= 0) continue;
    // A stage some requests skip still costs its share per request: divide by all requests.
    s->stage_s[stage] = sum[stage] / requests;
  }
  const auto& st = s->stage_s;
  s->queue_s = StageOr0(st, "queue");
  s->io_s = StageOr0(st, "recv") + StageOr0(st, "send");
  s->host_s = StageOr0(st, "preprocess") + StageOr0(st, "postprocess") + StageOr0(st, "schedule");
  s->copy_s = StageOr0(st, "h2d") + StageOr0(st, "d2h");
  // Generation splits compute into prefill/decode (+ interleave); take whichever view is larger, never both.
  const double split = StageOr0(st, "prefill") + StageOr0(st, "decode") + StageOr0(st, "interleave");
  s->device_s = std::max(StageOr0(st, "compute"), split);
  s->service_s = s->host_s + s->copy_s + s->device_s;
  static const std::set<std::string> kGrouped = {"queue",       "recv",     "send",   "preprocess",
                                                 "postprocess", "schedule", "h2d",    "d2h",
                                                 "compute",     "prefill",  "decode", "interleave"};
  latency = s->queue_s + s->io_s + s->service_s;
  for (const auto& [stage, v] : st) {
    if (!kGrouped.count(stage)) latency += v;
  }
  s->latency_s = latency;
}

void ExtractBatcher(const std::vector<Scrape>& sc, const std::string& model, double window, Signals* s) {
  const Samples& a = sc.front().metrics;
  const Samples& b = sc.back().metrics;
  const double rows = Total(b, "inference_count_total", model) - Total(a, "inference_count_total", model);
  const double execs =
      Total(b, "inference_exec_count_total", model) - Total(a, "inference_exec_count_total", model);
  if (Has(execs) && execs > 0) s->mean_batch_size = rows / execs;
  s->close_share = Shares(Delta(ByLabel(a, "batch_close_total", "reason", model),
                                ByLabel(b, "batch_close_total", "reason", model)));
  auto busy = Delta(ByLabel(a, "instance_busy_seconds_total", "instance", model),
                    ByLabel(b, "instance_busy_seconds_total", "instance", model));
  if (!busy.empty() && window > 0) {
    double total = 0;
    for (const auto& [i, v] : busy) total += v;
    s->instance_busy = std::min(1.0, total / (window * static_cast<double>(busy.size())));
    if (s->instances == 0) s->instances = static_cast<int>(busy.size());
  }
  Gauge pending;
  for (const Scrape& x : sc) pending.Add(Total(x.metrics, "inference_pending_request_count", model));
  s->pending_mean = pending.mean();
}

// The increase of `base` (optionally one label value) from a to b; NaN when b has no such series.
double Increase(const Samples& a, const Samples& b, std::string_view base, const std::string& model,
                const std::string& key = "", const std::string& value = "") {
  auto total = [&](const Samples& ss) {
    if (key.empty()) return Total(ss, base, model);
    auto by = ByLabel(ss, base, key, model);
    auto it = by.find(value);
    return it == by.end() ? kNaN : it->second;
  };
  const double v0 = total(a), v1 = total(b);
  if (!Has(v1)) return kNaN;
  return std::max(0.0, v1 - (Has(v0) ? v0 : 0.0));
}

void ExtractSteps(const Samples& a, const Samples& b, const std::string& model, double window, Signals* s) {
  const double steps = Increase(a, b, "step_duration_seconds_count", model);
  if (!Has(steps) || steps <= 0) return;
  s->steps = steps;
  const double seconds = Increase(a, b, "step_duration_seconds_sum", model);
  s->step_ms = 1e3 * seconds / steps;
  if (window > 0) s->engine_busy = std::min(1.0, seconds / window);
  auto per_step = [&](std::string_view base, const char* key, const char* value) {
    return Increase(a, b, base, model, key, value) / steps;
  };
  s->step_model_ms = 1e3 * per_step("step_seconds_total", "part", "model");
  s->step_host_ms = 1e3 * per_step("step_seconds_total", "part", "host");
  s->step_output_ms = 1e3 * Increase(a, b, "step_output_seconds_total", model) / steps;
  // The token histograms count only steps with such tokens: their sums over all steps are what is wanted.
  s->step_prefill_tokens = Increase(a, b, "step_prefill_tokens_sum", model) / steps;
  s->step_decode_tokens = Increase(a, b, "step_decode_tokens_sum", model) / steps;
  s->step_weight_bytes = per_step("step_read_bytes_total", "kind", "weights");
  s->step_kv_bytes = per_step("step_read_bytes_total", "kind", "kv");
  s->step_matmul_flops = per_step("step_flops_total", "kind", "matmul");
  s->step_attention_flops = per_step("step_flops_total", "kind", "attention");
}

void ExtractLlm(const std::vector<Scrape>& sc, const std::string& model, double window, Signals* s) {
  Gauge kv, waiting, running;
  for (const Scrape& x : sc) {
    kv.Add(Total(x.metrics, "kv_cache_usage_ratio", model));
    waiting.Add(Total(x.metrics, "num_requests_waiting", model));
    running.Add(Total(x.metrics, "num_requests_running", model));
  }
  s->kv_usage_max = kv.max;
  s->kv_usage_mean = kv.mean();
  s->waiting_mean = waiting.mean();
  s->waiting_max = waiting.max;
  s->running_mean = running.mean();
  s->running_max = running.max;
  const Samples& a = sc.front().metrics;
  const Samples& b = sc.back().metrics;
  s->kv_blocks_total = Total(b, "kv_cache_blocks_used", model) + Total(b, "kv_cache_blocks_free", model);
  s->preemptions = Increase(a, b, "num_preemptions_total", model);
  s->admission_share = Shares(Delta(ByLabel(a, "step_admission_stop_total", "reason", model),
                                    ByLabel(b, "step_admission_stop_total", "reason", model)));
  ExtractSteps(a, b, model, window, s);
}

double Metric(const nlohmann::json& dev, const char* name) {
  const nlohmann::json& m = dev.value("metrics", nlohmann::json::object());
  auto it = m.find(name);
  return it != m.end() && it->is_number() ? it->get<double>() : kNaN;
}

struct GpuAcc {
  Gauge util, gr, sm, occ, tensor, dram, pcie, fb, clock, power, limit;
  std::map<std::string, int> reasons;
  int samples = 0;
  double first_ts = kNaN, last_ts = kNaN, pv0 = kNaN, pv1 = kNaN, tv0 = kNaN, tv1 = kNaN;
};

void AddGpuSample(const nlohmann::json& dev, double ts, GpuAcc* g) {
  ++g->samples;
  auto ratio = [&](const char* n, double scale, Gauge* out) { out->Add(Metric(dev, n) * scale); };
  ratio("DCGM_FI_DEV_GPU_UTIL", 0.01, &g->util);
  ratio("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, &g->gr);
  ratio("DCGM_FI_PROF_SM_ACTIVE", 1, &g->sm);
  ratio("DCGM_FI_PROF_SM_OCCUPANCY", 1, &g->occ);
  ratio("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1, &g->tensor);
  ratio("DCGM_FI_PROF_DRAM_ACTIVE", 1, &g->dram);
  ratio("DCGM_FI_DEV_SM_CLOCK", 1, &g->clock);
  ratio("DCGM_FI_DEV_POWER_USAGE", 1, &g->power);
  ratio("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1, &g->limit);
  const double tx = Metric(dev, "DCGM_FI_PROF_PCIE_TX_BYTES"), rx = Metric(dev, "DCGM_FI_PROF_PCIE_RX_BYTES");
  if (Has(tx) || Has(rx)) {
    g->pcie.Add((Has(tx) ? tx : 0) + (Has(rx) ? rx : 0));
  } else {
    const double ktx = Metric(dev, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"),
                 krx = Metric(dev, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT");
    if (Has(ktx) || Has(krx)) g->pcie.Add(1e3 * ((Has(ktx) ? ktx : 0) + (Has(krx) ? krx : 0)));
  }
  g->fb.Add(Metric(dev, "DCGM_FI_DEV_FB_USED") / Metric(dev, "DCGM_FI_DEV_FB_TOTAL"));
  for (const auto& r : dev.value("clocks_event_reasons", nlohmann::json::array())) {
    if (r.is_string()) ++g->reasons[r.get<std::string>()];
  }
  const double pv = Metric(dev, "DCGM_FI_DEV_POWER_VIOLATION"),
               tv = Metric(dev, "DCGM_FI_DEV_THERMAL_VIOLATION");
  if (!Has(g->first_ts)) {
    g->first_ts = ts;
    g->pv0 = pv;
    g->tv0 = tv;
  }
  g->last_ts = ts;
  g->pv1 = pv;
  g->tv1 = tv;
}

void ExtractGpu(const std::vector<Scrape>& sc, Signals* s) {
  std::map<int, GpuAcc> per_gpu;
  for (const Scrape& x : sc) {
    if (!x.gpu.is_object() || !x.gpu.value("available", false)) continue;
    const double ts = x.gpu.value("timestamp", x.t_s);
    for (const auto& dev : x.gpu.value("devices", nlohmann::json::array())) {
      if (dev.is_object()) AddGpuSample(dev, ts, &per_gpu[dev.value("gpu", 0)]);
    }
  }
  const GpuAcc* best = nullptr;
  auto busy = [](const GpuAcc& g) {
    return std::max(Has(g.gr.mean()) ? g.gr.mean() : 0, Has(g.util.mean()) ? g.util.mean() : 0);
  };
  for (const auto& [i, g] : per_gpu) {
    if (best == nullptr || busy(g) > busy(*best)) best = &g;
  }
  if (best == nullptr) return;
  const GpuAcc& g = *best;
  s->gpu_samples = g.samples;
  s->gpu_util = g.util.mean();
  s->gr_active = g.gr.mean();
  s->sm_active = g.sm.mean();
  s->sm_occupancy = g.occ.mean();
  s->tensor_active = g.tensor.mean();
  s->dram_active = g.dram.mean();
  s->pcie_bytes_per_s = g.pcie.mean();
  s->fb_used_ratio = g.fb.mean();
  s->sm_clock_mhz = g.clock.mean();
  s->power_w = g.power.mean();
  s->power_limit_w = g.limit.mean();
  for (const auto& [r, n] : g.reasons) s->clock_reason_share[r] = static_cast<double>(n) / g.samples;
  const double dt_ns = (g.last_ts - g.first_ts) * 1e9;
  if (dt_ns > 0) {
    if (Has(g.pv0) && Has(g.pv1)) s->power_violation_share = std::clamp((g.pv1 - g.pv0) / dt_ns, 0.0, 1.0);
    if (Has(g.tv0) && Has(g.tv1)) s->thermal_violation_share = std::clamp((g.tv1 - g.tv0) / dt_ns, 0.0, 1.0);
  }
}

}  // namespace

ModelConfigInfo ParseModelConfig(const nlohmann::json& c) {
  ModelConfigInfo info;
  if (!c.is_object()) return info;
  info.known = true;
  info.max_batch_size = c.value("max_batch_size", 0);
  if (auto db = c.find("dynamic_batching"); db != c.end() && db->is_object()) {
    info.dynamic_batching = true;
    info.max_queue_delay_us = db->value("max_queue_delay_microseconds", 0.0);
  }
  for (const auto& g : c.value("instance_group", nlohmann::json::array())) {
    if (g.is_object()) info.instances += g.value("count", 1);
  }
  if (!info.dynamic_batching) info.max_batch_size = 0;  // batching off, whatever the cap
  return info;
}

void ParseServedPrecision(const nlohmann::json& models, const std::string& model, ModelConfigInfo* info) {
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array()) return;
  for (const nlohmann::json& m : models["data"]) {
    if (!m.is_object() || m.value("id", std::string()) != model) continue;
    if (const auto d = m.find("device"); d != m.end() && d->is_string()) info->device = d->get<std::string>();
    const auto p = m.find("precision");
    if (p == m.end() || !p->is_object()) return;
    const auto str = [&](const char* key) {
      const auto it = p->find(key);
      return it != p->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    info->kv_cache_dtype = str("kv_cache_dtype");
    info->weight_quantization = str("quantization");
    return;
  }
}

Signals ExtractSignals(const std::vector<Scrape>& scrapes, const ModelConfigInfo& config,
                       const std::string& model) {
  Signals s;
  s.model = model;
  s.kv_cache_dtype = config.kv_cache_dtype;
  s.weight_quantization = config.weight_quantization;
  s.device = config.device;
  if (scrapes.empty()) return s;
  s.window_s = scrapes.back().t_s - scrapes.front().t_s;
  s.max_batch_size = config.max_batch_size;
  s.max_queue_delay_us = config.max_queue_delay_us;
  s.instances = config.instances;
  const Samples& last = scrapes.back().metrics;
  if (Has(Total(last, "kv_cache_usage_ratio", model)) || Has(Total(last, "num_requests_running", model))) {
    s.kind = "llm";
  } else if (Has(Total(last, "inference_exec_count_total", model))) {
    s.kind = "classic";
  }
  ExtractLedger(scrapes.front().metrics, last, model, &s);
  if (s.window_s > 0) s.requests_per_s = s.requests / s.window_s;
  if (s.kind == "classic") ExtractBatcher(scrapes, model, s.window_s, &s);
  if (s.kind == "llm") ExtractLlm(scrapes, model, s.window_s, &s);
  ExtractGpu(scrapes, &s);
  return s;
}

void ApplyDeviceRates(double hbm_gbps, double tensor_tflops, Signals* s) {
  // A model without a cost model exports zero bytes: no floor to compute from those.
  const bool bytes = Has(s->step_weight_bytes) && s->step_weight_bytes > 0;
  const bool flops = Has(s->step_matmul_flops) && s->step_matmul_flops > 0;
  if (hbm_gbps > 0) {
    s->hbm_gbps = hbm_gbps;
    if (bytes) {
      s->step_weights_ms = 1e3 * s->step_weight_bytes / (hbm_gbps * 1e9);
      s->step_kv_ms = 1e3 * (Has(s->step_kv_bytes) ? s->step_kv_bytes : 0) / (hbm_gbps * 1e9);
    }
  }
  if (tensor_tflops > 0) {
    s->tensor_tflops = tensor_tflops;
    if (flops) {
      s->step_matmul_ms = 1e3 * s->step_matmul_flops / (tensor_tflops * 1e12);
      s->step_attention_ms =
          1e3 * (Has(s->step_attention_flops) ? s->step_attention_flops : 0) / (tensor_tflops * 1e12);
    }
  }
  const double mem = Has(s->step_weights_ms) ? s->step_weights_ms + s->step_kv_ms : kNaN;
  const double math = Has(s->step_matmul_ms) ? s->step_matmul_ms + s->step_attention_ms : kNaN;
  s->step_memory_ms = mem;
  s->step_math_ms = math;
  if (Has(mem) && Has(math)) {
    s->step_floor_ms = std::max(mem, math);
  } else if (Has(mem) || Has(math)) {
    s->step_floor_ms = Has(mem) ? mem : math;  // a lower bound from the one rate known
  }
}

}  // namespace stoke::doctor
