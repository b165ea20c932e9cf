// inference.GRPCInferenceService (KServe v2 gRPC + Triton's ModelConfig/ModelStatistics/RepositoryIndex and
// RepositoryModelLoad/Unload)
// over the server's model repository (its batched models), on gRPC's callback API: ModelInfer never blocks a
// gRPC thread; the batcher's instance thread finishes the call.
//
//   GrpcInferenceServer grpc({.host = "127.0.0.1", .port = 8001}, &repo);
//   RETURN_IF_ERROR(grpc.Start());      // port 0: any free port, see port()
//   ...
//   grpc.Shutdown(std::chrono::seconds(5));
//
// Inputs come as typed contents or raw_input_contents (all inputs or none, in `inputs` order); outputs
// always go back as raw_output_contents in `outputs` order, as Triton does. Message size limits are raised
// to INT32_MAX both ways. Status mapping follows Triton (kserve-v2.md §5).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "serve/repository/model_repository.h"
#include "telemetry/request_log.h"

namespace grpc {
class Server;
class Status;
}  // namespace grpc

namespace stoke {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 8001;  // 0: a free port
  std::string server_name = "stoke";
  std::string server_version = "0.1.0";
  std::vector<std::string> extensions;  // ServerMetadata.extensions
  // ModelInfer requests with their ledgers go here (GET /v1/debug/requests); null: not recorded.
  RequestLog* request_log = nullptr;
  bool record_ledger = true;  // false: answered requests' ledgers are not recorded (`--no-ledger`)
};

class GrpcInferenceServer {
 public:
  GrpcInferenceServer(GrpcServerOptions options, ModelRepository* repo);
  ~GrpcInferenceServer();  // Shutdown(0) if running

  // Unavailable when the address cannot be bound.
  Status Start();
  int port() const { return port_; }
  // Stops accepting, lets in-flight calls finish for up to `deadline`, then cancels the rest.
  void Shutdown(std::chrono::milliseconds deadline);

  class Service;

 private:
  GrpcServerOptions options_;
  ModelRepository* repo_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// stoke Status -> gRPC status code (Triton's mapping).
int GrpcCodeFor(const Status& s);

}  // namespace stoke
