// KServe v2 REST endpoints (plus the Triton extensions tools read) over the classic model repository:
//
//   GET  /v2/health/live, /v2/health/ready           200 / 400, empty body (Triton's convention)
//   GET  /v2                                         server metadata (extensions incl. statistics)
//   GET  /v2/models/{m}[/versions/1]                 model metadata (shapes with the batch dim, -1)
//   GET  /v2/models/{m}[/versions/1]/ready           200 / 400
//   GET  /v2/models/{m}[/versions/1]/config          Triton ModelConfig as JSON
//   POST /v2/models/{m}[/versions/1]/infer           JSON and binary tensor data
//   GET  /v2/models[/{m}[/versions/1]]/stats         statistics extension (what perf_analyzer diffs)
//   POST /v2/repository/index                        the served models
//
// Routes are exact paths (http_server.h), registered per model name before the server starts. Errors are
// {"error": "..."} with Triton's status mapping. An infer request's path: parse (strand) -> validate,
// tokenise, submit -> batcher -> instance -> the result is posted back to the strand, encoded and sent; when
// the last byte is written the ledger (recv ... send) goes to the model's metrics.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "net/http/http_server.h"
#include "serve/batcher/model_repository.h"
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

  void RegisterRoutes(HttpServer& server);

  // JSON documents, shared with the gRPC front end's tests and the /config route.
  static nlohmann::json ModelMetadataJson(const ServedModel& m);
  static nlohmann::json ModelConfigJson(const ServedModel& m);
  static nlohmann::json ModelStatsJson(const ServedModel& m);
  nlohmann::json ServerMetadataJson() const;

  void HandleInfer(ServedModel* m, const HttpRequest& req, std::shared_ptr<HttpResponder> r);

 private:
  const KserveServiceOptions options_;
  ModelRepository* const repo_;
};

// The extensions /v2 (and gRPC ServerMetadata) list.
const std::vector<std::string>& KserveExtensions();

}  // namespace stoke
