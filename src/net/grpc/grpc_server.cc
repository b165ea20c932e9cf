#include "net/grpc/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <climits>
#include <memory>

#include "base/clock.h"
#include "base/logging.h"
#include "net/grpc/grpc_codec.h"
#include "net/grpc/grpc_service.grpc.pb.h"

namespace stoke {
namespace {

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(GrpcCodeFor(s)), s.message());
}

// A ModelInfer call: finished from the instance thread; OnDone (all bytes sent or the call ended) closes the
// request's ledger.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit InferReactor(Nanos arrival) : arrival_(arrival) {}
  void Done(ServedModel* m, const RequestTimes& t, Nanos submit, const grpc::Status& s) {
    model_ = m;
    times_ = t;
    submit_ = submit;
    ok_ = s.ok();
    Finish(s);
  }
  void OnDone() override {
    if (ok_ && model_ != nullptr && model_->metrics() != nullptr) {
      ClassicLedger l;
      l[static_cast<int>(ClassicStage::kRecv)] = submit_ - arrival_;
      l[static_cast<int>(ClassicStage::kQueue)] = times_.dispatch - times_.enqueue;
      l[static_cast<int>(ClassicStage::kPreprocess)] = times_.exec.preprocess;
      l[static_cast<int>(ClassicStage::kH2d)] = times_.exec.h2d;
      l[static_cast<int>(ClassicStage::kCompute)] = times_.exec.compute;
      l[static_cast<int>(ClassicStage::kD2h)] = times_.exec.d2h;
      l[static_cast<int>(ClassicStage::kPostprocess)] = times_.exec.postprocess;
      l[static_cast<int>(ClassicStage::kSend)] = MonotonicNanos() - times_.done;
      model_->metrics()->ObserveLedger(l);
    }
    delete this;
  }
  void OnCancel() override {}

 private:
  Nanos arrival_;
  ServedModel* model_ = nullptr;
  RequestTimes times_;
  Nanos submit_ = 0;
  bool ok_ = false;
};

}  // namespace

int GrpcCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kUnavailable:
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

class GrpcInferenceServer::Service final : public inference::GRPCInferenceService::CallbackService {
 public:
  Service(const GrpcServerOptions& options, ModelRepository* repo) : options_(options), repo_(repo) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* ctx, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* resp) override {
    resp->set_live(true);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* ctx,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* resp) override {
    resp->set_ready(repo_->ready());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* ctx,
                                       const inference::ModelReadyRequest* req,
                                       inference::ModelReadyResponse* resp) override {
    auto m = repo_->Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    resp->set_ready((*m)->ready());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* resp) override {
    resp->set_name(options_.server_name);
    resp->set_version(options_.server_version);
    for (const std::string& e : options_.extensions) resp->add_extensions(e);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override {
    auto m = Ready(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    FillModelMetadata(**m, resp);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override {
    auto m = Ready(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    FillModelConfig(**m, resp->mutable_config());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override {
    if (req->name().empty()) {
      for (ServedModel* m : repo_->models()) FillModelStatistics(*m, resp->add_model_stats());
      return Ok(ctx);
    }
    auto m = repo_->Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    FillModelStatistics(**m, resp->add_model_stats());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override {
    for (ServedModel* m : repo_->models()) {
      if (req->ready() && !m->ready()) continue;
      auto* e = resp->add_models();
      e->set_name(m->name());
      e->set_version(m->version());
      e->set_state(m->ready() ? "READY" : "LOADING");
    }
    return Ok(ctx);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* resp) override {
    const Nanos arrival = MonotonicNanos();
    auto* reactor = new InferReactor(arrival);
    auto fail = [&](const Status& s) {
      reactor->Done(nullptr, {}, 0, ToGrpc(s));
      return reactor;
    };
    auto found = Ready(req->model_name(), req->model_version());
    if (!found.ok()) return fail(found.status());
    ServedModel* m = *found;
    auto params = DecodeGrpcParameters(*req);
    if (!params.ok()) return fail(params.status());
    auto inputs = DecodeGrpcInputs(*req);
    if (!inputs.ok()) return fail(inputs.status());
    for (const auto& o : req->outputs()) {
      bool known = false;
      for (const TensorSpec& s : m->model().signature().outputs) known |= s.name == o.name();
      if (!known) {
        return fail(
            InvalidArgumentError("unexpected inference output '{}' for model '{}'", o.name(), m->name()));
      }
    }
    const InferOptions opts{
        .priority = params->priority, .timeout_us = params->timeout_us, .arrival = arrival};
    const Nanos submit = MonotonicNanos();
    Status s = m->Infer(std::move(inputs).value(), opts, [m, req, resp, reactor, submit](InferResult r) {
      if (!r.status.ok()) return reactor->Done(m, r.times, submit, ToGrpc(r.status));
      resp->set_model_name(m->name());
      resp->set_model_version(m->version());
      resp->set_id(req->id());
      Status enc = EncodeGrpcOutputs(*req, std::move(r.outputs), resp);
      reactor->Done(m, r.times, submit, ToGrpc(enc));
    });
    if (!s.ok()) {
      if (m->metrics() != nullptr && s.code() != StatusCode::kUnavailable) m->metrics()->OnFailure("OTHER");
      return fail(s);
    }
    return reactor;
  }

 private:
  StatusOr<ServedModel*> Ready(const std::string& name, const std::string& version) {
    ASSIGN_OR_RETURN(ServedModel * m, repo_->Find(name, version));
    if (!m->ready()) return UnavailableError("model '{}' is not ready", name);
    return m;
  }
  static grpc::ServerUnaryReactor* Ok(grpc::CallbackServerContext* ctx) {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  static grpc::ServerUnaryReactor* Fail(grpc::CallbackServerContext* ctx, const Status& s) {
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(s));
    return r;
  }

  const GrpcServerOptions& options_;
  ModelRepository* repo_;
};

GrpcInferenceServer::GrpcInferenceServer(GrpcServerOptions options, ModelRepository* repo)
    : options_(std::move(options)), repo_(repo) {}

GrpcInferenceServer::~GrpcInferenceServer() {
  Shutdown(std::chrono::milliseconds(0));
}

Status GrpcInferenceServer::Start() {
  service_ = std::make_unique<Service>(options_, repo_);
  grpc::ServerBuilder builder;
  const std::string address = options_.host + ":" + std::to_string(options_.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  builder.SetMaxReceiveMessageSize(INT_MAX);
  builder.SetMaxSendMessageSize(INT_MAX);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return UnavailableError("gRPC: cannot listen on {}", address);
  }
  return OkStatus();
}

void GrpcInferenceServer::Shutdown(std::chrono::milliseconds deadline) {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + deadline);
  server_->Wait();
  server_.reset();
}

}  // namespace stoke
