// From request records to a point's numbers: which requests count (those scheduled inside the measurement
// period, however late they finished), throughput (completions inside the period), percentiles, errors by
// kind and goodput under the SLOs. Token throughput counts tokens as they arrive (OutputTokensIn). Pure
// functions, so the arithmetic is tested without a network.
#pragma once

#include <vector>

#include "base/clock.h"
#include "tools/bench/bench_types.h"

namespace stoke::bench {

// Latency from the scheduled send time, milliseconds.
inline double E2eMs(const RequestRecord& r) {
  return (r.done - r.scheduled) * 1e-6;
}
inline double TtftMs(const RequestRecord& r) {
  return (r.first_token - r.scheduled) * 1e-6;
}
// (last token - first token) / (tokens - 1); < 0 when undefined.
double TpotMs(const RequestRecord& r);
bool MeetsSlo(const RequestRecord& r, const Slo& slo);
// Output tokens of a successful request that reached the client in [start, end): streamed tokens count when
// they arrive (so token throughput stays smooth when whole batches of requests finish together), others when
// the response does.
double OutputTokensIn(const RequestRecord& r, Nanos start, Nanos end);

// Fills the request/throughput/latency/goodput fields of `p` from the records scheduled in
// [measure_start, measure_end). Records with done == 0 and no error count as "incomplete".
void AggregatePoint(const std::vector<RequestRecord>& records, Nanos measure_start, Nanos measure_end,
                    const Slo& slo, PointResult* p);

// Stats of the successful requests that finished in [start, end) (used for the stability windows).
WindowStats WindowOf(const std::vector<RequestRecord>& records, Nanos start, Nanos end, Nanos point_start);

}  // namespace stoke::bench
