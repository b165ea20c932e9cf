// The OpenAI-compatible endpoints on top of an LlmEngine:
//
//   POST /v1/chat/completions   messages -> chat template -> tokens -> engine; JSON or SSE back
//   POST /v1/completions        prompt (text or token ids) -> tokens -> engine
//   GET  /v1/models             the served model
//   GET  /health/live           200 once the process serves HTTP
//   GET  /health/ready, /health 503 until SetReady(), then 200
//   GET  /metrics               Prometheus text (ServerMetrics)
//
// A request's path through here (net thread = the connection's strand):
//   parse + validate (400) -> model name (404) -> ready? (503) -> template + tokenize -> context check (400)
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
#include "net/openai/openai_codec.h"
#include "serve/llm_engine.h"
#include "telemetry/request_log.h"
#include "telemetry/server_metrics.h"

namespace stoke {

struct OpenAiServiceOptions {
  // The name /v1/models lists and requests' "model" must match (an omitted "model" means this one).
  std::string served_model_name;
  // Other names accepted in "model" (e.g. the --model path or alias given on the command line).
  std::vector<std::string> model_aliases;
  // Finished requests with their ledgers go here (GET /v1/debug/requests); null: not recorded.
  RequestLog* request_log = nullptr;
  // false (`stoke serve --no-ledger`): finished requests' ledgers are not recorded (no
  // request_stage_seconds, no request log entry, no trace span); X-Stoke-Ledger: 1 is still answered.
  bool record_ledger = true;
};

class OpenAiService {
 public:
  // metrics may be null (no /metrics, nothing recorded). It must outlive the service.
  OpenAiService(OpenAiServiceOptions options, ServerMetrics* metrics);

  void RegisterRoutes(HttpServer& server);

  // The model is loaded: from now on requests are served. template_ may be empty (chat then answers 400).
  void SetReady(std::shared_ptr<LlmEngine> engine, std::shared_ptr<const Tokenizer> tokenizer,
                std::optional<ChatTemplate> chat_template);
  bool ready() const;
  // Members added to the model's GET /v1/models entry: a JSON object as text (e.g. {"precision": {...}},
  // tools/precision/serve_gate.h). Thread-safe; may be called before or after SetReady.
  void SetModelFields(std::string json_object);

  // Route handlers (public for tests that drive them with a fake responder).
  void HandleChatCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleCompletions(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleModels(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleLive(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleReady(const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  void HandleMetrics(const HttpRequest& req, std::shared_ptr<HttpResponder> r);

  // Requests submitted to the engine whose response is not finished yet.
  int in_flight() const { return in_flight_.load(); }

 private:
  struct Loaded {
    std::shared_ptr<LlmEngine> engine;
    std::shared_ptr<const Tokenizer> tokenizer;
    std::optional<ChatTemplate> chat_template;
  };

  void HandleGeneration(ApiKind kind, const HttpRequest& req, std::shared_ptr<HttpResponder> r);
  std::shared_ptr<const Loaded> loaded() const;
  bool KnownModel(const std::string& name) const;
  std::string NewRequestId(ApiKind kind);

  const OpenAiServiceOptions options_;
  ServerMetrics* const metrics_;
  const int64_t created_;  // unix seconds, for "created" of /v1/models
  const uint64_t id_base_;
  std::atomic<uint64_t> id_counter_{0};
  std::atomic<int> in_flight_{0};
  mutable std::mutex mu_;
  std::shared_ptr<const Loaded> loaded_;  // guarded by mu_; null until SetReady
  std::string model_fields_;              // guarded by mu_; SetModelFields
};

}  // namespace stoke
