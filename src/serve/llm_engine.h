// The boundary between the network layer and an LLM's engine loop. The net layer parses, tokenizes and
// submits; the engine thread (which alone owns scheduler, KV and runner state) schedules steps and calls back
// with events. Callbacks run on the engine thread: they must only hand data to the net side and return.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/sampling.h"
#include "base/clock.h"
#include "base/status.h"

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
  Nanos postprocess = 0;           // its own sampling, detokenisation and stop checks
  std::vector<Nanos> inter_token;  // gap before each sampled token after the first
  int num_preemptions = 0;         // times its KV was dropped and recomputed

  Nanos queue() const { return first_scheduled ? first_scheduled - submit : 0; }
  Nanos ttft() const { return first_token ? first_token - (recv ? recv : submit) : 0; }
  Nanos engine_e2e() const { return finish ? finish - (recv ? recv : submit) : 0; }
};

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
  std::function<void(GenerationEvent)> on_event;  // called on the engine thread; the last one has finish set
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
};

}  // namespace stoke
