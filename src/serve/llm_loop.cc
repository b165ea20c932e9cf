#include "serve/llm_loop.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "base/logging.h"
#include "engine/runner/sampler.h"
#include "serve/stop_filter.h"
#include "telemetry/trace.h"

namespace stoke {

// Per-request state, engine thread only.
struct LlmLoop::Active {
  Active(GenerationRequest r, SeqId s, const Tokenizer& tok)
      : req(std::move(r)),
        seq(s),
        sampler(req.sampling, Sampler::SeedFor(req.sampling)),
        decoder(tok, /*skip_special=*/true),
        stop(req.sampling.stop) {}

  GenerationRequest req;
  SeqId seq;
  Sampler sampler;
  StreamDecoder decoder;
  StopFilter stop;
  std::vector<int32_t> stop_ids;  // EOS (unless ignore_eos) + stop_token_ids: end generation, never emitted
  int generated = 0;
  // Sampled tokens whose text is not released yet (held by the stop filter or an incomplete UTF-8 tail).
  struct Pending {
    int32_t id;
    TokenLogprob logprob;
    size_t text_end;  // decoded text length (cumulative) once this token's piece is in
  };
  std::deque<Pending> pending;
  size_t text_total = 0;    // decoded bytes so far, held ones included
  size_t text_emitted = 0;  // bytes released in events
  RequestTimings t;
  Nanos last_token = 0;  // when the previous token was sampled
  // Ledger bookkeeping: engine time charged up to `accounted`; the last step it was scheduled in, whether
  // that step computed prompt tokens, and its own postprocess time within it.
  Nanos accounted = 0;
  uint64_t step = 0;
  bool step_prefill = false;
  Nanos step_post = 0;
  int cached_prompt_tokens = 0;
};

// Runs one job at a time on its own thread: Start hands it over, Wait blocks until it has run.
class LlmLoop::OutputThread {
 public:
  OutputThread() : thread_([this] { Loop(); }) {}
  ~OutputThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = std::move(job);
      pending_ = true;
    }
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return !pending_; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || pending_; });
      if (!pending_) return;  // stopping, nothing handed over
      std::function<void()> job = std::move(job_);
      lk.unlock();
      job();
      lk.lock();
      pending_ = false;
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::function<void()> job_;
  bool pending_ = false, stop_ = false;
  std::thread thread_;
};

namespace {

// The counted and modelled work of one step (StepRecord's kv_positions ... attention_flops).
void CountStepWork(const StepInput& input, const DecoderStepCosts& costs, StepRecord* rec) {
  int64_t tokens = 0;
  for (const StepSequence& q : input.sequences) {
    const int64_t n = q.num_tokens, s = q.start_pos;
    tokens += n;
    rec->kv_positions += s + n;
    rec->attention_pairs += n * s + n * (n + 1) / 2;  // token i of the chunk attends to s + i + 1 keys
    rec->logit_rows +=
        q.logits == StepSequence::Logits::kAll ? n : (q.logits == StepSequence::Logits::kNone ? 0 : 1);
  }
  if (!costs.known()) return;
  rec->weight_bytes = costs.ReadWeightBytes(rec->logit_rows);
  rec->kv_bytes = static_cast<double>(rec->kv_positions) * static_cast<double>(costs.kv_bytes_per_token);
  rec->matmul_flops = costs.MatmulFlops(tokens, rec->logit_rows);
  rec->attention_flops = static_cast<double>(rec->attention_pairs) * costs.attention_flops_per_pair;
}

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

StatusOr<std::unique_ptr<LlmLoop>> LlmLoop::Create(const LlmLoopOptions& options,
                                                   std::unique_ptr<DecoderModel> model,
                                                   std::shared_ptr<const Tokenizer> tokenizer) {
  if (!model) return InvalidArgumentError("LlmLoop needs a model");
  if (!tokenizer) return InvalidArgumentError("LlmLoop needs a tokenizer");
  if (options.block_size < 1)
    return InvalidArgumentError("block_size must be >= 1, got {}", options.block_size);
  if (model->config().vocab_size < 1)
    return InvalidArgumentError("model reports vocab_size {}", model->config().vocab_size);
  const int bs = options.block_size;
  int64_t num_blocks = options.num_kv_blocks;
  if (num_blocks <= 0) {
    const int64_t per_token = model->KvBytesPerToken();
    num_blocks = BlockAllocator::NumBlocksForBudget(options.kv_budget_bytes, per_token, bs);
    // More than every sequence at full context could use is wasted memory.
    const int context = model->config().max_position;
    if (context > 0) {
      const int64_t cap =
          int64_t{std::max(1, options.scheduler.max_num_seqs)} * BlockAllocator::BlocksForTokens(context, bs);
      num_blocks = std::min(num_blocks, cap);
    }
    if (num_blocks < 1) {
      return InvalidArgumentError("KV budget of {} bytes holds no block of {} tokens ({} bytes per token)",
                                  options.kv_budget_bytes, bs, per_token);
    }
  }
  RETURN_IF_ERROR(model->AllocateKvCache(static_cast<int>(num_blocks), bs));
  std::unique_ptr<LlmLoop> loop(new LlmLoop(options, std::move(model), std::move(tokenizer), num_blocks));
  LOG_INFO(
      "llm loop: {} KV blocks x {} tokens ({:.1f} MiB), context {}, max {} seqs, {} tokens/step, prefix "
      "cache {}",
      num_blocks, bs, num_blocks * bs * static_cast<double>(loop->model_->KvBytesPerToken()) / (1 << 20),
      loop->context_length_, loop->scheduler_->options().max_num_seqs,
      loop->scheduler_->options().max_num_batched_tokens, options.enable_prefix_caching ? "on" : "off");
  loop->thread_ = std::thread(&LlmLoop::Run, loop.get());
  return loop;
}

LlmLoop::LlmLoop(const LlmLoopOptions& options, std::unique_ptr<DecoderModel> model,
                 std::shared_ptr<const Tokenizer> tokenizer, int num_blocks)
    : options_(options),
      clock_(options.clock ? options.clock : Clock::Real()),
      model_(std::move(model)),
      tokenizer_(std::move(tokenizer)) {
  const LlamaConfig& cfg = model_->config();
  vocab_ = cfg.vocab_size;
  allocator_ = std::make_unique<BlockAllocator>(
      BlockAllocatorOptions{.num_blocks = num_blocks,
                            .block_size = options.block_size,
                            .enable_prefix_caching = options.enable_prefix_caching});
  scheduler_ = std::make_unique<Scheduler>(options.scheduler, allocator_.get());
  if (options.target_step_ms > 0) {
    scheduler_->set_prefill_room([this](int decode_tokens, int64_t decode_kv_positions) {
      return step_fit_.Room(options_.target_step_ms * 1e-3, decode_tokens, decode_kv_positions,
                            options_.target_step_min_prefill);
    });
  }
  context_length_ = cfg.max_position > 0 ? cfg.max_position : num_blocks * options.block_size;
  eos_ids_ = cfg.eos_token_ids;
  for (int32_t id : tokenizer_->eos_ids()) {
    if (!Contains(eos_ids_, id)) eos_ids_.push_back(id);
  }
  scratch_logits_.resize(vocab_);
  device_sampling_ = options.device_sampling && model_->SamplesOnDevice();
  if (options.async_output) output_ = std::make_unique<OutputThread>();
  PublishStats(nullptr);
}

LlmLoop::~LlmLoop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status LlmLoop::Submit(GenerationRequest request) {
  auto reject = [&](Status s) {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.requests_rejected;
    return s;
  };
  const SamplingParams& sp = request.sampling;
  const int n = static_cast<int>(request.prompt_ids.size());
  if (!request.on_event) return reject(InvalidArgumentError("request {}: no event callback", request.id));
  if (n == 0) return reject(InvalidArgumentError("request {}: the prompt is empty", request.id));
  if (sp.max_tokens < 1) {
    return reject(
        InvalidArgumentError("request {}: max_tokens must be at least 1, got {}", request.id, sp.max_tokens));
  }
  for (int i = 0; i < n; ++i) {
    const int32_t t = request.prompt_ids[i];
    if (t < 0 || t >= vocab_) {
      return reject(InvalidArgumentError(
          "request {}: prompt token {} at position {} is outside the vocabulary (size {})", request.id, t, i,
          vocab_));
    }
  }
  const int64_t total = int64_t{n} + sp.max_tokens;
  if (total > context_length_) {
    return reject(InvalidArgumentError(
        "request {}: prompt ({} tokens) + max_tokens ({}) = {} exceeds the model's context length {}",
        request.id, n, sp.max_tokens, total, context_length_));
  }
  const int64_t capacity = int64_t{allocator_->num_blocks()} * allocator_->block_size();
  if (total > capacity) {
    return reject(InvalidArgumentError(
        "request {}: prompt ({} tokens) + max_tokens ({}) = {} exceeds the KV cache ({} tokens)", request.id,
        n, sp.max_tokens, total, capacity));
  }
  const SchedulerOptions& so = scheduler_->options();
  if (!so.enable_chunked_prefill && n > so.max_num_batched_tokens) {
    return reject(InvalidArgumentError(
        "request {}: prompt ({} tokens) exceeds max_num_batched_tokens {} (chunked prefill is off)",
        request.id, n, so.max_num_batched_tokens));
  }
  const Nanos submit = Now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) {
      ++stats_.requests_rejected;
      return UnavailableError("the engine is shutting down");
    }
    if (live_ids_.count(request.id)) {
      ++stats_.requests_rejected;
      return InvalidArgumentError("request id {} is already in flight", request.id);
    }
    const int waiting = num_waiting_ + static_cast<int>(inbox_.size());
    if (waiting >= options_.max_waiting) {
      ++stats_.requests_rejected;
      return ResourceExhaustedError("{} requests are waiting (max_waiting {})", waiting,
                                    options_.max_waiting);
    }
    live_ids_.insert(request.id);
    ++stats_.requests_submitted;
    inbox_.push_back({std::move(request), submit});
    busy_ = true;
  }
  wake_.notify_one();
  return OkStatus();
}

void LlmLoop::Cancel(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!live_ids_.count(id)) return;
    cancels_.push_back(id);
  }
  wake_.notify_one();
}

LlmLoopStats LlmLoop::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  LlmLoopStats s = stats_;
  s.engine.num_waiting += static_cast<int>(inbox_.size());
  return s;
}

bool LlmLoop::WaitIdle(Nanos timeout_ns) {
  std::unique_lock<std::mutex> lk(mu_);
  return idle_.wait_for(lk, std::chrono::nanoseconds(timeout_ns),
                        [&] { return !busy_ && inbox_.empty() && cancels_.empty(); });
}

void LlmLoop::Run() {
  while (true) {
    std::vector<Inbound> in;
    std::vector<std::string> cancels;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!scheduler_->HasWork() && inbox_.empty() && cancels_.empty()) {
        busy_ = false;
        idle_.notify_all();
        wake_.wait(lk, [&] { return stop_ || !inbox_.empty() || !cancels_.empty(); });
      }
      if (stop_) break;
      busy_ = true;
      in.swap(inbox_);
      cancels.swap(cancels_);
    }
    for (Inbound& r : in) Accept(std::move(r.request), r.submit);
    for (const std::string& id : cancels) {
      auto it = seq_of_.find(id);
      if (it != seq_of_.end()) scheduler_->Cancel(it->second);
    }
    RunStep();
  }
  FailAll(UnavailableError("the engine is shutting down"));
  std::lock_guard<std::mutex> lk(mu_);
  busy_ = false;
  idle_.notify_all();
}

void LlmLoop::Accept(GenerationRequest request, Nanos submit) {
  const SeqId seq = next_seq_++;
  Status st = scheduler_->Add(seq, request.prompt_ids, request.priority);
  if (!st.ok()) {  // Submit validated already; this is a safety net
    GenerationEvent ev;
    ev.finish = FinishReason::kError;
    ev.error = st;
    ev.prompt_tokens = static_cast<int>(request.prompt_ids.size());
    {
      std::lock_guard<std::mutex> lk(mu_);
      live_ids_.erase(request.id);
      ++stats_.requests_finished;
      ++stats_.requests_failed;
    }
    request.on_event(std::move(ev));
    return;
  }
  auto a = std::make_unique<Active>(std::move(request), seq, *tokenizer_);
  const SamplingParams& sp = a->req.sampling;
  if (!sp.ignore_eos) a->stop_ids = eos_ids_;
  for (int32_t id : sp.stop_token_ids) {
    if (id >= 0 && id < vocab_ && !Contains(a->stop_ids, id)) a->stop_ids.push_back(id);
  }
  a->t.recv = a->req.recv_time;
  a->t.submit = submit;
  seq_of_[a->req.id] = seq;
  active_[seq] = std::move(a);
}

void LlmLoop::RunStep() {
  const Nanos t0 = Now();
  step_ = StepTimes{.id = step_.id + 1, .t0 = t0, .in_step = true};
  StepPlan plan = scheduler_->Schedule();
  for (SeqId id : plan.cancelled) FinishRequest(id, FinishReason::kCancelled);
  for (SeqId id : plan.preempted) ++active_.at(id)->t.num_preemptions;
  if (plan.empty()) {
    FlushOutput();  // no step to overlap the deferred tokens' text with
    step_.in_step = false;
    PublishStats(nullptr);
    if (scheduler_->HasWork()) {
      // Work that cannot be scheduled would spin; Submit's size checks should make this unreachable.
      if (!stuck_warned_) LOG_WARN("llm loop: {} waiting but nothing schedulable", scheduler_->num_waiting());
      stuck_warned_ = true;
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait_for(lk, std::chrono::milliseconds(1));
    }
    return;
  }

  Status st;
  for (const BlockCopy& c : plan.copies) {
    st = model_->CopyKvBlock(c.src, c.dst);
    if (!st.ok()) break;
  }
  StepInput input;
  input.time_device = TraceRecorder::Global().on();  // the timeline's GPU track (CUDA events) while tracing
  input.token_ids.reserve(plan.num_tokens());
  input.sequences.reserve(plan.seqs.size());
  int64_t rows = 0, device_rows = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    std::span<const int32_t> toks = scheduler_->Tokens(s.id);
    const std::vector<BlockId>& table = scheduler_->BlockTable(s.id);
    StepSequence ss;
    ss.token_begin = static_cast<int32_t>(input.token_ids.size());
    ss.num_tokens = s.num_tokens;
    ss.start_pos = s.start_pos;
    const int blocks = BlockAllocator::BlocksForTokens(s.start_pos + s.num_tokens, allocator_->block_size());
    ss.block_table.assign(table.begin(), table.begin() + blocks);
    ss.logits = s.sample ? StepSequence::Logits::kLast : StepSequence::Logits::kNone;
    if (s.sample) {
      const Active& a = *active_.at(s.id);
      if (SampleOnDevice(a)) {
        const SamplingParams& sp = a.req.sampling;
        ss.logits = StepSequence::Logits::kToken;
        ss.sampling = TokenSampling{sp.temperature, sp.top_k, sp.top_p, a.sampler.seed(), a.sampler.step()};
        ++device_rows;
      } else {
        ++rows;
      }
    }
    input.token_ids.insert(input.token_ids.end(), toks.begin() + s.start_pos,
                           toks.begin() + s.start_pos + s.num_tokens);
    input.sequences.push_back(std::move(ss));
    Active& a = *active_.at(s.id);
    if (s.first_schedule) {
      a.t.first_scheduled = t0;
      a.accounted = t0;
      a.cached_prompt_tokens = scheduler_->Find(s.id)->num_cached_tokens;
    }
    a.step = step_.id;
    a.step_prefill = s.is_prefill;
    a.step_post = 0;
  }

  const Nanos t1 = Now();
  StartOutput();  // the last step's tokens' text, while the model runs this one
  StepOutput out;
  if (st.ok()) st = model_->Step(input, &out);
  const Nanos t2 = Now();
  step_.t1 = t1;
  step_.t2 = t2;
  if (st.ok() && (out.num_rows != rows || out.logits.size() < static_cast<size_t>(rows) * vocab_ ||
                  static_cast<int64_t>(out.tokens.size()) != device_rows)) {
    st = InternalError("model step returned {} logit rows and {} tokens, expected {} and {}", out.num_rows,
                       out.tokens.size(), rows, device_rows);
  }
  if (st.ok()) scheduler_->CompleteStep(plan);
  // After the model and CompleteStep: a sequence a stop string ended is freed once its step is done.
  FinishOutput();
  if (!st.ok()) {
    LOG_ERROR("llm loop: step over {} sequences failed: {}", plan.seqs.size(), st.ToString());
    for (const ScheduledSeq& s : plan.seqs) FinishRequest(s.id, FinishReason::kError, st);
  } else {
    int64_t row = 0, token = 0;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const ScheduledSeq& s = plan.seqs[i];
      if (!s.sample) continue;
      const bool on_device = input.sequences[i].logits == StepSequence::Logits::kToken;
      const int64_t at = on_device ? token++ : row++;
      auto it = active_.find(s.id);
      if (it == active_.end()) continue;  // a stop string ended it during this step: its token is dropped
      Active& a = *it->second;
      if (on_device) {
        const int32_t tok = out.tokens[at];
        a.sampler.set_step(a.sampler.step() + 1);  // the device drew at (seed, step), as Sample would
        if (tok < 0 || tok >= vocab_) {
          FinishRequest(a.seq, FinishReason::kError,
                        InternalError("device sampling returned token {} outside [0, {})", tok, vocab_));
          continue;
        }
        AcceptToken(a, tok, TokenLogprob{}, Now());
      } else {
        ProcessSample(a, out.logits.data() + at * vocab_);
      }
    }
  }

  step_.t3 = Now();
  StepRecord rec;
  rec.start = t0;
  rec.duration = step_.t3 - t0;
  rec.prefill_tokens = plan.num_prefill_tokens;
  rec.decode_tokens = plan.num_decode_tokens;
  rec.num_running = plan.num_running;
  rec.num_waiting = plan.num_waiting;
  rec.num_preempted = static_cast<int>(plan.preempted.size());
  rec.kv_blocks_used = plan.blocks_used;
  rec.kv_blocks_free = plan.blocks_free;
  rec.admission_stop = AdmissionStopName(plan.admission_stop);
  if (st.ok() && out.device_ns > 0) {
    rec.device_ns = out.device_ns;
    rec.device_end = t2;
  }
  rec.model_ns = t2 - t1;
  rec.output_ns = output_ns_;
  rec.prefill_cap = plan.prefill_cap;
  CountStepWork(input, options_.step_costs, &rec);
  if (options_.target_step_ms > 0 && st.ok()) {
    step_fit_.Add(plan.num_tokens(), static_cast<double>(rec.kv_positions), rec.duration * 1e-9);
  }
  PublishStats(&rec);
  if (options_.on_step) options_.on_step(rec);
  const Nanos t4 = Now();
  for (const ScheduledSeq& s : plan.seqs) {
    auto it = active_.find(s.id);
    if (it != active_.end() && it->second->step == step_.id) ChargeStep(*it->second, t4);
  }
  step_.in_step = false;
}

void LlmLoop::ChargeStep(Active& a, Nanos end) {
  // [accounted, t0): between its steps; [t0, t1): planning; [t1, t2): the model; [t2, sampled): sampling,
  // its own (postprocess, counted as it ran) and the others'; [sampled, end): the step's bookkeeping.
  const StepTimes& st = step_;
  const Nanos sampled = st.t3 ? std::min(st.t3, end) : end;
  const Nanos model = st.t2 - st.t1;
  a.t.compute += model;
  (a.step_prefill ? a.t.prefill : a.t.decode) += model;
  a.t.schedule += (st.t1 - st.t0) + (end - sampled);
  a.t.interleave += (st.t0 - a.accounted) + (sampled - st.t2 - a.step_post);
  a.accounted = end;
}

bool LlmLoop::SampleOnDevice(const Active& a) const {
  const SamplingParams& sp = a.req.sampling;
  return device_sampling_ && sp.logprobs < 0 && !(a.generated < sp.min_tokens && !a.stop_ids.empty());
}

void LlmLoop::ProcessSample(Active& a, const float* logits) {
  const Nanos p0 = Now();
  const SamplingParams& sp = a.req.sampling;
  // Before min_tokens, the stop tokens cannot be drawn at all (vLLM's MinTokensLogitsProcessor).
  const float* row = logits;
  if (a.generated < sp.min_tokens && !a.stop_ids.empty()) {
    std::copy(logits, logits + vocab_, scratch_logits_.begin());
    for (int32_t id : a.stop_ids) scratch_logits_[id] = -std::numeric_limits<float>::infinity();
    row = scratch_logits_.data();
  }
  const int32_t tok = a.sampler.Sample(row, vocab_);
  TokenLogprob lp;
  if (sp.logprobs >= 0) lp = a.sampler.Logprobs(logits, vocab_, tok, sp.logprobs);
  AcceptToken(a, tok, std::move(lp), p0);
}

void LlmLoop::AcceptToken(Active& a, int32_t tok, TokenLogprob lp, Nanos p0) {
  const SamplingParams& sp = a.req.sampling;
  Status st = scheduler_->AppendToken(a.seq, tok);
  if (!st.ok()) {
    FinishRequest(a.seq, FinishReason::kError, st);
    return;
  }
  ++a.generated;
  if (a.t.first_token == 0) {
    a.t.first_token = p0;
  } else {
    a.t.inter_token.push_back(p0 - a.last_token);
  }
  a.last_token = p0;
  ++generated_total_;

  // What ends the sequence by token is decided here, before the next step is planned; its text can wait.
  const bool stop_token = Contains(a.stop_ids, tok);  // not part of the output
  FinishReason finish = FinishReason::kNone;
  const int total = static_cast<int>(a.req.prompt_ids.size()) + a.generated;
  if (stop_token) {
    finish = FinishReason::kStop;
  } else if (a.generated >= sp.max_tokens || total >= context_length_) {
    finish = FinishReason::kLength;
  }
  if (output_ && finish == FinishReason::kNone) {
    deferred_.push_back({nullptr, a.seq, tok, std::move(lp)});
  } else {
    GenerationEvent ev;
    finish = EmitToken(a, tok, std::move(lp), finish, stop_token, ev);
    if (finish != FinishReason::kNone) {
      const Nanos post = Now() - p0;
      a.t.postprocess += post;
      a.step_post += post;
      FinishRequest(a.seq, finish, OkStatus(), std::move(ev));
      return;
    }
    if (!ev.token_ids.empty() || !ev.text.empty()) a.req.on_event(std::move(ev));
  }
  const Nanos post = Now() - p0;
  a.t.postprocess += post;
  a.step_post += post;
}

FinishReason LlmLoop::EmitToken(Active& a, int32_t tok, TokenLogprob lp, FinishReason finish, bool stop_token,
                                GenerationEvent& ev) {
  const SamplingParams& sp = a.req.sampling;
  bool stopped_by_string = false;
  if (!stop_token) {
    const std::string piece = a.decoder.Push(tok);
    a.text_total += piece.size();
    a.pending.push_back({tok, std::move(lp), a.text_total});
    StopFilter::Result r = a.stop.Push(piece);
    a.text_emitted += r.text.size();
    ev.text = std::move(r.text);
    if (r.stopped) {
      finish = FinishReason::kStop;
      stopped_by_string = true;
    }
  }
  if (finish != FinishReason::kNone && !stopped_by_string) {
    // The end: an incomplete UTF-8 tail and text held for a possible stop string are released, unless the
    // tail completes a stop string after all.
    StopFilter::Result r = a.stop.Push(a.decoder.Flush());
    ev.text += r.text;
    a.text_emitted += r.text.size();
    if (r.stopped) {
      stopped_by_string = true;
      finish = FinishReason::kStop;
    } else {
      const std::string rest = a.stop.Flush();
      ev.text += rest;
      a.text_emitted += rest.size();
    }
  }
  // Release the tokens whose text is out. At a stop string, tokens reaching into it are dropped; at any
  // other end, all are released.
  const bool release_all = finish != FinishReason::kNone && !stopped_by_string;
  while (!a.pending.empty() && (release_all || a.pending.front().text_end <= a.text_emitted)) {
    ev.token_ids.push_back(a.pending.front().id);
    if (sp.logprobs >= 0) ev.logprobs.push_back(std::move(a.pending.front().logprob));
    a.pending.pop_front();
  }
  return finish;
}

void LlmLoop::StartOutput() {
  output_ns_ = 0;
  if (!output_ || deferred_.empty()) return;
  handed_.clear();
  for (Deferred& d : deferred_) {
    auto it = active_.find(d.seq);
    if (it == active_.end()) continue;  // cancelled or failed since: its text is not wanted
    d.a = it->second.get();
    handed_.push_back(std::move(d));
  }
  deferred_.clear();
  late_stops_.clear();
  if (handed_.empty()) return;
  // Until Wait, the engine thread only runs the model: these requests' text state is the output thread's.
  output_->Start([this] {
    const Nanos start = MonotonicNanos();  // the real clock: a test's clock is the engine thread's alone
    for (Deferred& d : handed_) {
      GenerationEvent ev;
      if (EmitToken(*d.a, d.tok, std::move(d.lp), FinishReason::kNone, /*stop_token=*/false, ev) !=
          FinishReason::kNone) {
        late_stops_.push_back({d.seq, std::move(ev)});
      } else if (!ev.token_ids.empty() || !ev.text.empty()) {
        d.a->req.on_event(std::move(ev));
      }
    }
    output_ns_ = MonotonicNanos() - start;
  });
}

void LlmLoop::FinishOutput() {
  if (!output_ || handed_.empty()) return;
  output_->Wait();
  handed_.clear();
  // A stop string ended these one step late: the step just run computed one more token for each (dropped).
  for (LateStop& l : late_stops_) FinishRequest(l.seq, FinishReason::kStop, OkStatus(), std::move(l.ev));
  late_stops_.clear();
}

void LlmLoop::FlushOutput() {
  StartOutput();
  FinishOutput();
}

void LlmLoop::FinishRequest(SeqId seq, FinishReason reason, Status error, GenerationEvent ev) {
  auto it = active_.find(seq);
  if (it == active_.end()) return;
  std::unique_ptr<Active> a = std::move(it->second);
  active_.erase(it);
  seq_of_.erase(a->req.id);
  scheduler_->Finish(seq);  // no-op when the scheduler already dropped it (cancellation)
  ev.finish = reason;
  ev.error = std::move(error);
  ev.prompt_tokens = static_cast<int>(a->req.prompt_ids.size());
  ev.completion_tokens = a->generated;
  ev.cached_prompt_tokens = a->cached_prompt_tokens;
  a->t.finish = Now();
  if (a->t.first_scheduled != 0) {
    if (step_.in_step && a->step == step_.id && step_.t2 != 0) {
      ChargeStep(*a, a->t.finish);  // it ends within this step
    } else {
      a->t.interleave += a->t.finish - a->accounted;  // cancelled or failed between its steps
    }
  }
  ev.timings = a->t;
  {
    std::lock_guard<std::mutex> lk(mu_);
    live_ids_.erase(a->req.id);
    ++stats_.requests_finished;
    stats_.prompt_tokens += ev.prompt_tokens;
    if (reason == FinishReason::kCancelled) ++stats_.requests_cancelled;
    if (reason == FinishReason::kError) ++stats_.requests_failed;
  }
  if (options_.on_request_done) options_.on_request_done(ev.timings, ev);
  a->req.on_event(std::move(ev));
}

void LlmLoop::PublishStats(const StepRecord* step) {
  const SchedulerCounters& c = scheduler_->counters();
  const BlockAllocatorStats a = allocator_->stats();
  std::lock_guard<std::mutex> lk(mu_);
  EngineSnapshot& e = stats_.engine;
  e.num_running = scheduler_->num_running();
  e.num_waiting = scheduler_->num_waiting();
  e.kv_blocks_used = a.used;
  e.kv_blocks_free = a.free + a.cached;
  e.kv_blocks_total = a.num_blocks;
  e.prefix_cache_queries = c.prefix_query_tokens;
  e.prefix_cache_hits = c.prefix_hit_tokens;
  e.prefix_cache_evictions = a.evictions;
  e.num_preemptions = c.preemptions;
  stats_.prefill_tokens = c.prefill_tokens;
  stats_.recompute_tokens = c.recompute_tokens;
  stats_.generation_tokens = generated_total_;
  num_waiting_ = e.num_waiting;
  if (step) {
    ++stats_.steps;
    stats_.last_step = *step;
  }
}

void LlmLoop::FailAll(const Status& error) {
  std::vector<SeqId> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (SeqId id : ids) FinishRequest(id, FinishReason::kError, error);
  std::vector<Inbound> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(inbox_);
  }
  for (Inbound& r : left) {
    GenerationEvent ev;
    ev.finish = FinishReason::kError;
    ev.error = error;
    ev.prompt_tokens = static_cast<int>(r.request.prompt_ids.size());
    r.request.on_event(std::move(ev));
  }
}

}  // namespace stoke
