#include "tools/bench/aggregate.h"

#include "tools/bench/stats.h"

namespace stoke::bench {

double OutputTokensIn(const RequestRecord& r, Nanos start, Nanos end) {
  // A request cut at the drain ("incomplete") still delivered the tokens it streamed: they count when they
  // arrived (long requests outlive a window, and leaving them out undercounts the server's rate). Other
  // failures count nothing.
  if ((!r.error.empty() && r.error != kIncompleteError) || r.done == 0) return 0;
  if (r.first_token == 0 || r.first_token == r.done || r.itl_ms.empty()) {
    // Not streamed chunk by chunk: the tokens arrive with the first chunk (or the whole response).
    Nanos t = r.first_token > 0 ? r.first_token : r.done;
    return t >= start && t < end ? r.output_tokens : 0;
  }
  // One streamed chunk per token for stoke and vLLM; if the server's usage says otherwise, scale.
  const double per_chunk = static_cast<double>(r.output_tokens) / (r.itl_ms.size() + 1);
  double t = static_cast<double>(r.first_token), n = 0;
  n += t >= start && t < end;
  for (float gap : r.itl_ms) {
    t += gap * 1e6;
    n += t >= start && t < end;
  }
  return n * per_chunk;
}

double TpotMs(const RequestRecord& r) {
  if (r.output_tokens < 2 || r.first_token == 0 || r.done < r.first_token) return -1;
  return (r.done - r.first_token) * 1e-6 / (r.output_tokens - 1);
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.error.empty() || r.done == 0) return false;
  if (slo.e2e_ms > 0 && E2eMs(r) > slo.e2e_ms) return false;
  if (slo.ttft_ms > 0 && (r.first_token == 0 || TtftMs(r) > slo.ttft_ms)) return false;
  if (slo.tpot_ms > 0) {
    double tpot = TpotMs(r);
    if (tpot >= 0 && tpot > slo.tpot_ms) return false;
  }
  return true;
}

void AggregatePoint(const std::vector<RequestRecord>& records, Nanos measure_start, Nanos measure_end,
                    const Slo& slo, PointResult* p) {
  const double period_s = (measure_end - measure_start) * 1e-9;
  p->measured_s = period_s;
  std::vector<double> e2e, ttft, tpot, itl;
  int64_t good = 0, completed_in_period = 0, in_tokens_done = 0;
  double out_tokens_in_period = 0;
  int64_t in_tokens_sum = 0, out_tokens_sum = 0;
  for (const RequestRecord& r : records) {
    // Throughput: successful completions inside the period, whoever scheduled them.
    if (r.error.empty() && r.done >= measure_start && r.done < measure_end) {
      ++completed_in_period;
      in_tokens_done += r.input_tokens;
    }
    out_tokens_in_period += OutputTokensIn(r, measure_start, measure_end);
    if (r.warmup || r.scheduled < measure_start || r.scheduled >= measure_end) continue;
    ++p->sent;
    std::string kind = r.error;
    if (kind.empty() && r.done == 0) kind = kIncompleteError;
    if (!kind.empty()) {
      p->errors[kind]++;
      if (!p->error_examples.count(kind)) p->error_examples[kind] = r.error_detail;
      continue;
    }
    ++p->succeeded;
    e2e.push_back(E2eMs(r));
    if (r.first_token > 0) ttft.push_back(TtftMs(r));
    if (double t = TpotMs(r); t >= 0) tpot.push_back(t);
    for (float g : r.itl_ms) itl.push_back(g);
    in_tokens_sum += r.input_tokens;
    out_tokens_sum += r.output_tokens;
    if (MeetsSlo(r, slo)) ++good;
  }
  if (period_s > 0) {
    p->requests_per_s = completed_in_period / period_s;
    p->input_tokens_per_s = in_tokens_done / period_s;
    p->output_tokens_per_s = out_tokens_in_period / period_s;
  }
  if (p->succeeded > 0) {
    p->mean_input_tokens = static_cast<double>(in_tokens_sum) / p->succeeded;
    p->mean_output_tokens = static_cast<double>(out_tokens_sum) / p->succeeded;
  }
  p->goodput_fraction = p->sent > 0 ? static_cast<double>(good) / p->sent : 0;
  // Goodput counts the share of the period's requests that met the SLOs, at the rate they completed.
  p->goodput_rps = p->succeeded > 0 ? p->requests_per_s * good / p->succeeded : 0;
  p->latency_hist = LogHistogram(e2e);
  p->ttft_hist = LogHistogram(ttft);
  p->itl_hist = LogHistogram(itl);
  p->latency_ms = Summarize(e2e);
  p->ttft_ms = Summarize(ttft);
  p->tpot_ms = Summarize(tpot);
  p->itl_ms = Summarize(itl);
}

WindowStats WindowOf(const std::vector<RequestRecord>& records, Nanos start, Nanos end, Nanos point_start) {
  WindowStats w;
  w.start_s = (start - point_start) * 1e-9;
  w.duration_s = (end - start) * 1e-9;
  std::vector<double> lat, ttft, tpot;
  double tokens = 0;
  for (const RequestRecord& r : records) {
    tokens += OutputTokensIn(r, start, end);
    if (!r.error.empty() || r.done < start || r.done >= end || r.done == 0) continue;
    lat.push_back(E2eMs(r));
    if (r.first_token > 0) ttft.push_back(TtftMs(r));
    if (double t = TpotMs(r); t >= 0) tpot.push_back(t);
  }
  w.completed = static_cast<int64_t>(lat.size());
  if (w.duration_s > 0) {
    w.requests_per_s = w.completed / w.duration_s;
    w.output_tokens_per_s = tokens / w.duration_s;
  }
  Summary s = Summarize(lat);
  w.p50_ms = s.p50;
  w.p99_ms = s.p99;
  Summary t = Summarize(ttft);
  w.ttft_p50_ms = t.p50;
  w.ttft_p99_ms = t.p99;
  w.tpot_p50_ms = Summarize(tpot).p50;
  return w;
}

}  // namespace stoke::bench
