#include "serve/scheduler/scheduler.h"

#include <algorithm>
#include <cassert>
#include <limits>

namespace stoke {

const char* AdmissionStopName(AdmissionStop s) {
  switch (s) {
    case AdmissionStop::kQueueEmpty:
      return "queue_empty";
    case AdmissionStop::kTokenBudget:
      return "token_budget";
    case AdmissionStop::kMaxSeqs:
      return "max_seqs";
    case AdmissionStop::kNoBlocks:
      return "no_blocks";
  }
  return "";
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockAllocator* allocator)
    : options_(options), allocator_(allocator) {
  options_.max_num_batched_tokens = std::max(1, options_.max_num_batched_tokens);
  options_.max_num_seqs = std::max(1, options_.max_num_seqs);
  watermark_ = options_.watermark_blocks >= 0 ? options_.watermark_blocks
                                              : std::max(1, allocator_->num_blocks() / 100);
}

Status Scheduler::Add(SeqId id, std::vector<int32_t> prompt, int priority) {
  if (prompt.empty()) return InvalidArgumentError("sequence {}: empty prompt", id);
  if (seqs_.count(id)) return AlreadyExistsError("sequence {} is already scheduled", id);
  // +1: the first generated token needs a slot too.
  const int blocks = BlockAllocator::BlocksForTokens(prompt.size() + 1, allocator_->block_size());
  if (blocks > allocator_->num_blocks()) {
    return InvalidArgumentError("prompt of {} tokens needs {} KV blocks; the cache has {}", prompt.size(),
                                blocks, allocator_->num_blocks());
  }
  if (!options_.enable_chunked_prefill && static_cast<int>(prompt.size()) > options_.max_num_batched_tokens) {
    return InvalidArgumentError(
        "prompt of {} tokens exceeds max_num_batched_tokens {} (chunked prefill is off)", prompt.size(),
        options_.max_num_batched_tokens);
  }
  SchedSeq& s = seqs_[id];
  s.id = id;
  s.rank = {priority, next_arrival_++};
  s.prompt_len = static_cast<int>(prompt.size());
  s.tokens = std::move(prompt);
  waiting_.insert(&s);
  return OkStatus();
}

void Scheduler::Cancel(SeqId id) {
  if (seqs_.count(id)) cancel_pending_.insert(id);
}

const SchedSeq* Scheduler::Find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

std::span<const int32_t> Scheduler::Tokens(SeqId id) const {
  const SchedSeq* s = Find(id);
  return s ? std::span<const int32_t>(s->tokens) : std::span<const int32_t>();
}

StepPlan Scheduler::Schedule() {
  ++step_;
  StepPlan plan;
  ApplyCancellations(&plan);
  std::sort(running_.begin(), running_.end(),
            [](const SchedSeq* a, const SchedSeq* b) { return RanksBefore(a->rank, b->rank); });
  int budget = options_.max_num_batched_tokens;
  ScheduleRunning(/*decodes=*/true, &budget, &plan);
  room_.reset();
  if (prefill_room_fn_) {
    int64_t kv = 0;  // positions the decodes' attention reads
    for (const ScheduledSeq& s : plan.seqs) kv += s.start_pos + s.num_tokens;
    room_ = prefill_room_fn_(plan.num_decode_tokens, kv);
    if (room_) plan.prefill_cap = std::min(budget, RoomTokens(0, plan));
  }
  ScheduleRunning(/*decodes=*/false, &budget, &plan);
  plan.admission_stop = AdmitWaiting(&budget, &plan);
  room_.reset();

  plan.num_running = num_running();
  plan.num_waiting = num_waiting();
  plan.blocks_used = allocator_->NumUsedBlocks();
  plan.blocks_free = allocator_->NumAvailableBlocks();
  plan.blocks_cached = allocator_->NumCachedBlocks();
  if (!plan.empty()) ++counters_.steps;
  return plan;
}

void Scheduler::ApplyCancellations(StepPlan* plan) {
  std::unordered_set<SeqId> pending;
  pending.swap(cancel_pending_);  // Finish edits cancel_pending_
  for (SeqId id : pending) {
    if (!seqs_.count(id)) continue;
    Finish(id);
    plan->cancelled.push_back(id);
    ++counters_.cancelled;
  }
  std::sort(plan->cancelled.begin(), plan->cancelled.end());  // deterministic order for callers and tests
}

int Scheduler::RoomTokens(int start, const StepPlan& plan) const {
  constexpr int kNoLimit = std::numeric_limits<int>::max();
  if (!room_) return kNoLimit;
  const double per = std::max(1e-12, room_->per_token + room_->per_kv_position);
  const double n = (room_->seconds - room_->per_kv_position * start) / per;
  const int first = plan.num_prefill_tokens == 0 ? room_->min_tokens : 0;  // the step's first chunk
  if (!(n > first)) return std::max(0, first);                             // also NaN
  return n >= kNoLimit ? kNoLimit : static_cast<int>(n);
}

void Scheduler::SpendRoom(int start, int n) {
  if (room_) room_->seconds -= room_->per_token * n + room_->per_kv_position * (start + n);
}

void Scheduler::ScheduleRunning(bool decodes, int* budget, StepPlan* plan) {
  for (size_t i = 0; i < running_.size();) {
    SchedSeq& s = *running_[i];
    const int remaining = static_cast<int>(s.tokens.size()) - s.num_computed;
    const bool is_decode = remaining == 1 && s.num_computed >= s.prompt_len;
    if (s.scheduled_step == step_ || is_decode != decodes || remaining <= 0) {
      ++i;
      continue;
    }
    if (*budget == 0) return;  // the rest wait for the next step
    int want = std::min(remaining, *budget);
    if (!decodes) want = std::min(want, RoomTokens(s.num_computed, *plan));  // the step-time room
    if (want == 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (true) {
      const int fit = FitTokens(s, want);
      if (fit == want) break;
      if (PreemptVictimAfter(i, plan)) continue;
      if (decodes) {  // nobody ranks lower: this sequence yields its own blocks
        Preempt(i, plan);
        self_preempted = true;
      } else {
        want = fit;  // a prefill may take a smaller chunk (possibly none) instead
      }
      break;
    }
    if (self_preempted) continue;  // running_[i] is now the next sequence
    if (want == 0) {
      ++i;
      continue;
    }
    Status st = allocator_->Grow(s.id, s.num_computed + want, &plan->copies);
    assert(st.ok());
    (void)st;
    if (!decodes) SpendRoom(s.num_computed, want);
    Push(s, want, /*is_prefill=*/!decodes, plan);
    *budget -= want;
    ++i;
  }
}

AdmissionStop Scheduler::AdmitWaiting(int* budget, StepPlan* plan) {
  // A sequence preempted this step would be re-admitted at once and thrash; memory is short anyway.
  if (!plan->preempted.empty()) return AdmissionStop::kNoBlocks;
  while (true) {
    if (waiting_.empty()) return AdmissionStop::kQueueEmpty;
    if (num_running() >= options_.max_num_seqs) return AdmissionStop::kMaxSeqs;
    if (*budget == 0) return AdmissionStop::kTokenBudget;
    SchedSeq& s = **waiting_.begin();
    const int cached = allocator_->MatchPrefix(s.tokens);
    const int remaining = static_cast<int>(s.tokens.size()) - cached;
    // A preempted sequence may have grown past the budget; it must be able to come back even unchunked.
    const bool may_chunk = options_.enable_chunked_prefill || s.num_preemptions > 0;
    int chunk = std::min({remaining, *budget, RoomTokens(cached, *plan)});
    if (chunk == 0 || (!may_chunk && chunk < remaining)) return AdmissionStop::kTokenBudget;
    // Keep a reserve for the running sequences' next tokens; with nothing running, any fit will do.
    const int avail = allocator_->NumAvailableBlocks() - (running_.empty() ? 0 : watermark_);
    auto fits = [&](int t) { return allocator_->BlocksToStart(s.tokens, cached + t) <= avail; };
    if (!fits(chunk)) {
      if (!may_chunk) return AdmissionStop::kNoBlocks;
      int lo = 0, hi = chunk - 1;  // largest t in [1, chunk) that fits; 0 if none
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (fits(mid)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      chunk = lo > 0 && fits(lo) ? lo : 0;
      if (chunk == 0) return AdmissionStop::kNoBlocks;
    }
    auto opened = allocator_->Open(s.id, s.tokens);
    assert(opened.ok() && *opened == cached);
    (void)opened;
    Status st = allocator_->Grow(s.id, cached + chunk, &plan->copies);
    assert(st.ok());
    (void)st;
    waiting_.erase(waiting_.begin());
    running_.push_back(&s);
    s.running = true;
    s.num_computed = cached;
    if (!s.ever_scheduled) {
      s.num_cached_tokens = cached;
      plan->num_cached_tokens += cached;
      counters_.prefix_query_tokens += s.prompt_len;
      counters_.prefix_hit_tokens += cached;
    }
    ++plan->num_admitted;
    SpendRoom(cached, chunk);
    Push(s, chunk, /*is_prefill=*/true, plan);
    *budget -= chunk;
  }
}

bool Scheduler::PreemptVictimAfter(size_t i, StepPlan* plan) {
  for (size_t j = running_.size(); j-- > i + 1;) {
    if (running_[j]->scheduled_step != step_) {
      Preempt(j, plan);
      return true;
    }
  }
  return false;
}

void Scheduler::Preempt(size_t running_index, StepPlan* plan) {
  SchedSeq& s = *running_[running_index];
  allocator_->Free(s.id);
  running_.erase(running_.begin() + running_index);
  s.running = false;
  s.num_computed = 0;
  ++s.num_preemptions;
  waiting_.insert(&s);  // keeps its arrival: ahead of later arrivals of its priority
  plan->preempted.push_back(s.id);
  ++counters_.preemptions;
}

int Scheduler::FitTokens(const SchedSeq& s, int want) const {
  auto fits = [&](int t) {
    return allocator_->CanAllocate(allocator_->BlocksToGrow(s.id, s.num_computed + t));
  };
  if (fits(want)) return want;
  int lo = 0, hi = want - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo > 0 && fits(lo) ? lo : 0;
}

void Scheduler::Push(SchedSeq& s, int num_tokens, bool is_prefill, StepPlan* plan) {
  ScheduledSeq ss;
  ss.id = s.id;
  ss.start_pos = s.num_computed;
  ss.num_tokens = num_tokens;
  ss.is_prefill = is_prefill;
  ss.sample = s.num_computed + num_tokens == static_cast<int>(s.tokens.size());
  ss.first_schedule = !s.ever_scheduled;
  plan->seqs.push_back(ss);
  s.ever_scheduled = true;
  s.scheduled_step = step_;
  if (is_prefill) {
    plan->num_prefill_tokens += num_tokens;
    counters_.prefill_tokens += num_tokens;
    counters_.recompute_tokens +=
        std::max(0, std::min(s.num_computed + num_tokens, s.high_water) - s.num_computed);
  } else {
    plan->num_decode_tokens += num_tokens;
    counters_.decode_tokens += num_tokens;
  }
}

void Scheduler::CompleteStep(const StepPlan& plan) {
  for (const ScheduledSeq& ss : plan.seqs) {
    auto it = seqs_.find(ss.id);
    if (it == seqs_.end() || !it->second.running) continue;  // finished or preempted since
    SchedSeq& s = it->second;
    assert(s.num_computed == ss.start_pos);
    s.num_computed = ss.start_pos + ss.num_tokens;
    s.high_water = std::max(s.high_water, s.num_computed);
    allocator_->Commit(s.id, std::span<const int32_t>(s.tokens.data(), s.num_computed));
  }
}

Status Scheduler::AppendToken(SeqId id, int32_t token) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence {} is not scheduled", id);
  SchedSeq& s = it->second;
  if (s.num_computed != static_cast<int>(s.tokens.size())) {
    return FailedPreconditionError("sequence {}: token appended with {} of {} tokens computed", id,
                                   s.num_computed, s.tokens.size());
  }
  s.tokens.push_back(token);
  return OkStatus();
}

void Scheduler::Finish(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  SchedSeq* s = &it->second;
  if (s->running) {
    running_.erase(std::find(running_.begin(), running_.end(), s));
  } else {
    waiting_.erase(s);
  }
  allocator_->Free(id);
  cancel_pending_.erase(id);
  seqs_.erase(it);
}

}  // namespace stoke
