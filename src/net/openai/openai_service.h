// The OpenAI-compatible endpoints over the server's model repository (serve/repository/model_repository.h):
//
//   POST /v1/chat/completions   messages -> chat template -> tokens -> the decoder named by "model"
//   POST /v1/completions        prompt (text or token ids) -> tokens -> the decoder named by "model"
//   GET  /v1/models             every model in the repository (and each batched model's served names)
//
// "model" picks the model by name or alias: unknown -> 404 naming the models served; an encoder or
// synthetic model -> 400 (use /v1/embeddings or KServe); not loaded (loading, unloaded) -> 503. An omitted
// "model" means the first decoder. /v1/embeddings is EmbeddingsService (embeddings_service.h); /health and
// /metrics belong to the server's lifecycle (src/server/).
//
// A request's path through here (net thread = the connection's strand):
//   parse + validate (400) -> model lookup (404/400/503) -> template + tokenize -> context check (400)
//   -> LlmEngine::Submit (queue full: 503 + Retry-After) -> engine thread calls on_event -> posted to the
//   strand
//   -> JSON at the end, or one SSE chunk per event -> last byte written: metrics (e2e, ledger stages) and
//   the request log (GET /v1/debug/requests).
// With the request header `X-Stoke-Ledger: 1` the response carries the request's ledger (closed as the
// response is serialised): an X-Stoke-Ledger header and a "ledger" object in the JSON body; when streaming,
// a "ledger" object in the last data chunk and an X-Stoke-Ledger HTTP trailer. Without it, nothing changes.
// A client that goes away (socket closed while waiting, or a failed write while streaming) cancels its
// request in the engine so its KV blocks are freed within a step.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "net/http/http_server.h"
#include "net/openai/event_outbox.h"
#include "net/openai/openai_codec.h"
#include "serve/llm_engine.h"
#include "serve/repository/model_repository.h"
#include "telemetry/request_log.h"
#include "telemetry/server_metrics.h"

namespace stoke {

struct OpenAiServiceOptions {
  // Finished requests with their ledgers go here (GET /v1/debug/requests); null: not recorded.
  RequestLog* request_log = nullptr;
  // false (`stoke serve --no-ledger`): finished requests' ledgers are not recorded (no
  // request_stage_seconds, no request log entry, no trace span); X-Stoke-Ledger: 1 is still answered.
  bool record_ledger = true;
  // true (`stoke serve --event-batching on`): the engine thread queues generation events in an EventOutbox
  // and an io thread hands them to the connections (one cross-thread hand-off per batch); false: each event
  // is posted to its connection from the engine thread. Off until measured on a GPU host (event_outbox.h).
  bool batch_generation_events = false;
};

class OpenAiService {
 public:
  // `repo` must outlive the service. Each decoder's metrics come with its handle (DecoderHandle::metrics).
  OpenAiService(OpenAiServiceOptions options, const ModelRepository* repo);

  // /v1/chat/completions, /v1/completions, /v1/models.
  void RegisterRoutes(HttpServer& server);

  // Route handlers (public for tests that drive them with a fake responder).
  void HandleChatCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleModels(const HttpRequest& req, std::shared_ptr<HttpResponder> r);

  // Requests submitted to an engine whose response is not finished yet.
  int in_flight() const { return in_flight_.load(); }

 private:
  void HandleGeneration(ApiKind kind, const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  std::string NewRequestId(ApiKind kind);

  const OpenAiServiceOptions options_;
  const ModelRepository* const repo_;
  const int64_t created_;  // unix seconds, for "created" of /v1/models
  const uint64_t id_base_;
  std::atomic<uint64_t> id_counter_{0};
  std::atomic<int> in_flight_{0};
  // The engines' events to the connections, handed over in batches (batch_generation_events; event_outbox.h).
  std::shared_ptr<EventOutbox> outbox_ = std::make_shared<EventOutbox>();
};

// 404 for a "model" the repository does not hold: "The model `x` does not exist (this server serves `a`,
// `b`)." (OpenAI's wording), code model_not_found.
ApiError UnknownModelError(const ModelRepository& repo, const std::string& model);
// The model a request to `route` names, or (name empty) the first model of `kind`; null: none, and *error
// says why (404 unknown, 400 a model of another kind).
const ModelRepository::Entry* FindRequestModel(const ModelRepository& repo, const std::string& name,
                                               ModelKind kind, std::string_view route, ApiError* error);

}  // namespace stoke
