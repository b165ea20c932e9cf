#include "tools/bench/grpc_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <cctype>
#include <chrono>
#include <climits>
#include <iterator>
#include <optional>

#include "net/grpc/grpc_service.grpc.pb.h"
#include "tools/bench/stats.h"

namespace stoke::bench {

namespace asio = boost::asio;

namespace {

constexpr size_t kMaxDetail = 200;

grpc::ChannelArguments ChannelArgs(int index) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT_MAX);
  args.SetMaxSendMessageSize(INT_MAX);
  // Without a local subchannel pool, channels to one target share one TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("stoke.bench.channel", index);
  return args;
}

std::chrono::system_clock::time_point DeadlineAfter(double seconds) {
  return std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                std::chrono::duration<double>(seconds));
}

}  // namespace

std::string GrpcErrorKind(int code) {
  static constexpr const char* kNames[] = {
      "ok",        "cancelled",      "unknown",           "invalid_argument",   "deadline_exceeded",
      "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
      "aborted",   "out_of_range",   "unimplemented",     "internal",           "unavailable",
      "data_loss", "unauthenticated"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return std::string("grpc_") + kNames[code];
  return fmt::format("grpc_{}", code);
}

StatusOr<std::vector<KserveInput>> FetchGrpcModelInputs(const std::string& target, const std::string& model,
                                                        double timeout_s) {
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), ChannelArgs(-1));
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(timeout_s));
  inference::ModelMetadataRequest req;
  req.set_name(model);
  inference::ModelMetadataResponse resp;
  grpc::Status s = stub->ModelMetadata(&ctx, req, &resp);
  if (!s.ok()) {
    return UnavailableError("gRPC {} ModelMetadata '{}': {} ({})", target, model,
                            s.error_message().substr(0, kMaxDetail), GrpcErrorKind(s.error_code()));
  }
  std::vector<KserveInput> out;
  for (const auto& in : resp.inputs()) {
    KserveInput k{in.name(), in.datatype(), {}};
    for (int64_t d : in.shape()) k.shape.push_back(d);
    out.push_back(std::move(k));
  }
  if (out.empty())
    return InvalidArgumentError("gRPC {} ModelMetadata '{}': the model has no inputs", target, model);
  return out;
}

// One ModelInfer in flight. Created on the io thread, completed by the poller, deleted on the io thread.
class GrpcClient::Call {
 public:
  grpc::ClientContext ctx;
  inference::ModelInferResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> rpc;
  std::shared_ptr<const inference::ModelInferRequest> request;
  std::shared_ptr<Slot> slot;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
};

class GrpcClient::Slot final : public Connection, public std::enable_shared_from_this<GrpcClient::Slot> {
 public:
  Slot(GrpcClient* client, std::shared_ptr<grpc::Channel> channel)
      : client_(client), stub_(inference::GRPCInferenceService::NewStub(std::move(channel))) {}

  void Connect(std::function<void(bool)> done) override {
    // The channels were connected by WaitConnected before the point started.
    asio::post(client_->io_, [done = std::move(done)] { done(true); });
  }

  void Start(const WireRequest& request, ResponseHandlers handlers, Nanos timeout) override {
    handlers_ = std::move(handlers);
    busy_ = true;
    if (request.grpc == nullptr) {
      auto self = shared_from_this();
      asio::post(client_->io_,
                 [self] { self->Complete("build", "no gRPC message in the request", MonotonicNanos()); });
      return;
    }
    auto* call = new Call();
    call->request = request.grpc;
    call->slot = shared_from_this();
    call->work.emplace(client_->io_.get_executor());
    call->ctx.set_deadline(DeadlineAfter(timeout * 1e-9));
    current_ = call;
    if (handlers_.on_sent) handlers_.on_sent(MonotonicNanos());
    call->rpc = stub_->PrepareAsyncModelInfer(&call->ctx, *call->request, client_->cq_.get());
    call->rpc->StartCall();
    call->rpc->Finish(&call->response, &call->status, call);
  }

  void Close() override {
    if (current_ != nullptr) current_->ctx.TryCancel();  // completes as grpc_cancelled
  }

  bool busy() const override { return busy_; }

  // On the io thread: the call's result, timestamped by the poller at `t`.
  void Finished(Call* call, Nanos t) {
    std::unique_ptr<Call> owned(call);
    current_ = nullptr;
    if (!call->status.ok()) {
      return Complete(GrpcErrorKind(call->status.error_code()),
                      call->status.error_message().substr(0, kMaxDetail), t);
    }
    if (call->response.outputs_size() == 0) return Complete("bad_response", "ModelInfer: no outputs", t);
    if (handlers_.on_status) handlers_.on_status(200, -1);
    Complete("", "", t);
  }

 private:
  void Complete(const std::string& error, const std::string& detail, Nanos t) {
    busy_ = false;
    ResponseHandlers h = std::move(handlers_);
    handlers_ = {};
    if (h.on_complete) h.on_complete(error, detail, t);
  }

  GrpcClient* client_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
  ResponseHandlers handlers_;
  Call* current_ = nullptr;  // owned by the completion queue until Finished
  bool busy_ = false;
};

GrpcClient::GrpcClient(asio::io_context& io, std::string target, int channels)
    : io_(io), target_(std::move(target)), cq_(std::make_unique<grpc::CompletionQueue>()) {
  for (int i = 0; i < std::max(channels, 1); ++i) {
    channels_.push_back(
        grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), ChannelArgs(i)));
  }
  poller_ = std::thread([this] { Poll(); });
}

GrpcClient::~GrpcClient() {
  cq_->Shutdown();
  if (poller_.joinable()) poller_.join();
}

Status GrpcClient::WaitConnected(double timeout_s) {
  const auto deadline = DeadlineAfter(timeout_s);
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (!channels_[i]->WaitForConnected(deadline)) {
      return UnavailableError("cannot connect to grpc://{} (channel {} of {} not ready within {} s)", target_,
                              i + 1, channels_.size(), timeout_s);
    }
  }
  return OkStatus();
}

std::shared_ptr<Connection> GrpcClient::NewConnection() {
  auto slot = std::make_shared<Slot>(this, channels_[next_channel_ % channels_.size()]);
  ++next_channel_;
  return slot;
}

void GrpcClient::Poll() {
  const double cpu0 = ThreadCpuSeconds();
  void* tag = nullptr;
  bool ok = false;
  while (cq_->Next(&tag, &ok)) {
    const Nanos t = MonotonicNanos();
    auto* call = static_cast<Call*>(tag);
    // Finish's tag always comes back (ok is true for unary calls); the result is in call->status.
    auto work = std::move(call->work);
    call->work.reset();
    std::shared_ptr<Slot> slot = std::move(call->slot);
    asio::post(io_, [slot, call, t] { slot->Finished(call, t); });
    work.reset();  // after the post: the handler now keeps io_context::run() going
    poller_cpu_s_.store(ThreadCpuSeconds() - cpu0);
  }
}

}  // namespace stoke::bench
