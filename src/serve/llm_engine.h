// The boundary between the network layer and an LLM's engine loop. The net layer parses, tokenizes and
// submits; the engine thread (which alone owns scheduler, KV and runner state) schedules steps and calls back
// with events. Callbacks run on the engine thread (or, with async output, its output thread; one request's
// events never run concurrently and keep their order): they must only hand data to the net side and return.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/sampling.h"
#include "base/clock.h"
#include "base/status.h"
#include "telemetry/ledger.h"

namespace stoke {

// Where a request's time went on the engine side: monotonic ns from the engine's clock (0 = not reached).
// The net layer adds the send side (last byte written) for the end-to-end figure.
struct RequestTimings {
  Nanos recv = 0;                  // first byte arrived (copied from the request)
  Nanos submit = 0;                // Submit() accepted it
  Nanos first_scheduled = 0;       // the first step that computed any of its tokens (end of queue time)
  Nanos first_token = 0;           // its first token was sampled
  Nanos finish = 0;                // the last event was produced
  Nanos compute = 0;               // wall time of the model steps it took part in (shared with its batch)
  Nanos prefill = 0;               // the part of `compute` in steps that computed its prompt (or recompute)
  Nanos decode = 0;                // the part of `compute` in steps that computed its next token
  Nanos schedule = 0;              // host time of its steps: planning, step inputs, step bookkeeping
  Nanos interleave = 0;            // sat while the loop did others' work: their sampling, steps without it
  Nanos postprocess = 0;           // its own sampling, detokenisation, stop checks and event hand-off
  std::vector<Nanos> inter_token;  // gap before each sampled token after the first
  int num_preemptions = 0;         // times its KV was dropped and recomputed

  // Between first_scheduled and finish the engine-side stages add up exactly:
  //   finish - first_scheduled == prefill + decode + schedule + interleave + postprocess.
  Nanos queue() const { return first_scheduled ? first_scheduled - submit : 0; }
  Nanos ttft() const { return first_token ? first_token - (recv ? recv : submit) : 0; }
  Nanos engine_e2e() const { return finish ? finish - (recv ? recv : submit) : 0; }
};

// The ledger of a generation request: recv (first byte -> `parsed`), preprocess (`parsed` -> submit), queue,
// the engine's stages, send (finish -> `end`, the last byte or the moment the ledger is written into the
// response); `other` closes the sum to end - recv. Never-scheduled requests (cancelled while waiting) queue
// until they finish.
// (Inline: the net layer uses it without linking the engine.)
inline Ledger GenerationLedger(const RequestTimings& t, Nanos parsed, Nanos end) {
  using S = LedgerStage;
  Ledger l;
  l.kind = LedgerKind::kGeneration;
  const Nanos recv = t.recv ? t.recv : t.submit;
  if (parsed < recv || parsed > t.submit) parsed = recv;  // not measured: all of it is preprocess
  l[S::kRecv] = parsed - recv;
  l[S::kPreprocess] = t.submit - parsed;
  const Nanos finish = t.finish ? t.finish : end;
  l[S::kQueue] = (t.first_scheduled ? t.first_scheduled : finish) - t.submit;
  l[S::kPrefill] = t.prefill;
  l[S::kDecode] = t.decode;
  l[S::kSchedule] = t.schedule;
  l[S::kInterleave] = t.interleave;
  l[S::kPostprocess] = t.postprocess;
  l[S::kSend] = end - finish;
  l.Close(end - recv);
  return l;
}

// One callback's worth of progress for a request.
struct GenerationEvent {
  std::vector<int32_t> token_ids;      // new tokens since the last event (stop-string tokens withheld)
  std::string text;                    // new UTF-8 text (never a broken character, never a stop string)
  std::vector<TokenLogprob> logprobs;  // one per token in token_ids when requested
  FinishReason finish = FinishReason::kNone;  // set on the last event only
  Status error;                               // set with finish == kError
  // Filled on the last event:
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  RequestTimings timings;
};

struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int priority = 0;                               // higher runs first; FCFS within a priority
  Nanos recv_time = 0;                            // when the first byte arrived (ledger)
  std::function<void(GenerationEvent)> on_event;  // on the engine (or output) thread; the last has finish set
};

class LlmEngine {
 public:
  virtual ~LlmEngine() = default;
  // Queues a request. Fails fast (ResourceExhausted -> 503) when the waiting queue is full, and with
  // InvalidArgument when prompt + max_tokens exceeds the context (message gives both numbers).
  virtual Status Submit(GenerationRequest request) = 0;
  // Stops a request (client went away); its blocks are freed within one step. Unknown ids are ignored.
  virtual void Cancel(const std::string& id) = 0;
  virtual int context_length() const = 0;
  // The most tokens (prompt + output) one sequence can ever hold: the context, or the whole KV cache when
  // that is smaller. A request's default max_tokens ("the rest of the context") is bounded by it.
  virtual int max_sequence_tokens() const { return context_length(); }
};

}  // namespace stoke
