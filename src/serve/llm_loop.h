// The engine loop for one decoder model: a single thread owns the scheduler, the KV block allocator and the
// model, and runs continuous-batching steps for as long as there is work. Net threads only touch the inbox.
//
//   net thread  Submit(request) -> validate -> inbox (mutex) -> wake
//   engine      drain inbox -> Scheduler::Schedule -> StepInput (tokens, positions, block tables)
//               -> DecoderModel::Step -> per sampling sequence: Sampler -> StreamDecoder -> stop checks
//               -> on_event(GenerationEvent) -> record step (StepRecord) and finished requests
//               (RequestTimings)
// With async output (LlmLoopOptions::async_output) the step's tokens only get their stop-token and length
// checks there; detokenising, stop strings and on_event wait for the output thread, which runs them while the
// engine thread is inside the next DecoderModel::Step.
//
// A request's outputs do not depend on what it is batched with: positions and block tables are per
// sequence, and each request's Sampler draws from (seed, its own step), so preemption and recompute replay
// the same tokens.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/decoder.h"
#include "engine/model/step_costs.h"
#include "engine/tokenizer/tokenizer.h"
#include "serve/llm_engine.h"
#include "serve/scheduler/scheduler.h"
#include "serve/scheduler/step_cost_fit.h"
#include "telemetry/records.h"

namespace stoke {

struct LlmLoopOptions {
  SchedulerOptions scheduler;  // token budget, max sequences, chunked prefill, watermark
  // Token slots per KV block. Smaller wastes less memory at the tail of each sequence and shares prefixes at
  // a finer grain; larger means shorter block tables. 16 is vLLM's default.
  int block_size = 16;
  // KV memory: `num_kv_blocks` when > 0, else kv_budget_bytes / (model KvBytesPerToken * block_size), capped
  // at what max_num_seqs sequences of full context could use. More KV: more concurrent sequences before
  // preemption, more prefix cache; costs memory.
  int64_t kv_budget_bytes = int64_t{1} << 30;
  int num_kv_blocks = 0;
  // Reuse KV of identical prompt prefixes (chained block hashes). Off: every prompt is computed in full.
  bool enable_prefix_caching = true;
  // Draw tokens where the logits are when the model can (DecoderModel::SamplesOnDevice, the CUDA backend):
  // only token ids cross to the host instead of a vocabulary-wide row of logits per sequence. Requests asking
  // for logprobs, or whose stop tokens are masked before min_tokens, are sampled on the host either way.
  bool device_sampling = true;
  // Async output (--async-output on): the text side of each sampled token (detokenising, stop strings, the
  // event hand-off) runs on an output thread while the model runs the next step, instead of between steps
  // where the device waits for it (vLLM's async output processing). What ends a sequence by token (EOS, stop
  // token ids, max_tokens, the context) is still decided before the next step is planned; a stop *string* is
  // seen one step late, so that step computes one more token for the sequence and drops it. Outputs, events
  // and their order are the same either way.
  bool async_output = false;
  // The step-time target (--target-step-ms; 0 = off): each step's prefill tokens are capped so that the
  // step's predicted time stays within it, predicted by a running fit of measured step times to tokens and KV
  // positions (serve/scheduler/step_cost_fit.h); the decodes always run, and a step takes at least
  // target_step_min_prefill prefill tokens so that waiting prompts progress. Bounds the inter-token gap that
  // prefill interleaving adds where max_num_batched_tokens alone cannot (the decode part grows with context).
  double target_step_ms = 0;
  int target_step_min_prefill = 64;
  // Requests waiting (not yet running) beyond which Submit fails with ResourceExhausted (HTTP 503).
  int max_waiting = 1024;
  // What a step costs in bytes and FLOPs (ComputeDecoderStepCosts): the modelled part of each StepRecord.
  // Unknown (the default): those fields stay 0; the counted ones (KV positions, pairs, rows) are always set.
  DecoderStepCosts step_costs;
  // Time source for timings and step records; nullptr = the real monotonic clock.
  Clock* clock = nullptr;
  // Called on the engine thread after each step that ran, and when a request finishes (any reason).
  // Must only hand data off and return.
  std::function<void(const StepRecord&)> on_step;
  std::function<void(const RequestTimings&, const GenerationEvent&)> on_request_done;
};

// Cumulative counters and current gauges; see LlmLoop::stats().
struct LlmLoopStats {
  EngineSnapshot engine;  // running/waiting, KV blocks, prefix cache (tokens), preemptions
  int64_t steps = 0;
  int64_t requests_submitted = 0;
  int64_t requests_rejected = 0;  // Submit failed (queue full, too long, invalid)
  int64_t requests_finished = 0;  // any reason, cancellations and errors included
  int64_t requests_cancelled = 0;
  int64_t requests_failed = 0;    // finished with kError
  int64_t prompt_tokens = 0;      // of finished requests
  int64_t generation_tokens = 0;  // sampled tokens, all requests
  int64_t prefill_tokens = 0;     // computed by the model (prefix hits excluded, recompute included)
  int64_t recompute_tokens = 0;
  StepRecord last_step;
};

class LlmLoop final : public LlmEngine {
 public:
  // Sizes and allocates the KV cache on `model` and starts the engine thread. The tokenizer supplies
  // detokenisation and the EOS set (together with the model config's eos ids).
  static StatusOr<std::unique_ptr<LlmLoop>> Create(const LlmLoopOptions& options,
                                                   std::unique_ptr<DecoderModel> model,
                                                   std::shared_ptr<const Tokenizer> tokenizer);
  // Stops the thread; requests still queued or running finish with kError (Unavailable).
  ~LlmLoop() override;

  // Thread-safe. InvalidArgument: empty prompt, ids outside the vocabulary, max_tokens < 1, prompt +
  // max_tokens beyond the context length or the whole KV cache (message gives the numbers), duplicate id.
  // ResourceExhausted: max_waiting requests already wait. Unavailable: shutting down.
  Status Submit(GenerationRequest request) override;
  // Thread-safe. The request's blocks are freed at the next step boundary; its last event has kCancelled.
  void Cancel(const std::string& id) override;
  int context_length() const override { return context_length_; }
  int max_sequence_tokens() const override {
    return static_cast<int>(std::min<int64_t>(context_length_, int64_t{allocator_->num_blocks()} *
                                                                   allocator_->block_size()));
  }

  // Thread-safe snapshot, refreshed after every step (for /metrics: ServerMetrics::SetSnapshotSource).
  LlmLoopStats stats() const;
  EngineSnapshot Snapshot() const { return stats().engine; }
  // Blocks until nothing is queued or running (tests, graceful drain). Returns false on timeout.
  bool WaitIdle(Nanos timeout_ns = int64_t{60} * 1000 * 1000 * 1000);

  int num_kv_blocks() const { return allocator_->num_blocks(); }
  int block_size() const { return allocator_->block_size(); }
  const LlmLoopOptions& options() const { return options_; }

 private:
  struct Active;       // per-request engine state (llm_loop.cc)
  class OutputThread;  // async output (llm_loop.cc)
  struct Deferred {    // a token whose text side waits for the output thread
    Active* a;         // resolved when handed over (no request is dropped while the thread runs)
    SeqId seq;
    int32_t tok;
    TokenLogprob lp;
  };
  struct LateStop {  // a sequence a stop string ended on the output thread, finished by the engine thread
    SeqId seq;
    GenerationEvent ev;
  };

  LlmLoop(const LlmLoopOptions& options, std::unique_ptr<DecoderModel> model,
          std::shared_ptr<const Tokenizer> tokenizer, int num_blocks);
  void Run();                                            // the engine thread
  void Accept(GenerationRequest request, Nanos submit);  // inbox -> scheduler
  void RunStep();
  // Draws the next token from a row of logits on the host, then AcceptToken.
  void ProcessSample(Active& a, const float* logits);
  // Appends a token drawn on the host or the device: stop checks, detokenisation, events, finishing (with
  // async output, the text side is deferred unless the token ends the sequence).
  void AcceptToken(Active& a, int32_t tok, TokenLogprob lp, Nanos p0);
  // The text side of a token (AcceptToken's or the output thread's): detokenise, run the stop strings,
  // release what is safe into `ev`. `finish` is what the token ended already (a stop token, the length) or
  // kNone; returns it, or kStop when a stop string completes.
  FinishReason EmitToken(Active& a, int32_t tok, TokenLogprob lp, FinishReason finish, bool stop_token,
                         GenerationEvent& ev);
  // Async output: hands the tokens deferred by the last step to the output thread (before the model runs),
  // waits for it (after), and finishes the sequences a stop string ended. Without a step to overlap, Flush
  // runs them here.
  void StartOutput();
  void FinishOutput();
  void FlushOutput();
  // True when this sequence's next token may be drawn on the device (see LlmLoopOptions::device_sampling).
  bool SampleOnDevice(const Active& a) const;
  // Ends a request: `ev` (its last tokens/text, if any) gets the finish reason, usage and timings and is
  // delivered; the sequence's blocks are freed and its state dropped.
  void FinishRequest(SeqId seq, FinishReason reason, Status error = OkStatus(), GenerationEvent ev = {});
  // Charges a's engine time from where its ledger stands to `end` (see RequestTimings): the current step's
  // planning, model run, others' sampling and bookkeeping, and the gap since its previous step.
  void ChargeStep(Active& a, Nanos end);
  void PublishStats(const StepRecord* step);
  void FailAll(const Status& error);
  Nanos Now() const { return clock_->Now(); }

  const LlmLoopOptions options_;
  Clock* clock_;
  std::unique_ptr<DecoderModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int vocab_ = 0;
  bool device_sampling_ = false;  // options_.device_sampling and the model samples on the device
  int context_length_ = 0;
  std::vector<int32_t> eos_ids_;  // model config ∪ tokenizer

  // Engine-thread state.
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  StepCostFit step_fit_;  // with options_.target_step_ms: measured step times, for the prefill cap
  std::unordered_map<SeqId, std::unique_ptr<Active>> active_;
  std::unordered_map<std::string, SeqId> seq_of_;
  SeqId next_seq_ = 1;
  std::vector<float> scratch_logits_;  // [vocab], a masked copy of one row (min_tokens)
  bool stuck_warned_ = false;
  // Async output (options_.async_output): tokens deferred by the last step, the batch the output thread is
  // working on, what it found, and its busy time (StepRecord::output_ns).
  std::unique_ptr<OutputThread> output_;
  std::vector<Deferred> deferred_;
  std::vector<Deferred> handed_;
  std::vector<LateStop> late_stops_;
  Nanos output_ns_ = 0;
  int64_t generated_total_ = 0;  // sampled tokens, published by PublishStats
  // The step in progress, for the requests' ledgers: planning from t0, the model from t1 to t2, sampling
  // until t3 (0 while it runs), then bookkeeping. in_step_: between t0 and the end of the step.
  struct StepTimes {
    uint64_t id = 0;
    Nanos t0 = 0, t1 = 0, t2 = 0, t3 = 0;
    bool in_step = false;
  } step_;

  // Shared with net threads; guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable wake_;  // engine: inbox or stop
  std::condition_variable idle_;  // WaitIdle
  struct Inbound {
    GenerationRequest request;
    Nanos submit = 0;
  };
  std::vector<Inbound> inbox_;
  std::vector<std::string> cancels_;
  std::unordered_set<std::string> live_ids_;  // submitted and not yet finished
  int num_waiting_ = 0;                       // scheduler's waiting count, after the last step
  bool busy_ = false;                         // the engine holds work (for WaitIdle)
  bool stop_ = false;
  LlmLoopStats stats_;

  std::thread thread_;
};

}  // namespace stoke
