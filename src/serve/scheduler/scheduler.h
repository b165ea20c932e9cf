// Continuous batching (iteration-level scheduling): before every model step, decide which sequences run and
// how many of their tokens, under a token budget and a sequence cap, with KV blocks from a BlockAllocator.
// Plain code without an engine, so tests simulate steps (see scheduler_test.cc for token timelines).
//
// A sequence is a token list (prompt, then generated tokens) and `num_computed`, how many of them have KV.
// Each step it computes some of the rest: one token when only the last sampled one is missing (decode), or a
// chunk of its prompt (prefill, chunked under the budget). After the step the caller samples for sequences
// whose chunk reached the end, appends the token, and finishes the ones that are done:
//
//   StepPlan plan = sched.Schedule();           // decodes first, then prefill chunks; may preempt
//   model.Step(...plan...);                     // using sched.Tokens(id) and sched.BlockTable(id)
//   sched.CompleteStep(plan);                   // KV written: num_computed advances, full blocks cached
//   for (s : plan.seqs) if (s.sample) { sched.AppendToken(s.id, Sample(...)); if (done) sched.Finish(s.id); }
//
// Preemption is by recompute: the victim's blocks are freed and it waits again with its generated tokens
// kept, so re-admission prefills prompt + generated (often partly from the prefix cache). Not thread-safe:
// the engine thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "engine/kv/block_allocator.h"
#include "serve/scheduler/policy.h"

namespace stoke {

struct SchedulerOptions {
  // Tokens computed per step, all sequences together. Larger: better prefill throughput, longer steps (so
  // decoding sequences see larger inter-token gaps while a prefill runs). vLLM's V1 default is 8192.
  int max_num_batched_tokens = 2048;
  // Sequences in the running set. Larger: more decode parallelism, more KV in use.
  int max_num_seqs = 64;
  // On: a prompt longer than the remaining budget is computed over several steps. Off: a prompt is admitted
  // only when it fits the step whole (a prompt longer than the whole budget is rejected by Add).
  bool enable_chunked_prefill = true;
  // Blocks kept free when admitting while others run, so running sequences can decode for a while before
  // anyone is preempted. -1: 1% of the cache (vLLM's watermark), at least 1.
  int watermark_blocks = -1;
};

// Why admission of waiting sequences stopped in a step.
enum class AdmissionStop : uint8_t { kQueueEmpty, kTokenBudget, kMaxSeqs, kNoBlocks };
const char* AdmissionStopName(AdmissionStop s);  // "queue_empty", "token_budget", "max_seqs", "no_blocks"

struct ScheduledSeq {
  SeqId id = 0;
  int32_t start_pos = 0;        // tokens [0, start_pos) already have KV
  int32_t num_tokens = 0;       // compute tokens [start_pos, start_pos + num_tokens)
  bool is_prefill = true;       // false: a decode (the one missing sampled token)
  bool sample = false;          // the chunk reaches the last known token: its logits give the next token
  bool first_schedule = false;  // the first time this sequence runs (end of its queue time)
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;  // decodes first (rank order), then prefill chunks
  std::vector<BlockCopy> copies;   // copy-on-write: apply to KV before the step
  std::vector<SeqId> preempted;    // back to waiting this step (their KV is gone; they will recompute)
  std::vector<SeqId> cancelled;    // removed at this step boundary (blocks freed)
  AdmissionStop admission_stop = AdmissionStop::kQueueEmpty;
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;
  int num_admitted = 0;       // waiting sequences that entered the running set
  // The step-time room's prefill tokens at position 0 this step (set_prefill_room; chunks further into a
  // prompt get fewer); -1: no room set.
  int prefill_cap = -1;
  int num_cached_tokens = 0;  // tokens admitted sequences got from the prefix cache (not computed)
  // State after planning:
  int num_running = 0;
  int num_waiting = 0;
  int blocks_used = 0;
  int blocks_free = 0;    // free + cached (evictable)
  int blocks_cached = 0;  // of which cached

  int num_tokens() const { return num_prefill_tokens + num_decode_tokens; }
  bool empty() const { return seqs.empty(); }
};

// Cumulative counts since construction.
struct SchedulerCounters {
  int64_t steps = 0;  // Schedule calls that produced work
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t preemptions = 0;
  int64_t recompute_tokens = 0;  // prefill tokens spent re-computing preempted sequences
  int64_t cancelled = 0;
  // Prefix cache in tokens, first admissions only (recompute hits are not counted as hits; vLLM #25780):
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up
  int64_t prefix_hit_tokens = 0;    // served from cache
};

struct SchedSeq {
  SeqId id = 0;
  SeqRank rank;
  std::vector<int32_t> tokens;  // prompt + generated
  int prompt_len = 0;
  int num_computed = 0;  // tokens whose KV is written (0 while waiting)
  int high_water = 0;    // most tokens ever computed (what a recompute repeats)
  bool running = false;
  bool ever_scheduled = false;
  int num_cached_tokens = 0;  // prompt tokens from the prefix cache at first admission
  int num_preemptions = 0;
  int64_t scheduled_step = -1;  // last step this sequence was planned in
};

class Scheduler {
 public:
  // `allocator` is not owned and must outlive the scheduler; the scheduler alone opens/frees its sequences.
  Scheduler(const SchedulerOptions& options, BlockAllocator* allocator);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a sequence. InvalidArgument if the prompt is empty, can never fit the KV cache, or (chunked
  // prefill off) exceeds max_num_batched_tokens; AlreadyExists for a live id.
  Status Add(SeqId id, std::vector<int32_t> prompt, int priority = 0);
  // Marks a sequence for removal at the next Schedule (its blocks are freed there). Unknown ids: no-op.
  void Cancel(SeqId id);

  StepPlan Schedule();
  // A time budget for each step's prefill chunks (partial prefills and admissions), asked once the step's
  // decodes are planned: room(decode tokens, KV positions those decodes read). A chunk of n tokens starting
  // at position s costs per_token · n + per_kv_position · (s + n) of it; the step's first chunk may take
  // min_tokens whatever the room, so waiting prompts always progress. nullopt (or no function): only
  // max_num_batched_tokens limits the step. The step-time target (LlmLoopOptions::target_step_ms) sets it.
  struct PrefillRoom {
    double seconds = 0;
    double per_token = 0;
    double per_kv_position = 0;
    int min_tokens = 0;
  };
  void set_prefill_room(std::function<std::optional<PrefillRoom>(int, int64_t)> room) {
    prefill_room_fn_ = std::move(room);
  }
  // The model ran `plan`: every scheduled chunk's KV is written.
  void CompleteStep(const StepPlan& plan);
  // Appends a sampled token to a sequence whose tokens are all computed.
  Status AppendToken(SeqId id, int32_t token);
  // The sequence is done (stop, length, error): frees its blocks and forgets it. Unknown ids: no-op.
  void Finish(SeqId id);

  bool Contains(SeqId id) const { return seqs_.count(id) != 0; }
  const SchedSeq* Find(SeqId id) const;
  std::span<const int32_t> Tokens(SeqId id) const;
  const std::vector<BlockId>& BlockTable(SeqId id) const { return allocator_->BlockTable(id); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool HasWork() const { return !waiting_.empty() || !running_.empty() || !cancel_pending_.empty(); }
  const SchedulerCounters& counters() const { return counters_; }
  const BlockAllocator& allocator() const { return *allocator_; }
  const SchedulerOptions& options() const { return options_; }
  int watermark_blocks() const { return watermark_; }

 private:
  struct WaitingOrder {
    bool operator()(const SchedSeq* a, const SchedSeq* b) const { return RanksBefore(a->rank, b->rank); }
  };

  void ApplyCancellations(StepPlan* plan);
  void ScheduleRunning(bool decodes, int* budget, StepPlan* plan);
  AdmissionStop AdmitWaiting(int* budget, StepPlan* plan);
  // Preempts the last-ranked running sequence not yet scheduled this step, ranked at or after running_[i].
  // Returns false when there is none (running_[i] itself is never chosen here).
  bool PreemptVictimAfter(size_t i, StepPlan* plan);
  void Preempt(size_t running_index, StepPlan* plan);
  // Largest t <= want such that Grow(seq, computed + t) fits in the available blocks (0 if none).
  int FitTokens(const SchedSeq& s, int want) const;
  void Push(SchedSeq& s, int num_tokens, bool is_prefill, StepPlan* plan);

  SchedulerOptions options_;
  BlockAllocator* allocator_;
  std::function<std::optional<PrefillRoom>(int, int64_t)> prefill_room_fn_;
  std::optional<PrefillRoom> room_;  // this step's, while Schedule runs
  // Prefill tokens a chunk starting at `start` may take from room_ (no room: no limit).
  int RoomTokens(int start, const StepPlan& plan) const;
  void SpendRoom(int start, int n);
  int watermark_ = 0;
  uint64_t next_arrival_ = 0;
  int64_t step_ = 0;
  std::unordered_map<SeqId, SchedSeq> seqs_;   // node-based: pointers stay valid
  std::set<SchedSeq*, WaitingOrder> waiting_;  // rank order
  std::vector<SchedSeq*> running_;             // sorted by rank at the start of each Schedule
  std::unordered_set<SeqId> cancel_pending_;
  SchedulerCounters counters_;
};

}  // namespace stoke
