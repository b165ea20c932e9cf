// KServe v2 REST endpoints (plus the Triton extensions tools read) over the classic model repository:
//
//   GET  /v2/health/live, /v2/health/ready           200 / 400, empty body (Triton's convention)
//   GET  /v2                                         server metadata (extensions incl. statistics)
//   GET  /v2/models/{m}[/versions/1]                 model metadata (shapes with the batch dim, -1)
//   GET  /v2/models/{m}[/versions/1]/ready           200 / 400
//   GET  /v2/models/{m}[/versions/1]/config          Triton ModelConfig as JSON
//   POST /v2/models/{m}[/versions/1]/infer           JSON and binary tensor data
//   GET  /v2/models[/{m}[/versions/1]]/stats         statistics extension (what perf_analyzer diffs)
//   POST /v2/repository/index                        every model: name, version, state, reason
//   POST /v2/repository/models/{m}/load              load (again) and answer when done: 200, or 400 why
//   POST /v2/repository/models/{m}/unload            refuse new requests, drain, free: 200 when done
//
// The models are the server's repository (serve/repository/model_repository.h): its batched models serve
// here; a decoder is listed by the index and can be loaded and unloaded, but infers over the OpenAI routes.
// Routes are exact paths (http_server.h), registered per served name before the server starts. Errors are
// {"error": "..."} with Triton's status mapping. An infer request's path: parse (strand) -> validate,
// tokenise, submit -> batcher -> instance -> the result is posted back to the strand, encoded and sent; when
// the last byte is written the ledger (recv ... send) goes to the model's metrics.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "net/http/http_server.h"
#include "serve/repository/model_repository.h"
#include "telemetry/request_log.h"

namespace stoke {

struct KserveServiceOptions {
  std::string server_name = "stoke";
  std::string server_version = "0.1.0";
  // Answered infer requests with their ledgers go here (GET /v1/debug/requests); null: not recorded.
  RequestLog* request_log = nullptr;
  bool record_ledger = true;  // false: answered requests' ledgers are not recorded (`--no-ledger`)
};

class KserveService {
 public:
  // repo must outlive the service and have its models added (not necessarily started).
  KserveService(KserveServiceOptions options, ModelRepository* repo);

  // The model routes of every batched served name, and the repository extension.

  void RegisterRoutes(HttpServer& server);

  // JSON documents, shared with the gRPC front end's tests and the /config route.
  // `model` is m's loaded model (ServedModel::Acquire).
  static nlohmann::json ModelMetadataJson(const ServedModel& m, const ClassicModel& model);
  static nlohmann::json ModelConfigJson(const ServedModel& m, const ClassicModel& model);
  static nlohmann::json ModelStatsJson(const ServedModel& m);
  // POST /v2/repository/index's body: every name with its state (and the reason when UNAVAILABLE).
  static nlohmann::json RepositoryIndexJson(const ModelRepository& repo, bool ready_only);
  nlohmann::json ServerMetadataJson() const;

  void HandleInfer(ServedModel* m, const HttpRequest& req, std::shared_ptr<HttpResponder> r);

 private:
  const KserveServiceOptions options_;
  ModelRepository* const repo_;
};

// The extensions /v2 (and gRPC ServerMetadata) list.
const std::vector<std::string>& KserveExtensions();

}  // namespace stoke
