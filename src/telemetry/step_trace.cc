#include "telemetry/step_trace.h"

#include <string>

#include "telemetry/trace.h"

namespace stoke {

void TraceStep(std::string_view model, const StepRecord& s) {
  TraceRecorder& tr = TraceRecorder::Global();
  if (!tr.on()) return;
  const std::string process = "engine " + std::string(model);
  const TraceTrack loop = tr.Track(process, "llm loop");
  const char* kind =
      s.prefill_tokens > 0 ? (s.decode_tokens > 0 ? "step (mixed)" : "step (prefill)") : "step (decode)";
  TraceArgs args = {{"prefill_tokens", s.prefill_tokens}, {"decode_tokens", s.decode_tokens},
                    {"running", s.num_running},           {"waiting", s.num_waiting},
                    {"preempted", s.num_preempted},       {"kv_blocks_used", s.kv_blocks_used},
                    {"kv_blocks_free", s.kv_blocks_free}, {"admission_stop", s.admission_stop}};
  // Async output: the previous step's text side, done on the output thread while this step's model ran.
  if (s.output_ns > 0) args.emplace_back("output_thread_us", static_cast<double>(s.output_ns) * 1e-3);
  tr.Span(loop, kind, s.start, s.duration, std::move(args));
  if (s.device_ns > 0) {  // CUDA events around the model step (StepInput::time_device)
    const TraceTrack gpu = tr.Track(process, "gpu (cuda events)");
    tr.Span(gpu, "gpu step", s.device_end - s.device_ns, s.device_ns, {{"source", "cuda events"}});
  }
  tr.Counter(loop, "sequences", s.start, {{"running", s.num_running}, {"waiting", s.num_waiting}});
  tr.Counter(loop, "kv_blocks", s.start, {{"used", s.kv_blocks_used}, {"free", s.kv_blocks_free}});
  tr.Counter(loop, "step_tokens", s.start, {{"prefill", s.prefill_tokens}, {"decode", s.decode_tokens}});
}

}  // namespace stoke
