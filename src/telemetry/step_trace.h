// The continuous-batching loop's part of the timeline (telemetry/trace.h): each step as a span on the
// "engine <model>" / "llm loop" track, and the scheduler's state as counter tracks. Called from the loop's
// on_step hook; records only while a trace is on.
#pragma once

#include <string_view>

#include "telemetry/records.h"

namespace stoke {

// A "step" span [start, start + duration) with its batch (sequences that computed tokens), prefill and
// decode tokens and why admission stopped; counters "sequences" (running, waiting) and "kv_blocks" (used,
// free) at the step's start. With the step's device time (CUDA events: StepRecord::device_ns) also a "gpu step"
// span on the "gpu (cuda events)" track, ending when the host saw the step finish: the GPU's busy time and
// the gaps between steps where CUPTI's kernel records are missing.
void TraceStep(std::string_view model, const StepRecord& step);

}  // namespace stoke
