// POST /v1/embeddings over the server's model repository: "model" names a batched model whose ClassicModel
// is a TextEmbedder (serve/batcher/classic_model.h; today the BERT encoders' text form), an omitted "model"
// the first encoder. input: a string, a list of strings, a list of token ids, or a list of such lists;
// encoding_format "float" (default) or "base64" (little-endian fp32 bytes).
//
// An embeddings request goes through the same dynamic batcher as KServe requests for that model: its
// sentences are split into requests of at most max_batch_size rows, submitted together, and the response is
// sent when the last one is done. Errors use OpenAI's {"error": {...}} shape (unknown model 404, a model
// that does not embed 400, not loaded 503). Once its last byte is written, a response's ledger (recv ...
// send; queue and execution stages from the chunk that finished last) goes to the model's
// stoke:request_stage_seconds, as a KServe infer's does, and to the request log. With the request header
// `X-Stoke-Ledger: 1` the response carries it (X-Stoke-Ledger header, "ledger" in the body).
#pragma once

#include <memory>

#include "net/http/http_server.h"
#include "serve/repository/model_repository.h"
#include "telemetry/request_log.h"

namespace stoke {

struct EmbeddingsServiceOptions {
  RequestLog* request_log = nullptr;  // answered requests with their ledgers; null: not recorded
  bool record_ledger = true;          // false: ledgers are not recorded (`--no-ledger`)
};

class EmbeddingsService {
 public:
  // `repo` outlives the service.
  EmbeddingsService(EmbeddingsServiceOptions options, const ModelRepository* repo);

  void RegisterRoutes(HttpServer& server);  // POST /v1/embeddings
  void HandleEmbeddings(const HttpRequest& req, std::shared_ptr<HttpResponder> r);

 private:
  const EmbeddingsServiceOptions options_;
  const ModelRepository* const repo_;
};

}  // namespace stoke
