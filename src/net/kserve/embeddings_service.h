// The OpenAI-compatible side of a classic (encoder) server:
//
//   POST /v1/embeddings   input: a string, a list of strings, a list of token ids, or a list of such lists;
//                         encoding_format "float" (default) or "base64" (little-endian fp32 bytes)
//   GET  /v1/models       the served models
//   GET  /health/live     200 once HTTP is up;   /health/ready, /health: 503 until the models are loaded
//   GET  /metrics         Prometheus text of the registry
//
// An embeddings request goes through the same dynamic batcher as KServe requests for the text model: its
// sentences are split into requests of at most max_batch_size rows, submitted together, and the response is
// sent when the last one is done. Errors use OpenAI's {"error": {...}} shape. Once its last byte is written,
// a response's ledger (recv ... send; queue and execution stages from the chunk that finished last) goes to
// the text model's stoke:request_stage_seconds, as a KServe infer's does, and to the request log. With the
// request header `X-Stoke-Ledger: 1` the response carries it (X-Stoke-Ledger header, "ledger" in the body).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "net/http/http_server.h"
#include "serve/batcher/bert_classic_model.h"
#include "serve/batcher/model_repository.h"
#include "telemetry/metrics.h"
#include "telemetry/request_log.h"

namespace stoke {

struct EmbeddingsServiceOptions {
  std::string served_model_name;           // the text-form model in the repository
  std::vector<std::string> model_aliases;  // other names accepted in "model" (e.g. the --model argument)
  bool embeddings = true;                  // register /v1/embeddings (off for non-encoder models)
  RequestLog* request_log = nullptr;       // answered requests with their ledgers; null: not recorded
  bool record_ledger = true;               // false: ledgers are not recorded (`--no-ledger`)
};

class EmbeddingsService {
 public:
  // `repo` and `registry` (may be null) outlive the service.
  EmbeddingsService(EmbeddingsServiceOptions options, ModelRepository* repo, const MetricsRegistry* registry);

  void RegisterRoutes(HttpServer& server);
  // The text-form model (for tokenisation), once loaded; until then /v1/embeddings answers 503.
  void SetModel(std::shared_ptr<const BertClassicModel> model);
  void HandleEmbeddings(const HttpRequest& req, std::shared_ptr<HttpResponder> r);

 private:
  const EmbeddingsServiceOptions options_;
  ModelRepository* const repo_;
  const MetricsRegistry* const registry_;
  mutable std::mutex mu_;
  std::shared_ptr<const BertClassicModel> model_;  // guarded by mu_
  const int64_t created_;
};

}  // namespace stoke
