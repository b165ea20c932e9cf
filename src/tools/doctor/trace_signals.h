// A trace (Chrome trace-event JSON from POST /v1/debug/trace, telemetry/trace.h) -> TraceSignals: how many
// kernels the GPU ran per request and per batch/step, how long they lasted and how long the GPU sat idle
// between them. Pure: tested on recorded and constructed traces in trace_signals_test.cc.
//
// What counts: on a process named "GPU <i>" (CUPTI activity records; its "counters" track is NVML, not
// work), a span with a "grid" arg is a kernel, "memcpy ..." / "memset" a copy. Requests are the spans of the
// "requests" process with an "id" arg; batches the "batch" spans of "batcher ..." processes and the
// "step (...)" spans of engine processes. The GPU figures are those of the GPU with the most kernels.
// A trace without kernel records (a CPU model, a build without CUDA, no libcupti, another CUPTI subscriber)
// gives gpu_timeline = false and a note saying so, with the server's own reason (otherData.kernel_track);
// where the engine timed its steps with CUDA events instead ("gpu step" spans on a "gpu (cuda events)" track),
// gpu_events = true and the busy share and gaps come from those steps.
#pragma once

#include <string_view>

#include "base/status.h"
#include "tools/doctor/signals.h"

namespace stoke::doctor {

// InvalidArgument when `json` is not a trace-event file.
StatusOr<TraceSignals> ExtractTraceSignals(std::string_view json);

}  // namespace stoke::doctor
