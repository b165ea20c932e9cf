// The dynamic batcher's part of the timeline (telemetry/trace.h): each execution as a span on its instance's
// track, its stages nested inside in the order they ran. Called only while a trace is on.
#pragma once

#include <cstdint>
#include <string>

#include "base/clock.h"
#include "serve/batcher/classic_model.h"
#include "serve/batcher/launch_rule.h"

namespace stoke {

struct BatchTraceRecord {
  std::string model;
  int instance = 0;
  Nanos dispatch = 0;  // the batch closed and was handed to the instance
  Nanos start = 0;     // Execute began
  Nanos end = 0;       // Execute returned
  int64_t rows = 0;
  int64_t requests = 0;
  CloseReason reason = CloseReason::kImmediate;
  ExecTimes exec;                // on a GPU, h2d/compute/d2h are CUDA-event times
  const char* copy_memory = "";  // "pinned" | "pageable" | ""
  bool ok = true;
};

// Track "batcher <model>" / "instance <i>": a "batch" span [start, end) with rows, requests, close reason;
// inside it preprocess, h2d, compute, d2h, postprocess back to back (clipped to the batch), the copies tagged
// with their host memory.
void TraceBatch(const BatchTraceRecord& b);

}  // namespace stoke
