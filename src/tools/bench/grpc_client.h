// The bench's KServe v2 gRPC client (inference.GRPCInferenceService, the stubs generated into
// stoke_grpc_proto): asynchronous ModelInfer calls on a grpc::CompletionQueue, many in flight on a few
// HTTP/2 channels without a thread each.
//
//   GrpcClient client(io, "127.0.0.1:8001", /*channels=*/1);
//   RETURN_IF_ERROR(client.WaitConnected(10));
//   std::shared_ptr<Connection> slot = client.NewConnection();   // one request at a time, like an HTTP
//   socket slot->Start(wire_request, handlers, timeout);                 // handlers run on `io`'s thread
//
// A "connection" here is a slot for one call, sharing the client's channels round-robin, so the load
// generator drives gRPC exactly as it drives HTTP keep-alive sockets. One poller thread waits on the
// completion queue; it timestamps each finished call the moment the queue hands it back and posts the result
// to the io_context, where all bookkeeping stays. Each call in flight holds the io_context's work count, so
// io_context::run() does not return while a call is outstanding.
//
// Errors: a call that ends with a non-OK gRPC status fails with kind "grpc_<code>" in lower case
// ("grpc_unavailable", "grpc_resource_exhausted", "grpc_deadline_exceeded" when --timeout passes, ...); an OK
// response without outputs is "bad_response".
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "tools/bench/connection.h"
#include "tools/bench/protocol.h"

namespace grpc {
class Channel;
class CompletionQueue;
}  // namespace grpc

namespace stoke::bench {

// "grpc_" + the status code's name in lower case, e.g. 14 -> "grpc_unavailable".
std::string GrpcErrorKind(int code);

// The inputs of a model from ModelMetadata (a blocking call on a fresh channel), as kserve-http reads them
// from GET /v2/models/{m}.
StatusOr<std::vector<KserveInput>> FetchGrpcModelInputs(const std::string& target, const std::string& model,
                                                        double timeout_s);

class GrpcClient {
 public:
  // target: "host:port". channels >= 1 separate HTTP/2 connections.
  GrpcClient(boost::asio::io_context& io, std::string target, int channels);
  // Shuts the completion queue down and joins the poller (every call must have completed: io.run() ended).
  ~GrpcClient();
  GrpcClient(const GrpcClient&) = delete;
  GrpcClient& operator=(const GrpcClient&) = delete;

  // Connects every channel; Unavailable if one is not ready within timeout_s.
  Status WaitConnected(double timeout_s);
  std::shared_ptr<Connection> NewConnection();
  // CPU seconds the poller thread has used so far (the generator's health counts it with the io thread).
  double PollerCpuSeconds() const { return poller_cpu_s_.load(); }

  class Call;
  class Slot;

 private:
  void Poll();

  boost::asio::io_context& io_;
  std::string target_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;  // each slot makes its stub on one of these
  std::unique_ptr<grpc::CompletionQueue> cq_;
  std::thread poller_;
  std::atomic<double> poller_cpu_s_{0};
  size_t next_channel_ = 0;
};

}  // namespace stoke::bench
