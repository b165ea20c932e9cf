#include "tools/doctor/render.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "tools/bench/svg_chart.h"

namespace stoke::doctor {
namespace {

using nlohmann::json;

json Num(double v) {
  return Has(v) ? json(v) : json(nullptr);
}

std::string Fmt(double v, const std::string& unit = "") {
  if (!Has(v)) return "-";
  if (unit == "bytes/s") return fmt::format("{:.1f} MB/s", v / 1e6);
  if (unit == "count" || unit == "MHz" || unit == "W") return fmt::format("{:.0f}", v);
  if (std::abs(v) >= 100) return fmt::format("{:.0f}", v);
  if (std::abs(v) >= 10) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

std::string Escape(const std::string& s) {
  return bench::XmlEscape(s);
}

json VerdictJson(const Verdict& v) {
  json ev = json::array();
  for (const Evidence& e : v.evidence) {
    ev.push_back({{"signal", e.signal},
                  {"value", Num(e.value)},
                  {"op", e.op},
                  {"threshold", Num(e.threshold)},
                  {"unit", e.unit},
                  {"note", e.note}});
  }
  return {{"bottleneck", v.bottleneck},
          {"confidence", v.confidence},
          {"confidence_label", ConfidenceWord(v.confidence)},
          {"summary", v.summary},
          {"evidence", ev},
          {"next_step", v.next_step},
          {"why", v.why}};
}

json ThresholdsJson(const Thresholds& t) {
  return {{"min_requests", t.min_requests},
          {"host_share", t.host_share},
          {"io_share", t.io_share},
          {"io_min_s", t.io_min_s},
          {"copy_share", t.copy_share},
          {"matters_busy", t.matters_busy},
          {"matters_latency", t.matters_latency},
          {"queue_share", t.queue_share},
          {"saturated_busy", t.saturated_busy},
          {"idle_busy", t.idle_busy},
          {"idle_queue_share", t.idle_queue_share},
          {"min_scaling", t.min_scaling},
          {"gpu_busy", t.gpu_busy},
          {"sm_low", t.sm_low},
          {"dram_high", t.dram_high},
          {"dram_streaming", t.dram_streaming},
          {"tensor_idle", t.tensor_idle},
          {"sm_busy_streaming", t.sm_busy_streaming},
          {"tensor_high", t.tensor_high},
          {"sm_high", t.sm_high},
          {"step_memory_heavy", t.step_memory_heavy},
          {"memory_heavy_flop_per_byte", t.memory_heavy_flop_per_byte},
          {"device_share", t.device_share},
          {"kv_full", t.kv_full},
          {"no_blocks_share", t.no_blocks_share},
          {"fb_full", t.fb_full},
          {"throttle_share", t.throttle_share},
          {"reason_share", t.reason_share},
          {"tiny_kernel_us", t.tiny_kernel_us},
          {"many_kernels_per_request", t.many_kernels_per_request}};
}

// The ledger's stages in pipeline order (stages the doctor does not know come last, by name).
std::vector<std::pair<std::string, double>> OrderedStages(const Signals& s) {
  static const char* const kOrder[] = {"recv",   "queue",      "preprocess", "h2d", "compute",     "prefill",
                                       "decode", "interleave", "schedule",   "d2h", "postprocess", "send"};
  std::vector<std::pair<std::string, double>> out;
  std::map<std::string, double> rest = s.stage_s;
  for (const char* k : kOrder) {
    auto it = rest.find(k);
    if (it == rest.end()) continue;
    out.emplace_back(k, it->second);
    rest.erase(it);
  }
  for (const auto& kv : rest) out.push_back(kv);
  return out;
}

// The ledger line: mean milliseconds per request per stage.
std::string LedgerLine(const Signals& s) {
  std::string out;
  for (const auto& [k, v] : OrderedStages(s))
    out += fmt::format("{}{} {:.2f}", out.empty() ? "" : " | ", k, 1e3 * v);
  return out;
}

std::string LoadLine(const Signals& s) {
  std::string out;
  for (const LoadPoint& p : s.load) {
    out += fmt::format("{}c={}: {:.1f} req/s, p50 {:.1f} ms, p99 {:.1f} ms{}", out.empty() ? "" : "; ",
                       p.concurrency, p.requests_per_s, p.p50_ms, p.p99_ms,
                       p.errors > 0 ? fmt::format(" ({} errors)", p.errors) : "");
  }
  return out;
}

std::string GpuLine(const Signals& s) {
  if (s.gpu_samples == 0) return "";
  return fmt::format(
      "GPU-Util {} | GR active {} | SM active {} | tensor {} | DRAM {} | SM clock {} MHz | power {} W",
      Fmt(s.gpu_util), Fmt(s.gr_active), Fmt(s.sm_active), Fmt(s.tensor_active), Fmt(s.dram_active),
      Fmt(s.sm_clock_mhz, "MHz"), Fmt(s.power_w, "W"));
}

// The engine's step split: measured model / host time per step, what a step reads and computes, and (with
// the device's rates) how long those take at the rates. "" when the window has no steps.
std::string StepLine(const Signals& s) {
  if (!Has(s.steps)) return "";
  std::string out = fmt::format(
      "steps: {:.0f} in the window (engine busy {}), per step {:.2f} ms = model {:.2f} + host {:.2f}; "
      "{:.1f} decode + {:.1f} prefill tokens",
      s.steps, Fmt(s.engine_busy), s.step_ms, s.step_model_ms, s.step_host_ms, s.step_decode_tokens,
      s.step_prefill_tokens);
  if (Has(s.step_output_ms) && s.step_output_ms > 0) {
    out += fmt::format("; output thread {:.2f} ms per step beside the model (--async-output on)",
                       s.step_output_ms);
  }
  if (Has(s.step_weight_bytes) && s.step_weight_bytes > 0) {
    out +=
        fmt::format("; reads weights {:.3f} GB + KV {:.3f} GB; matmul {:.3f} TFLOP + attention {:.3f} TFLOP",
                    s.step_weight_bytes / 1e9, s.step_kv_bytes / 1e9, s.step_matmul_flops / 1e12,
                    s.step_attention_flops / 1e12);
  }
  if (Has(s.step_floor_ms)) {
    std::string rates = Has(s.hbm_gbps) ? fmt::format("{:g} GB/s", s.hbm_gbps) : "";
    if (Has(s.tensor_tflops))
      rates += fmt::format("{}{:g} TFLOP/s", rates.empty() ? "" : " and ", s.tensor_tflops);
    out += fmt::format(
        "\n  at {}: weights {} ms, KV {} ms, matmul {} ms, attention {} ms; floor {:.2f} ms = {:.0f}% "
        "of the model's {:.2f} ms",
        rates, Fmt(s.step_weights_ms), Fmt(s.step_kv_ms), Fmt(s.step_matmul_ms), Fmt(s.step_attention_ms),
        s.step_floor_ms, s.step_model_ms > 0 ? 100 * s.step_floor_ms / s.step_model_ms : 0.0,
        s.step_model_ms);
  }
  return out;
}

// The GPU timeline's figures from the trace, or why there are none; "" when no trace was taken.
std::string TraceLine(const TraceSignals& t) {
  if (!t.taken) return "";
  if (!t.gpu_timeline) return t.note;
  std::string line = fmt::format(
      "{:.1f} s trace: {} kernels, {} copies; {} per request ({} requests), {} per batch/step; mean kernel "
      "{:.1f} us; GPU busy {:.0f}% of the span, {} gaps between records, mean {:.1f} us, largest {:.2f} ms",
      t.seconds, t.kernels, t.copies, Fmt(t.kernels_per_request), t.requests, Fmt(t.kernels_per_batch),
      t.mean_kernel_us, 100 * t.busy_share, t.gaps, t.gap_mean_us, t.largest_gap_us / 1000);
  if (t.dropped > 0) line += fmt::format(" ({} events dropped: the counts are lower bounds)", t.dropped);
  return line;
}

// Where the GPU's kernel time went (by kind, then the largest kernels), or "" without kernel records.
std::string KernelsLine(const TraceSignals& t) {
  if (!t.gpu_timeline || t.top_kernels.empty()) return "";
  std::string line =
      fmt::format("attention {:.0f}%, matmul {:.0f}%, other {:.0f}% of GPU kernel time; largest:",
                  100 * t.attention_share, 100 * t.matmul_share, 100 * t.other_share);
  for (size_t i = 0; i < t.top_kernels.size() && i < 3; ++i) {
    const TraceSignals::TopKernel& k = t.top_kernels[i];
    line += fmt::format("{} {} {:.1f}% ({})", i ? "," : "", k.name, 100 * k.share, k.kind);
    if (k.us_per_batch > 0) line += fmt::format(" {:.2f} ms per batch/step", k.us_per_batch / 1000);
  }
  return line;
}

json TraceJson(const TraceSignals& t) {
  if (!t.taken) return nullptr;
  return {{"gpu_timeline", t.gpu_timeline},
          {"note", t.note},
          {"seconds", Num(t.seconds)},
          {"dropped_events", t.dropped},
          {"kernels", t.kernels},
          {"copies", t.copies},
          {"requests", t.requests},
          {"batches", t.batches},
          {"kernels_per_request", Num(t.kernels_per_request)},
          {"kernels_per_batch", Num(t.kernels_per_batch)},
          {"mean_kernel_us", Num(t.mean_kernel_us)},
          {"busy_share", Num(t.busy_share)},
          {"gaps", t.gaps},
          {"gap_mean_us", Num(t.gap_mean_us)},
          {"largest_gap_us", Num(t.largest_gap_us)},
          {"attention_share", Num(t.attention_share)},
          {"matmul_share", Num(t.matmul_share)},
          {"other_share", Num(t.other_share)},
          {"top_kernels", [&] {
             json a = json::array();
             for (const TraceSignals::TopKernel& k : t.top_kernels) {
               a.push_back({{"name", k.name},
                            {"kind", k.kind},
                            {"share", k.share},
                            {"us_per_batch", k.us_per_batch},
                            {"count", k.count}});
             }
             return a;
           }()}};
}

// GET /v1/debug/requests ({"requests": [{"id", "e2e_ms", "stages_ms": {...}}, ...]}): one line per request,
// its latency and its largest stages. Anything else in the body is ignored.
std::vector<std::string> SlowestLines(const json& body, size_t max_lines) {
  std::vector<std::string> out;
  if (!body.is_object() || !body.contains("requests") || !body["requests"].is_array()) return out;
  for (const json& r : body["requests"]) {
    if (out.size() >= max_lines || !r.is_object()) break;
    std::vector<std::pair<double, std::string>> stages;
    const json stages_ms = r.value("stages_ms", json::object());  // named: items() of a temporary dangles
    if (!stages_ms.is_object()) continue;
    for (const auto& [k, v] : stages_ms.items()) {
      if (v.is_number()) stages.emplace_back(v.get<double>(), k);
    }
    std::sort(stages.rbegin(), stages.rend());
    std::string top;
    for (size_t i = 0; i < stages.size() && i < 3; ++i) {
      top += fmt::format("{}{} {:.1f}", i ? ", " : "", stages[i].second, stages[i].first);
    }
    const json id = r.value("id", json(nullptr));
    const json e2e = r.value("e2e_ms", json(nullptr));
    out.push_back(fmt::format("{} {} ms: {}",
                              id.is_null() ? "?" : (id.is_string() ? id.get<std::string>() : id.dump()),
                              e2e.is_number() ? fmt::format("{:.1f}", e2e.get<double>()) : "?", top));
  }
  return out;
}

std::string EvidenceRow(const Evidence& e) {
  std::string cmp = e.op.empty() ? "" : fmt::format("{} {}", e.op, Fmt(e.threshold, e.unit));
  return fmt::format("    {:<34} {:>10}  {:<10} {}\n", e.signal, Fmt(e.value, e.unit), cmp, e.note);
}

}  // namespace

json SignalsJson(const Signals& s) {
  json load = json::array();
  for (const LoadPoint& p : s.load) {
    load.push_back({{"concurrency", p.concurrency},
                    {"requests_per_s", p.requests_per_s},
                    {"p50_ms", p.p50_ms},
                    {"p99_ms", p.p99_ms},
                    {"errors", p.errors}});
  }
  json stages = json::object();
  for (const auto& [k, v] : s.stage_s) stages[k] = v;
  return {{"window_s", s.window_s},
          {"model", s.model},
          {"kind", s.kind},
          {"requests", s.requests},
          {"requests_per_s", Num(s.requests_per_s)},
          {"stage_s", stages},
          {"latency_s", Num(s.latency_s)},
          {"queue_s", Num(s.queue_s)},
          {"io_s", Num(s.io_s)},
          {"host_s", Num(s.host_s)},
          {"copy_s", Num(s.copy_s)},
          {"device_s", Num(s.device_s)},
          {"service_s", Num(s.service_s)},
          {"mean_batch_size", Num(s.mean_batch_size)},
          {"max_batch_size", s.max_batch_size},
          {"max_queue_delay_us", Num(s.max_queue_delay_us)},
          {"instances", s.instances},
          {"close_share", s.close_share},
          {"instance_busy", Num(s.instance_busy)},
          {"pending_mean", Num(s.pending_mean)},
          {"kv_usage_max", Num(s.kv_usage_max)},
          {"kv_usage_mean", Num(s.kv_usage_mean)},
          {"kv_blocks_total", Num(s.kv_blocks_total)},
          {"preemptions", Num(s.preemptions)},
          {"waiting_mean", Num(s.waiting_mean)},
          {"waiting_max", Num(s.waiting_max)},
          {"running_mean", Num(s.running_mean)},
          {"running_max", Num(s.running_max)},
          {"admission_share", s.admission_share},
          {"steps", Num(s.steps)},
          {"engine_busy", Num(s.engine_busy)},
          {"step_ms", Num(s.step_ms)},
          {"step_model_ms", Num(s.step_model_ms)},
          {"step_host_ms", Num(s.step_host_ms)},
          {"step_output_ms", Num(s.step_output_ms)},
          {"step_prefill_tokens", Num(s.step_prefill_tokens)},
          {"step_decode_tokens", Num(s.step_decode_tokens)},
          {"step_weight_bytes", Num(s.step_weight_bytes)},
          {"step_kv_bytes", Num(s.step_kv_bytes)},
          {"step_matmul_flops", Num(s.step_matmul_flops)},
          {"step_attention_flops", Num(s.step_attention_flops)},
          {"hbm_gbps", Num(s.hbm_gbps)},
          {"tensor_tflops", Num(s.tensor_tflops)},
          {"step_weights_ms", Num(s.step_weights_ms)},
          {"step_kv_ms", Num(s.step_kv_ms)},
          {"step_matmul_ms", Num(s.step_matmul_ms)},
          {"step_attention_ms", Num(s.step_attention_ms)},
          {"step_floor_ms", Num(s.step_floor_ms)},
          {"gpu_samples", s.gpu_samples},
          {"gpu_util", Num(s.gpu_util)},
          {"gr_active", Num(s.gr_active)},
          {"sm_active", Num(s.sm_active)},
          {"sm_occupancy", Num(s.sm_occupancy)},
          {"tensor_active", Num(s.tensor_active)},
          {"dram_active", Num(s.dram_active)},
          {"pcie_bytes_per_s", Num(s.pcie_bytes_per_s)},
          {"fb_used_ratio", Num(s.fb_used_ratio)},
          {"power_violation_share", Num(s.power_violation_share)},
          {"thermal_violation_share", Num(s.thermal_violation_share)},
          {"sm_clock_mhz", Num(s.sm_clock_mhz)},
          {"power_w", Num(s.power_w)},
          {"power_limit_w", Num(s.power_limit_w)},
          {"clock_reason_share", s.clock_reason_share},
          {"trace", TraceJson(s.trace)},
          {"load", load}};
}

json ReportJson(const DoctorReport& r) {
  json verdicts = json::array();
  for (const Verdict& v : r.verdicts) verdicts.push_back(VerdictJson(v));
  return {{"schema", "stoke.doctor.v1"},
          {"url", r.url},
          {"model", r.model},
          {"api", r.api},
          {"load", r.load},
          {"started_at", r.started_at},
          {"verdicts", verdicts},
          {"signals", SignalsJson(r.signals)},
          {"thresholds", ThresholdsJson(r.thresholds)},
          {"notes", r.notes},
          {"slowest_requests", r.slowest}};
}

std::string ReportText(const DoctorReport& r) {
  const Signals& s = r.signals;
  std::string out = fmt::format("stoke doctor  {}  model {} ({}), {:.1f} s window, {} requests ({} req/s)\n",
                                r.url, r.model, r.api, s.window_s, s.requests, Fmt(s.requests_per_s));
  if (!s.load.empty()) out += "load:   " + LoadLine(s) + "\n";
  out += "\n";
  for (size_t i = 0; i < r.verdicts.size(); ++i) {
    const Verdict& v = r.verdicts[i];
    out += fmt::format("{} {}  (confidence {}, {:.2f})\n  {}\n", i == 0 ? "VERDICT" : "ALSO   ", v.bottleneck,
                       ConfidenceWord(v.confidence), v.confidence, v.summary);
    out += "  evidence (value, rule threshold):\n";
    for (const Evidence& e : v.evidence) out += EvidenceRow(e);
    out += fmt::format("  next:  {}\n", v.next_step);
    if (!v.why.empty()) out += fmt::format("  why:   {}\n", v.why);
    out += "\n";
  }
  if (!s.stage_s.empty()) out += "ledger (ms per request): " + LedgerLine(s) + "\n";
  if (Has(s.mean_batch_size) || Has(s.instance_busy)) {
    out += fmt::format("batcher: mean batch {} of {}, instances {} busy {}, pending {}\n",
                       Fmt(s.mean_batch_size), s.max_batch_size, s.instances, Fmt(s.instance_busy),
                       Fmt(s.pending_mean));
  }
  if (s.kind == "llm") {
    out += fmt::format("engine: KV usage max {} (of {} blocks), running {} waiting {}, preemptions {}\n",
                       Fmt(s.kv_usage_max), Fmt(s.kv_blocks_total, "count"), Fmt(s.running_mean),
                       Fmt(s.waiting_mean), Fmt(s.preemptions, "count"));
  }
  if (std::string st = StepLine(s); !st.empty()) out += st + "\n";
  if (std::string g = GpuLine(s); !g.empty()) out += g + "\n";
  if (s.trace.gpu_timeline) out += "timeline: " + TraceLine(s.trace) + "\n";
  if (std::string k = KernelsLine(s.trace); !k.empty()) out += "kernels: " + k + "\n";
  const std::vector<std::string> slow = SlowestLines(r.slowest, 3);
  if (!slow.empty()) out += "slowest requests (id, e2e, largest stages in ms):\n";
  for (const std::string& l : slow) out += "  " + l + "\n";
  for (const std::string& n : r.notes) out += "note: " + n + "\n";
  return out;
}

std::string ReportHtml(const DoctorReport& r) {
  const Signals& s = r.signals;
  std::string h =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>stoke doctor: " +
      Escape(r.model) +
      "</title><style>"
      "body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#1b1f24;background:#fff}"
      "h1{font-size:1.5em}.v{border-left:6px solid #c0392b;padding:.6em 1em;margin:1em 0;background:#fbf3f2}"
      ".v.also{border-color:#d68910;background:#fdf6ec}.v.none{border-color:#1e8449;background:#eef8f1}"
      ".b{font-size:1.4em;font-weight:bold;font-family:monospace}.conf{color:#555}"
      "table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .8em;border-bottom:1px solid #ddd;"
      "text-align:left}td.n{text-align:right;font-family:monospace}.next{font-family:monospace;background:#"
      "eef;"
      "padding:.4em .6em;display:block;margin:.4em 0}.bar{display:inline-block;height:1em;background:#2e86c1}"
      ".muted{color:#666}</style></head><body>\n";
  h += fmt::format(
      "<h1>stoke doctor</h1><p class=\"muted\">{} &middot; model <b>{}</b> ({}) &middot; load {} "
      "&middot; {:.1f} s window, {} requests &middot; {}</p>\n",
      Escape(r.url), Escape(r.model), Escape(r.api), Escape(r.load), s.window_s, s.requests,
      Escape(r.started_at));
  for (size_t i = 0; i < r.verdicts.size(); ++i) {
    const Verdict& v = r.verdicts[i];
    const std::string cls = v.bottleneck == "none" ? "v none" : (i == 0 ? "v" : "v also");
    h += fmt::format(
        "<div class=\"{}\"><div><span class=\"b\">{}</span> <span class=\"conf\">confidence {} "
        "({:.2f})</span></div><p>{}</p><table><tr><th>signal</th><th>value</th><th>rule</th>"
        "<th></th></tr>",
        cls, Escape(v.bottleneck), ConfidenceWord(v.confidence), v.confidence, Escape(v.summary));
    for (const Evidence& e : v.evidence) {
      h += fmt::format("<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                       Escape(e.signal), Fmt(e.value, e.unit),
                       e.op.empty() ? "" : Escape(e.op + " " + Fmt(e.threshold, e.unit)), Escape(e.note));
    }
    h += fmt::format(
        "</table><b>Next:</b><code class=\"next\">{}</code><span class=\"muted\">{}</span></div>\n",
        Escape(v.next_step), Escape(v.why));
  }
  if (!s.stage_s.empty() && Has(s.latency_s) && s.latency_s > 0) {
    h += "<h2>Where a request's time goes</h2><table>";
    for (const auto& [stage, sec] : OrderedStages(s)) {
      const double pct = 100 * sec / s.latency_s;
      h += fmt::format(
          "<tr><td>{}</td><td class=\"n\">{:.3f} ms</td><td><span class=\"bar\" style=\"width:{:.0f}px\">"
          "</span> {:.0f}%</td></tr>",
          Escape(stage), 1e3 * sec, 4 * pct, pct);
    }
    h += "</table>\n";
  }
  if (Has(s.steps) && Has(s.step_ms) && s.step_ms > 0) {
    // One engine step: the measured parts, then (with the device's rates) the time its reads and math take
    // at those rates, each bar on the same scale (px per ms) as the step.
    h += "<h2>Where an engine step goes</h2><p class=\"muted\">" + Escape(StepLine(s)) + "</p><table>";
    const double px_per_ms = 400 / std::max({s.step_ms, Has(s.step_floor_ms) ? s.step_floor_ms : 0.0,
                                             Has(s.step_matmul_ms) ? s.step_matmul_ms : 0.0});
    auto row = [&](const char* name, double ms, const char* what) {
      if (!Has(ms)) return;
      h += fmt::format(
          "<tr><td>{}</td><td class=\"n\">{:.3f} ms</td><td><span class=\"bar\" style=\"width:{:.0f}px\">"
          "</span></td><td class=\"muted\">{}</td></tr>",
          name, ms, px_per_ms * ms, what);
    };
    row("model", s.step_model_ms, "measured: inside the model's step");
    row("host", s.step_host_ms, "measured: planning, inputs, sampling, detokenising");
    if (Has(s.step_output_ms) && s.step_output_ms > 0)
      row("output thread", s.step_output_ms,
          "measured: tokens' text on the output thread while the model ran (--async-output on; not in the "
          "step)");
    row("weights", s.step_weights_ms, "modelled: the weights read once at the bandwidth");
    row("KV", s.step_kv_ms, "modelled: each sequence's KV read once at the bandwidth");
    row("matmul", s.step_matmul_ms, "modelled: 2 x parameters per token at the GEMM rate");
    row("attention", s.step_attention_ms, "modelled: query-key pairs at the GEMM rate");
    row("floor", s.step_floor_ms, "max(reads, math): the least the model's part could take");
    h += "</table>\n";
  }
  if (!s.load.empty()) h += "<h2>Load driven</h2><p>" + Escape(LoadLine(s)) + "</p>\n";
  if (std::string g = GpuLine(s); !g.empty()) h += "<h2>GPU</h2><p>" + Escape(g) + "</p>\n";
  if (std::string tl = TraceLine(s.trace); !tl.empty())
    h += "<h2>GPU timeline</h2><p>" + Escape(tl) + "</p>\n";
  if (std::string k = KernelsLine(s.trace); !k.empty()) h += "<p>" + Escape(k) + "</p>\n";
  const std::vector<std::string> slow = SlowestLines(r.slowest, 5);
  if (!slow.empty()) {
    h += "<h2>Slowest requests</h2><p class=\"muted\">id, end-to-end, largest stages (ms)</p><ul>";
    for (const std::string& l : slow) h += "<li>" + Escape(l) + "</li>";
    h += "</ul>\n";
  }
  h += "<h2>All signals</h2><table>";
  const json all = SignalsJson(s);  // a named value: items() of a temporary would dangle
  for (const auto& [k, v] : all.items()) {
    if (k == "load" || k == "stage_s" || k == "trace") continue;
    h += fmt::format("<tr><td>{}</td><td class=\"n\">{}</td></tr>", Escape(k), Escape(v.dump()));
  }
  h += "</table>\n";
  for (const std::string& n : r.notes) h += "<p class=\"muted\">note: " + Escape(n) + "</p>\n";
  h += "<p class=\"muted\">Rules and thresholds: docs/doctor.md.</p></body></html>\n";
  return h;
}

}  // namespace stoke::doctor
