#include "net/openai/openai_service.h"

#include <algorithm>
#include <ctime>
#include <random>

#include "base/logging.h"
#include "telemetry/ledger_trace.h"

namespace stoke {
namespace {

constexpr int kDefaultCompletionMaxTokens = 16;  // OpenAI's (and vLLM's) default for /v1/completions

double Seconds(Nanos ns) {
  return static_cast<double>(ns) * 1e-9;
}

HttpResponse JsonResponse(int status, std::string body, HttpHeaders headers = {}) {
  return {.status = status,
          .content_type = "application/json",
          .body = std::move(body),
          .headers = std::move(headers)};
}

void SendError(HttpResponder& r, const ApiError& e) {
  HttpHeaders headers;
  if (e.status == 503) headers.emplace_back("Retry-After", "1");
  r.Send(JsonResponse(e.status, ErrorJson(e), std::move(headers)));
}

// `{...}` + `,"ledger":{...}` before its closing brace.
std::string WithLedger(std::string json_object, const Ledger& l) {
  if (json_object.empty() || json_object.back() != '}') return json_object;
  json_object.pop_back();
  json_object += R"(,"ledger":)";
  json_object += LedgerJson(l);
  json_object += '}';
  return json_object;
}

// Where a request's ledger goes, besides the response.
struct LedgerSinks {
  ServerMetrics* metrics = nullptr;  // may be null
  RequestLog* log = nullptr;         // may be null
  std::atomic<int>* in_flight = nullptr;
  std::string model;
  bool want_ledger = false;  // X-Stoke-Ledger: 1
  bool record = true;        // the ledger to the trace, the log and request_stage_seconds (--no-ledger: off)
  Nanos parsed = 0;          // request parsed and validated (end of recv, start of preprocess)
};

// One request's life after Submit, on its connection's strand.
class Generation {
 public:
  Generation(ApiKind kind, const OpenAiRequest& req, ResponseHeader header, int prompt_tokens,
             std::shared_ptr<const Tokenizer> tokenizer, std::shared_ptr<HttpResponder> responder,
             LedgerSinks sinks)
      : kind_(kind),
        stream_(req.stream),
        include_usage_(req.include_usage),
        want_logprobs_(req.sampling.logprobs >= 0),
        header_(std::move(header)),
        prompt_tokens_(prompt_tokens),
        tokenizer_(std::move(tokenizer)),
        responder_(std::move(responder)),
        sinks_(std::move(sinks)),
        metrics_(sinks_.metrics),
        in_flight_(sinks_.in_flight) {
    in_flight_->fetch_add(1);
  }
  ~Generation() {
    if (!finished_) in_flight_->fetch_sub(1);
  }

  // Headers and the role chunk go out as soon as the request is accepted (time to first byte).
  void BeginStream() {
    HttpHeaders headers;
    if (sinks_.want_ledger) headers.emplace_back("Trailer", kLedgerResponseHeader);
    responder_->StartStream(200, "text/event-stream", std::move(headers));
    if (kind_ == ApiKind::kChat) {
      responder_->Write(
          SseData(ChatChunkJson(header_, "assistant", "", nullptr, FinishReason::kNone, include_usage_)));
    }
  }

  void OnEvent(GenerationEvent ev, Nanos arrived) {
    if (finished_) return;
    std::vector<TokenLogprobText> lps;
    if (want_logprobs_) lps = LogprobTexts(ev.logprobs);
    if (ev.finish == FinishReason::kNone) {
      if (stream_) {
        WriteDelta(ev.text, lps);
      } else {
        Accumulate(ev.text, std::move(lps));
      }
      return;
    }
    // The last event: usage, timings, and the end of the response.
    finished_ = true;
    in_flight_->fetch_sub(1);
    final_arrival_ = arrived;
    timings_ = ev.timings;
    finish_ = ev.finish;
    usage_ = {.prompt_tokens = ev.prompt_tokens > 0 ? ev.prompt_tokens : prompt_tokens_,
              .completion_tokens = ev.completion_tokens,
              .cached_tokens = ev.cached_prompt_tokens};
    if (stream_) {
      FinishStream(ev, lps);
    } else {
      Accumulate(ev.text, std::move(lps));
      FinishJson(ev);
    }
    MaybeRecord();  // the client may already be gone
  }

  // Last byte written, or the client gone (then possibly before the final event).
  void OnComplete(Nanos when, Nanos recv_time) {
    completed_at_ = when;
    recv_time_ = recv_time;
    MaybeRecord();
  }

 private:
  // Once both the final event and the response's end are known: the request's totals go to the metrics
  // and the request log.
  void MaybeRecord() {
    if (recorded_ || final_arrival_ == 0 || completed_at_ == 0) return;
    recorded_ = true;
    const Nanos end = std::max(completed_at_, final_arrival_);
    Ledger ledger;
    if (sinks_.record) {
      ledger = GenerationLedger(timings_, sinks_.parsed, end);
      TraceLedger({.model = sinks_.model,
                   .api = kind_ == ApiKind::kChat ? "chat" : "completion",
                   .id = header_.id,
                   .end = end},
                  ledger);  // the timeline, while a trace is on
      if (sinks_.log != nullptr) Log(ledger);
    }
    if (metrics_ == nullptr) return;
    RequestRecord rec;
    rec.finish = responder_->disconnected() ? FinishReason::kCancelled : finish_;
    rec.prompt_tokens = usage_.prompt_tokens;
    rec.completion_tokens = usage_.completion_tokens;
    rec.cached_prompt_tokens = usage_.cached_tokens;
    if (timings_.first_token) rec.ttft = Seconds(timings_.ttft());
    rec.e2e = Seconds(end - recv_time_);
    if (timings_.first_scheduled) rec.queue_time = Seconds(timings_.queue());
    rec.inter_token.reserve(timings_.inter_token.size());
    for (Nanos gap : timings_.inter_token) rec.inter_token.push_back(Seconds(gap));
    metrics_->RecordRequest(rec);
    if (sinks_.record) metrics_->ObserveLedger(ledger);
  }

  void Log(const Ledger& ledger) {
    RequestLogEntry e;
    e.id = header_.id;
    e.model = sinks_.model;
    e.api = kind_ == ApiKind::kChat ? "chat" : "completion";
    e.status = status_;
    e.finish = FinishedReasonLabel(responder_->disconnected() ? FinishReason::kCancelled : finish_);
    e.start_unix_ms = UnixMillisAt(recv_time_);
    e.ledger = ledger;
    e.tokens_in = usage_.prompt_tokens;
    e.tokens_out = usage_.completion_tokens;
    if (timings_.first_token) e.ttft = timings_.ttft();
    if (!timings_.inter_token.empty()) {
      Nanos sum = 0;
      for (Nanos gap : timings_.inter_token) sum += gap;
      e.tpot = sum / static_cast<Nanos>(timings_.inter_token.size());
    }
    sinks_.log->Add(std::move(e));
  }

  // The ledger as it stands now, for the response (its send stage ends here, not at the last byte).
  Ledger ResponseLedger() const { return GenerationLedger(timings_, sinks_.parsed, MonotonicNanos()); }

  std::vector<TokenLogprobText> LogprobTexts(const std::vector<TokenLogprob>& in) const {
    std::vector<TokenLogprobText> out;
    out.reserve(in.size());
    for (const TokenLogprob& t : in) {
      TokenLogprobText x{.token = tokenizer_->TokenBytes(t.token_id), .logprob = t.logprob};
      for (const auto& [id, lp] : t.top) x.top.emplace_back(tokenizer_->TokenBytes(id), lp);
      out.push_back(std::move(x));
    }
    return out;
  }

  void Accumulate(const std::string& text, std::vector<TokenLogprobText> lps) {
    text_ += text;
    for (auto& x : lps) logprobs_.push_back(std::move(x));
  }

  void WriteDelta(const std::string& text, const std::vector<TokenLogprobText>& lps) {
    if (text.empty() && lps.empty()) return;
    const auto* lp = want_logprobs_ ? &lps : nullptr;
    if (kind_ == ApiKind::kChat) {
      responder_->Write(
          SseData(ChatChunkJson(header_, std::nullopt, text, lp, FinishReason::kNone, include_usage_)));
    } else {
      responder_->Write(
          SseData(CompletionChunkJson(header_, text, lp, text_offset_, FinishReason::kNone, include_usage_)));
    }
    text_offset_ += text.size();
  }

  void FinishStream(const GenerationEvent& ev, const std::vector<TokenLogprobText>& lps) {
    if (ev.finish == FinishReason::kCancelled && responder_->disconnected()) return;  // nobody to tell
    if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kCancelled) {
      WriteDelta(ev.text, lps);
      Status err = ev.error.ok() ? UnavailableError("request cancelled") : ev.error;
      responder_->Write(SseData(ErrorJson(ApiErrorFromStatus(err))));
    } else {
      WriteDelta(ev.text, lps);
      std::string last =
          kind_ == ApiKind::kChat
              ? ChatChunkJson(header_, std::nullopt, std::nullopt, nullptr, finish_, include_usage_)
              : CompletionChunkJson(header_, "", nullptr, text_offset_, finish_, include_usage_);
      if (include_usage_) {
        responder_->Write(SseData(last));
        last = UsageChunkJson(header_, kind_, usage_);
      }
      if (sinks_.want_ledger) {
        const Ledger l = ResponseLedger();
        responder_->Write(SseData(WithLedger(std::move(last), l)));
        responder_->Write(std::string(kSseDone));
        responder_->EndWithTrailers({{kLedgerResponseHeader, LedgerHeaderValue(l)}});
        return;
      }
      responder_->Write(SseData(last));
    }
    responder_->Write(std::string(kSseDone));
    responder_->End();
  }

  void FinishJson(const GenerationEvent& ev) {
    if (ev.finish == FinishReason::kCancelled && responder_->disconnected()) return;
    if (ev.finish == FinishReason::kError || ev.finish == FinishReason::kCancelled) {
      Status err = ev.error.ok() ? UnavailableError("request cancelled") : ev.error;
      ApiError e = ApiErrorFromStatus(err);
      if (e.status < 500) e.status = 500;  // the request was valid; the engine failed it
      status_ = e.status;
      SendError(*responder_, e);
      return;
    }
    const auto* lp = want_logprobs_ ? &logprobs_ : nullptr;
    std::string body = kind_ == ApiKind::kChat ? ChatCompletionJson(header_, text_, finish_, lp, usage_)
                                               : CompletionJson(header_, text_, finish_, lp, usage_);
    HttpHeaders headers;
    if (sinks_.want_ledger) {
      const Ledger l = ResponseLedger();
      body = WithLedger(std::move(body), l);
      headers.emplace_back(kLedgerResponseHeader, LedgerHeaderValue(l));
    }
    responder_->Send(JsonResponse(200, std::move(body), std::move(headers)));
  }

  const ApiKind kind_;
  const bool stream_;
  const bool include_usage_;
  const bool want_logprobs_;
  const ResponseHeader header_;
  const int prompt_tokens_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<HttpResponder> responder_;
  const LedgerSinks sinks_;
  ServerMetrics* metrics_;
  std::atomic<int>* in_flight_;

  // Strand-only.
  bool finished_ = false;
  std::string text_;  // non-streaming: the whole completion
  std::vector<TokenLogprobText> logprobs_;
  size_t text_offset_ = 0;  // streaming completions: bytes sent so far
  FinishReason finish_ = FinishReason::kNone;
  UsageCounts usage_;
  RequestTimings timings_;
  Nanos final_arrival_ = 0;
  Nanos completed_at_ = 0;
  Nanos recv_time_ = 0;
  bool recorded_ = false;
  int status_ = 200;
};

}  // namespace

ApiError UnknownModelError(const ModelRepository& repo, const std::string& model) {
  std::string served;
  for (const auto& m : repo.models()) {
    served += fmt::format("{}`{}`", served.empty() ? "" : ", ", m->name());
  }
  return {.status = 404,
          .message = fmt::format("The model `{}` does not exist (this server serves {}).", model, served),
          .param = "model",
          .code = "model_not_found"};
}

const ModelRepository::Entry* FindRequestModel(const ModelRepository& repo, const std::string& name,
                                               ModelKind kind, std::string_view route, ApiError* error) {
  const bool want_decoder = kind == ModelKind::kDecoder;
  if (name.empty()) {
    for (const auto& m : repo.models()) {
      if ((m->kind() == ModelKind::kDecoder) == want_decoder && (want_decoder || m->kind() == kind)) {
        return repo.Find(m->name());
      }
    }
    *error = {
        .status = 404,
        .message = fmt::format("this server serves no {} model for {} (it serves: {}); name one in 'model'",
                               ModelKindName(kind), route, repo.NameList()),
        .param = "model",
        .code = "model_not_found"};
    return nullptr;
  }
  const ModelRepository::Entry* e = repo.Find(name);
  if (e == nullptr) {
    *error = UnknownModelError(repo, name);
    return nullptr;
  }
  if (e->model->kind() != kind) {
    *error = {
        .status = 400,
        .message = fmt::format(
            "the model `{}` is {} {} model: it does not serve {}{}", name,
            e->model->kind() == ModelKind::kEncoder || e->model->kind() == ModelKind::kImage ? "an" : "a",
            ModelKindName(e->model->kind()), route,
            e->model->kind() == ModelKind::kDecoder   ? " (use /v1/chat/completions or /v1/completions)"
            : e->model->kind() == ModelKind::kEncoder ? " (use /v1/embeddings or KServe infer)"
                                                      : " (use KServe infer)"),
        .param = "model",
        .code = "model_not_supported"};
    return nullptr;
  }
  return e;
}

OpenAiService::OpenAiService(OpenAiServiceOptions options, const ModelRepository* repo)
    : options_(std::move(options)),
      repo_(repo),
      created_(static_cast<int64_t>(std::time(nullptr))),
      id_base_(std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(MonotonicNanos())) {}

void OpenAiService::RegisterRoutes(HttpServer& server) {
  auto bind = [this](void (OpenAiService::*fn)(const HttpRequest&, std::shared_ptr<HttpResponder>)) {
    return [this, fn](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
      (this->*fn)(req, std::move(r));
    };
  };
  server.Handle("POST", "/v1/chat/completions", bind(&OpenAiService::HandleChatCompletions));
  server.Handle("POST", "/v1/completions", bind(&OpenAiService::HandleCompletions));
  server.Handle("GET", "/v1/models", bind(&OpenAiService::HandleModels));
}

std::string OpenAiService::NewRequestId(ApiKind kind) {
  const uint64_t n = id_counter_.fetch_add(1);
  // splitmix64 of (base + n): unique per process, not guessable from the previous one.
  uint64_t z = id_base_ + n * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return fmt::format("{}-{:016x}{:08x}", kind == ApiKind::kChat ? "chatcmpl" : "cmpl", z,
                     static_cast<uint32_t>(n));
}

void OpenAiService::HandleChatCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  HandleGeneration(ApiKind::kChat, req, std::move(r));
}

void OpenAiService::HandleCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  HandleGeneration(ApiKind::kCompletion, req, std::move(r));
}

void OpenAiService::HandleGeneration(ApiKind kind, const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  // 1. Parse and validate.
  std::string param;
  StatusOr<OpenAiRequest> parsed = kind == ApiKind::kChat ? ParseChatCompletionRequest(req.body, &param)
                                                          : ParseCompletionRequest(req.body, &param);
  if (!parsed.ok()) {
    SendError(*r, ApiErrorFromStatus(parsed.status(), param));
    return;
  }
  OpenAiRequest& oreq = *parsed;
  ApiError lookup_error;
  const ModelRepository::Entry* entry =
      FindRequestModel(*repo_, oreq.model, ModelKind::kDecoder,
                       kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions", &lookup_error);
  if (entry == nullptr) {
    SendError(*r, lookup_error);
    return;
  }
  const RepositoryModel& model = *entry->model;
  std::shared_ptr<const DecoderHandle> l = model.decoder();
  if (l == nullptr) {
    const bool loading = model.state() == ModelState::kLoading;
    SendError(*r, {.status = 503,
                   .message = loading ? std::string("the model is still loading; retry shortly")
                                      : fmt::format("the model `{}` is not loaded ({})", model.name(),
                                                    ModelStateName(model.state())),
                   .code = "not_ready"});
    return;
  }

  // 2. Prompt -> token ids (preprocess).
  const Nanos parsed_at = MonotonicNanos();
  std::vector<int32_t> ids;
  const char* prompt_param = kind == ApiKind::kChat ? "messages" : "prompt";
  if (kind == ApiKind::kChat) {
    if (!l->chat_template) {
      SendError(*r, {.status = 400,
                     .message = "this model has no chat template; use /v1/completions",
                     .param = "messages"});
      return;
    }
    StatusOr<std::string> text = l->chat_template->Apply(oreq.messages, /*add_generation_prompt=*/true);
    if (!text.ok()) {
      SendError(*r, ApiErrorFromStatus(text.status(), "messages"));
      return;
    }
    // The template already holds the special tokens (BOS where the model wants it): parse them, add none.
    auto enc = l->tokenizer->Encode(*text, {.add_special = false, .parse_special = true});
    if (!enc.ok()) {
      SendError(*r, ApiErrorFromStatus(enc.status(), "messages"));
      return;
    }
    ids = std::move(*enc);
  } else if (oreq.prompt_is_ids) {
    const int vocab = l->tokenizer->vocab_size();
    for (int32_t id : oreq.prompt_ids) {
      if (id >= vocab) {
        SendError(*r, {.status = 400,
                       .message = fmt::format("token id {} in 'prompt' is outside the vocabulary (size {})",
                                              id, vocab),
                       .param = "prompt"});
        return;
      }
    }
    ids = std::move(oreq.prompt_ids);
  } else {
    auto enc = l->tokenizer->Encode(oreq.prompt_text, {.add_special = true, .parse_special = false});
    if (!enc.ok()) {
      SendError(*r, ApiErrorFromStatus(enc.status(), "prompt"));
      return;
    }
    ids = std::move(*enc);
  }
  if (ids.empty()) {
    SendError(*r, {.status = 400, .message = "the prompt is empty (0 tokens)", .param = prompt_param});
    return;
  }

  // 3. Context check, with OpenAI's message.
  const int ctx = l->engine->context_length();
  const int prompt_tokens = static_cast<int>(ids.size());
  // A chat's default is the rest of what the sequence can hold: the context, or the whole KV cache when that
  // is smaller (else every chat without max_tokens would be refused by a small cache). At least 1, so a
  // prompt past the cache gets the engine's message naming the cache.
  const int rest = std::max(1, std::min(ctx, l->engine->max_sequence_tokens()) - prompt_tokens);
  int max_tokens = oreq.max_tokens.value_or(kind == ApiKind::kChat ? rest : kDefaultCompletionMaxTokens);
  if (prompt_tokens + std::max(max_tokens, 1) > ctx) {
    SendError(*r,
              {.status = 400,
               .message = fmt::format(
                   "This model's maximum context length is {} tokens. However, you requested "
                   "{} tokens ({} in the {}, {} in the completion). Please reduce the length "
                   "of the {} or completion.",
                   ctx, prompt_tokens + max_tokens, prompt_tokens, prompt_param, max_tokens, prompt_param),
               .param = prompt_param,
               .code = "context_length_exceeded"});
    return;
  }
  oreq.sampling.max_tokens = max_tokens;

  // 4. Submit. Events come on the engine thread and are handed to this connection's strand.
  ResponseHeader header{
      .id = NewRequestId(kind), .created = static_cast<int64_t>(std::time(nullptr)), .model = model.name()};
  auto gen =
      std::make_shared<Generation>(kind, oreq, header, prompt_tokens, l->tokenizer, r,
                                   LedgerSinks{.metrics = l->metrics,
                                               .log = options_.request_log,
                                               .in_flight = &in_flight_,
                                               .model = model.name(),
                                               .want_ledger = LedgerRequested(req.Header(kLedgerHeader)),
                                               .record = options_.record_ledger,
                                               .parsed = parsed_at});
  GenerationRequest greq;
  greq.id = header.id;
  greq.prompt_ids = std::move(ids);
  greq.sampling = oreq.sampling;
  greq.priority = oreq.priority;
  greq.recv_time = req.recv_time;
  std::weak_ptr<HttpResponder> weak_r = r;
  // Each event to the connection's strand: through the outbox (--event-batching on) or posted at once.
  std::shared_ptr<EventOutbox> outbox = options_.batch_generation_events ? outbox_ : nullptr;
  greq.on_event = [gen, weak_r, outbox](GenerationEvent ev) {
    const Nanos arrived = MonotonicNanos();
    auto deliver = [gen, ev = std::move(ev), arrived]() mutable { gen->OnEvent(std::move(ev), arrived); };
    if (outbox) {
      outbox->Push(weak_r, std::move(deliver));
    } else if (auto resp = weak_r.lock()) {
      resp->Post(std::move(deliver));
    }
  };
  Status submitted = l->engine->Submit(std::move(greq));
  if (!submitted.ok()) {
    ApiError e =
        ApiErrorFromStatus(submitted, submitted.code() == StatusCode::kInvalidArgument ? prompt_param : "");
    if (submitted.code() == StatusCode::kResourceExhausted) e.code = "queue_full";
    SendError(*r, e);
    return;
  }
  // The client going away cancels the generation (its blocks are freed within a step).
  std::weak_ptr<LlmEngine> weak_engine = l->engine;
  r->OnDisconnect([weak_engine, id = header.id] {
    if (auto e = weak_engine.lock()) e->Cancel(id);
  });
  const Nanos recv_time = req.recv_time;
  r->OnComplete([gen, recv_time](bool, Nanos when) { gen->OnComplete(when, recv_time); });
  if (oreq.stream) gen->BeginStream();
}

void OpenAiService::HandleModels(const HttpRequest&, std::shared_ptr<HttpResponder> r) {
  std::vector<ModelListEntry> list;
  for (const auto& m : repo_->models()) {
    if (m->kind() == ModelKind::kDecoder) {
      std::shared_ptr<const DecoderHandle> d = m->decoder();
      list.push_back({.id = m->name(),
                      .max_model_len = d ? d->engine->context_length() : 0,
                      .extra_fields = d ? d->model_fields : std::string()});
      continue;
    }
    // Batched models: every served name (an encoder's text form and its -ids form).
    const std::string fields = m->model_fields();  // an encoder's precision
    for (const auto& s : m->served()) list.push_back({.id = s->name(), .extra_fields = fields});
  }
  r->Send(JsonResponse(200, ModelListJson(list, created_)));
}

}  // namespace stoke
