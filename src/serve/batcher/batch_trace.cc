#include "serve/batcher/batch_trace.h"

#include <fmt/format.h>

#include <algorithm>

#include "telemetry/trace.h"

namespace stoke {

void TraceBatch(const BatchTraceRecord& b) {
  TraceRecorder& tr = TraceRecorder::Global();
  if (!tr.on()) return;
  const TraceTrack t = tr.Track("batcher " + b.model, fmt::format("instance {}", b.instance));
  const Nanos dur = std::max<Nanos>(b.end - b.start, 0);
  tr.Span(t, "batch", b.start, dur,
          {{"rows", b.rows},
           {"requests", b.requests},
           {"close_reason", CloseReasonName(b.reason)},
           {"dispatch_to_start_us", static_cast<double>(b.start - b.dispatch) * 1e-3},
           {"status", b.ok ? "ok" : "error"}});
  const struct {
    const char* name;
    Nanos ns;
    bool copy;
  } stages[] = {{"preprocess", b.exec.preprocess, false},
                {"h2d", b.exec.h2d, true},
                {"compute", b.exec.compute, false},
                {"d2h", b.exec.d2h, true},
                {"postprocess", b.exec.postprocess, false}};
  Nanos at = b.start;
  for (const auto& s : stages) {
    const Nanos ns = std::min<Nanos>(s.ns, b.start + dur - at);  // never past the batch's end
    if (ns <= 0) continue;
    TraceArgs args;
    if (s.copy && b.copy_memory[0] != '\0') args.emplace_back("memory", b.copy_memory);
    tr.Span(t, s.name, at, ns, std::move(args));
    at += ns;
  }
}

}  // namespace stoke
