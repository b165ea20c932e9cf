#include "net/grpc/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <cctype>
#include <climits>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "base/clock.h"
#include "base/constant_time.h"
#include "base/logging.h"
#include "net/grpc/grpc_codec.h"
#include "net/grpc/grpc_service.grpc.pb.h"

namespace stoke {
namespace {

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(GrpcCodeFor(s)), s.message());
}

// The call's metadata asks for the ledger (x-stoke-ledger: 1).
bool LedgerAsked(const grpc::CallbackServerContext& ctx) {
  auto it = ctx.client_metadata().find(kLedgerHeader);
  return it != ctx.client_metadata().end() &&
         LedgerRequested(std::string_view(it->second.data(), it->second.size()));
}

// A ModelInfer call: finished from the instance thread; OnDone (all bytes sent or the call ended) closes the
// request's ledger. With the metadata key x-stoke-ledger: 1 the response carries the ledger as it stands at
// Finish: trailing metadata x-stoke-ledger (the header form) and the response parameter "ledger" (JSON).
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  InferReactor(grpc::CallbackServerContext* ctx, inference::ModelInferResponse* resp, Nanos arrival,
               RequestLog* log)
      : ctx_(ctx), resp_(resp), arrival_(arrival), log_(log) {
    want_ledger_ = LedgerAsked(*ctx);
  }
  void Done(ServedModel* m, const RequestTimes& t, Nanos submit, const grpc::Status& s) {
    model_ = m;
    times_ = t;
    submit_ = submit;
    ok_ = s.ok();
    id_ = resp_->id();
    if (ok_ && want_ledger_) {
      const Ledger l = RequestLedger(arrival_, submit_, times_, MonotonicNanos());
      ctx_->AddTrailingMetadata(kLedgerHeader, LedgerHeaderValue(l));
      (*resp_->mutable_parameters())["ledger"].set_string_param(LedgerJson(l));
    }
    Finish(s);
  }
  void OnDone() override {
    if (ok_ && model_ != nullptr) {
      RecordClassicRequest(model_->metrics(), log_, model_->name(), "kserve_grpc", id_,
                           RequestLedger(arrival_, submit_, times_, MonotonicNanos()));
    }
    delete this;
  }
  void OnCancel() override {}

 private:
  grpc::CallbackServerContext* ctx_;
  inference::ModelInferResponse* resp_;
  Nanos arrival_;
  RequestLog* log_;
  bool want_ledger_ = false;
  ServedModel* model_ = nullptr;
  RequestTimes times_;
  Nanos submit_ = 0;
  bool ok_ = false;
  std::string id_;
};

// How a request ends: `status` (OK: the outputs are in the response), its model (null when the request never
// reached one), its batch's times and when it was submitted.
using InferDone =
    std::function<void(const Status& status, ServedModel* m, const RequestTimes& t, Nanos submit)>;

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
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case StatusCode::kAborted:
      return grpc::StatusCode::ABORTED;
    case StatusCode::kOutOfRange:
      return grpc::StatusCode::OUT_OF_RANGE;
    case StatusCode::kDataLoss:  // e.g. a model file cut short: RepositoryModelLoad says so, not UNKNOWN
      return grpc::StatusCode::DATA_LOSS;
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
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    auto m = Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    resp->set_ready((*m)->ready());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* ctx,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    resp->set_name(options_.server_name);
    resp->set_version(options_.server_version);
    for (const std::string& e : options_.extensions) resp->add_extensions(e);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* ctx,
                                          const inference::ModelMetadataRequest* req,
                                          inference::ModelMetadataResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    auto m = Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    ServedModel::Use use = (*m)->Acquire();
    if (!use) return Fail(ctx, UnavailableError("model '{}' is not ready", req->name()));
    FillModelMetadata(**m, *use, resp);
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* ctx,
                                        const inference::ModelConfigRequest* req,
                                        inference::ModelConfigResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    auto m = Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    ServedModel::Use use = (*m)->Acquire();
    if (!use) return Fail(ctx, UnavailableError("model '{}' is not ready", req->name()));
    FillModelConfig(**m, *use, resp->mutable_config());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* ctx,
                                            const inference::ModelStatisticsRequest* req,
                                            inference::ModelStatisticsResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    if (req->name().empty()) {
      for (ServedModel* m : repo_->served_models()) FillModelStatistics(*m, resp->add_model_stats());
      return Ok(ctx);
    }
    auto m = Find(req->name(), req->version());
    if (!m.ok()) return Fail(ctx, m.status());
    FillModelStatistics(**m, resp->add_model_stats());
    return Ok(ctx);
  }
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* ctx,
                                            const inference::RepositoryIndexRequest* req,
                                            inference::RepositoryIndexResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    for (const auto& m : repo_->models()) {
      const ModelState state = m->state();
      if (req->ready() && state != ModelState::kReady) continue;
      auto add = [&](const std::string& name) {
        auto* e = resp->add_models();
        e->set_name(name);
        e->set_version("1");
        e->set_state(ModelStateName(state));
        if (state == ModelState::kUnavailable) e->set_reason(m->reason());
      };
      if (m->served().empty()) add(m->name());
      for (const auto& s : m->served()) add(s->name());
    }
    return Ok(ctx);
  }

  // Load / unload run on the repository's worker, which finishes the call when done.
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* ctx,
                                                const inference::RepositoryModelLoadRequest* req,
                                                inference::RepositoryModelLoadResponse*) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    auto* reactor = ctx->DefaultReactor();
    Status queued = repo_->Load(req->model_name(), [reactor](Status s) { reactor->Finish(ToGrpc(s)); });
    if (!queued.ok()) reactor->Finish(ToGrpc(queued));
    return reactor;
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* ctx,
                                                  const inference::RepositoryModelUnloadRequest* req,
                                                  inference::RepositoryModelUnloadResponse*) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    auto* reactor = ctx->DefaultReactor();
    Status queued = repo_->Unload(req->model_name(), [reactor](Status s) { reactor->Finish(ToGrpc(s)); });
    if (!queued.ok()) reactor->Finish(ToGrpc(queued));
    return reactor;
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx,
                                       const inference::ModelInferRequest* req,
                                       inference::ModelInferResponse* resp) override {
    if (!Authorized(*ctx)) return Unauthenticated(ctx);
    const Nanos arrival = MonotonicNanos();
    auto* reactor = new InferReactor(ctx, resp, arrival, options_.request_log);
    StartInfer(req, resp, arrival,
               [reactor](const Status& s, ServedModel* m, const RequestTimes& t, Nanos submit) {
                 reactor->Done(m, t, submit, ToGrpc(s));
               });
    return reactor;
  }

  grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* ctx) override;

  // Validates `req` and submits it to its model's batcher. `done` runs exactly once: inline when the request
  // is refused (no model, bad tensors, queue full), else on the instance thread once the outputs are encoded
  // into `resp`. `req` and `resp` must outlive that call.
  void StartInfer(const inference::ModelInferRequest* req, inference::ModelInferResponse* resp, Nanos arrival,
                  InferDone done) {
    auto found = Find(req->model_name(), req->model_version());
    if (!found.ok()) return done(found.status(), nullptr, {}, 0);
    ServedModel* m = *found;
    ServedModel::Use use = m->Acquire();  // an unload waits until the request is queued
    if (!use) return done(UnavailableError("model '{}' is not ready", m->name()), nullptr, {}, 0);
    auto params = DecodeGrpcParameters(*req);
    if (!params.ok()) return done(params.status(), nullptr, {}, 0);
    auto inputs = DecodeGrpcInputs(*req);
    if (!inputs.ok()) return done(inputs.status(), nullptr, {}, 0);
    for (const auto& o : req->outputs()) {
      bool known = false;
      for (const TensorSpec& s : use->signature().outputs) known |= s.name == o.name();
      if (!known) {
        return done(
            InvalidArgumentError("unexpected inference output '{}' for model '{}'", o.name(), m->name()),
            nullptr, {}, 0);
      }
    }
    const InferOptions opts{
        .priority = params->priority, .timeout_us = params->timeout_us, .arrival = arrival};
    const Nanos submit = MonotonicNanos();
    // Shared: Infer takes its callback even when it refuses the request, and then we still owe `done` a call.
    auto shared = std::make_shared<InferDone>(std::move(done));
    Status s = m->Infer(std::move(inputs).value(), opts, [m, req, resp, submit, shared](InferResult r) {
      if (!r.status.ok()) return (*shared)(r.status, m, r.times, submit);
      resp->set_model_name(m->name());
      resp->set_model_version(m->version());
      resp->set_id(req->id());
      Status enc = EncodeGrpcOutputs(*req, std::move(r.outputs), resp);
      (*shared)(enc, m, r.times, submit);
    });
    if (!s.ok()) {
      if (m->metrics() != nullptr && s.code() != StatusCode::kUnavailable) m->metrics()->OnFailure("OTHER");
      (*shared)(s, nullptr, {}, 0);
    }
  }

  // With GrpcServerOptions::api_key set, the call's metadata must hold "authorization: Bearer <key>"
  // (compared in constant time). ServerLive and ServerReady, the health checks, are open.
  bool Authorized(const grpc::CallbackServerContext& ctx) const {
    if (options_.api_key.empty()) return true;
    auto it = ctx.client_metadata().find("authorization");
    if (it == ctx.client_metadata().end()) return false;
    std::string_view value(it->second.data(), it->second.size());
    constexpr std::string_view kScheme = "bearer ";
    if (value.size() < kScheme.size()) return false;
    for (size_t i = 0; i < kScheme.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return false;
    }
    value.remove_prefix(kScheme.size());
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    return ConstantTimeEquals(options_.api_key, value);
  }
  static grpc::Status UnauthenticatedStatus() {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "a valid API key is required: send the metadata 'authorization: Bearer <key>'");
  }
  static grpc::ServerUnaryReactor* Unauthenticated(grpc::CallbackServerContext* ctx) {
    auto* r = ctx->DefaultReactor();
    r->Finish(UnauthenticatedStatus());
    return r;
  }

  RequestLog* request_log() const { return options_.request_log; }
  bool record_ledger() const { return options_.record_ledger; }

 private:
  // A batched served name and version ("" or "1"); NotFound names what is wrong.
  StatusOr<ServedModel*> Find(const std::string& name, const std::string& version) {
    const ModelRepository::Entry* e = repo_->Find(name);
    if (e == nullptr) return NotFoundError("unknown model '{}'", name);
    if (e->served == nullptr) {
      return NotFoundError("model '{}' is a {} model: it is served over the OpenAI routes, not KServe infer",
                           name, ModelKindName(e->model->kind()));
    }
    if (!version.empty() && version != e->served->version()) {
      return NotFoundError("model '{}' has no version '{}' (served: '{}')", name, version,
                           e->served->version());
    }
    return e->served;
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

namespace {

// A ModelStreamInfer call (Triton's bidirectional stream for non-decoupled models): every request read is
// submitted at once, so several can be in flight; each gets exactly one ModelStreamInferResponse, written in
// the order they finish (match them by id), with error_message set (and the id) when it failed; the stream
// stays open after a failed request. The call ends once the client has half-closed (or gone) and every
// response is written (or, after a failed write, dropped). A written response closes its request's ledger.
class StreamInferReactor final
    : public grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
 public:
  // With the call's metadata x-stoke-ledger: 1, each response carries its ledger (as it stands when the
  // response is queued for writing) in the parameter "ledger" (JSON).
  StreamInferReactor(GrpcInferenceServer::Service* service, bool want_ledger)
      : service_(service), want_ledger_(want_ledger) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-closed by the client, cancelled, or the server is stopping
      bool finish;
      {
        std::lock_guard lock(mu_);
        reads_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) FinishNow();  // last touch of `this`
      return;
    }
    auto* p = new Pending;  // owned by the callback below until Answer takes it
    p->req.Swap(&incoming_);
    p->arrival = MonotonicNanos();
    {
      std::lock_guard lock(mu_);
      ++in_flight_;
    }
    service_->StartInfer(
        &p->req, p->resp.mutable_infer_response(), p->arrival,
        [this, p](const Status& s, ServedModel* m, const RequestTimes& t, Nanos submit) {
          p->model = m;
          p->times = t;
          p->submit = submit;
          p->ok = s.ok();
          if (s.ok() && want_ledger_) {
            const Ledger l = RequestLedger(p->arrival, submit, t, MonotonicNanos());
            (*p->resp.mutable_infer_response()->mutable_parameters())["ledger"].set_string_param(
                LedgerJson(l));
          }
          if (!s.ok()) {
            p->resp.Clear();
            p->resp.set_error_message(s.message());
            p->resp.mutable_infer_response()->set_id(p->req.id());
            p->resp.mutable_infer_response()->set_model_name(p->req.model_name());
          }
          Answer(std::unique_ptr<Pending>(p));
        });
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_ptr<Pending> written;
    inference::ModelStreamInferResponse* next = nullptr;
    bool finish;
    {
      std::lock_guard lock(mu_);
      written = std::move(writes_.front());
      writes_.pop_front();
      writing_ = false;
      if (!ok) {
        broken_ = true;
        writes_.clear();
      } else if (!writes_.empty()) {
        writing_ = true;
        next = &writes_.front()->resp;
      }
      finish = ShouldFinishLocked();
    }
    if (ok && written->ok && written->model != nullptr && service_->record_ledger()) {
      RecordClassicRequest(
          written->model->metrics(), service_->request_log(), written->model->name(), "kserve_grpc",
          written->req.id(),
          RequestLedger(written->arrival, written->submit, written->times, MonotonicNanos()));
    }
    if (next != nullptr) StartWrite(next);
    if (finish) FinishNow();  // last touch of `this`
  }

  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  struct Pending {
    inference::ModelInferRequest req;
    inference::ModelStreamInferResponse resp;
    ServedModel* model = nullptr;
    RequestTimes times;
    Nanos arrival = 0, submit = 0;
    bool ok = false;
  };

  // On the instance thread (or inline when the request was refused).
  void Answer(std::unique_ptr<Pending> p) {
    inference::ModelStreamInferResponse* next = nullptr;
    bool finish;
    {
      std::lock_guard lock(mu_);
      --in_flight_;
      if (!broken_) {
        writes_.push_back(std::move(p));
        if (!writing_) {
          writing_ = true;
          next = &writes_.front()->resp;
        }
      }
      finish = ShouldFinishLocked();
    }
    if (next != nullptr) StartWrite(next);
    if (finish) FinishNow();
  }

  // True exactly once: reads are over, nothing is in flight or being written.
  bool ShouldFinishLocked() {
    if (finished_ || writing_ || in_flight_ > 0 || !reads_done_) return false;
    finished_ = true;
    return true;
  }
  void FinishNow() {
    Finish(broken_ ? grpc::Status(grpc::StatusCode::CANCELLED, "a response write failed") : grpc::Status::OK);
  }

  GrpcInferenceServer::Service* const service_;
  const bool want_ledger_;
  inference::ModelInferRequest incoming_;  // the read in progress (one at a time)
  std::mutex mu_;
  std::deque<std::unique_ptr<Pending>> writes_;  // answered; the front one is being written when writing_
  int in_flight_ = 0;                            // submitted, not answered yet
  bool writing_ = false;
  bool reads_done_ = false;
  bool broken_ = false;  // a write failed: the client is gone; later answers are dropped
  bool finished_ = false;
};

}  // namespace

namespace {

// A ModelStreamInfer call without a valid API key: ends at once with UNAUTHENTICATED.
class RejectedStream final
    : public grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
 public:
  explicit RejectedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse>*
GrpcInferenceServer::Service::ModelStreamInfer(grpc::CallbackServerContext* ctx) {
  if (!Authorized(*ctx)) return new RejectedStream(UnauthenticatedStatus());
  return new StreamInferReactor(this, LedgerAsked(*ctx));
}

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
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes > 0 ? options_.max_message_bytes : INT_MAX);
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
