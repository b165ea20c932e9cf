#include "net/kserve/kserve_service.h"

#include "net/kserve/kserve_codec.h"

namespace stoke {
namespace {

using nlohmann::json;

HttpResponse JsonReply(int status, std::string body) {
  HttpResponse resp;
  resp.status = status;
  resp.body = std::move(body);
  if (status == 503) resp.headers.emplace_back("Retry-After", "1");
  return resp;
}

HttpResponse ErrorReply(const Status& s) {
  return JsonReply(HttpStatusFor(s), KserveErrorBody(s.message()));
}

// Why a path under /v2 has no route, as gRPC says it: /v2/models/NAME/... of a decoder (it infers over the
// OpenAI routes) or of an unknown NAME, /v2/repository/models/NAME/... of an unknown NAME; else the path.
Status UnroutedV2Path(const ModelRepository& repo, const HttpRequest& req) {
  for (const std::string_view prefix : {"/v2/models/", "/v2/repository/models/"}) {
    if (!req.path.starts_with(prefix)) continue;
    const std::string_view rest = std::string_view(req.path).substr(prefix.size());
    const std::string name(rest.substr(0, rest.find('/')));
    const ModelRepository::Entry* e = repo.Find(name);
    if (e == nullptr) return NotFoundError("unknown model '{}'", name);
    if (e->served == nullptr && prefix == "/v2/models/") {
      return NotFoundError("model '{}' is a {} model: it is served over the OpenAI routes, not KServe", name,
                           ModelKindName(e->model->kind()));
    }
    break;
  }
  return NotFoundError("no route for {} {}", req.method, req.path);
}

// Triton answers health and readiness with a status code only.
HttpResponse Empty(int status) {
  return {.status = status, .content_type = "text/plain", .body = ""};
}

json Duration(const DurationStat& d) {
  return json{{"count", d.count}, {"ns", d.ns}};
}

json TensorMetadata(const TensorSpec& s, int max_batch_size) {
  std::vector<int64_t> shape;
  if (max_batch_size > 0) shape.push_back(-1);
  shape.insert(shape.end(), s.dims.begin(), s.dims.end());
  return json{{"name", s.name}, {"datatype", std::string(TensorTypeName(s.type))}, {"shape", shape}};
}

// The ledger of one infer request, all monotonic ns.
struct CallTimes {
  Nanos recv = 0;    // first byte
  Nanos parsed = 0;  // parsed and validated; next: Prepare (tokenise) and queue
  bool want_ledger = false;
};

// Puts `"ledger":{...}` into a response body: the JSON itself, or the JSON header of a binary response.
void AddLedger(HttpResponse* resp, std::optional<size_t>* header_length, const Ledger& l) {
  const size_t json_end = header_length->value_or(resp->body.size());
  const size_t brace = resp->body.rfind('}', json_end == 0 ? 0 : json_end - 1);
  if (brace == std::string::npos) return;
  const std::string insert = R"(,"ledger":)" + LedgerJson(l);
  resp->body.insert(brace, insert);
  if (*header_length) **header_length += insert.size();
  resp->headers.emplace_back(kLedgerResponseHeader, LedgerHeaderValue(l));
}

}  // namespace

const std::vector<std::string>& KserveExtensions() {
  static const std::vector<std::string> kExt = {"binary_tensor_data",  "parameters",      "statistics",
                                                "model_configuration", "schedule_policy", "model_repository"};
  return kExt;
}

KserveService::KserveService(KserveServiceOptions options, ModelRepository* repo)
    : options_(std::move(options)), repo_(repo) {}

json KserveService::ServerMetadataJson() const {
  return json{{"name", options_.server_name},
              {"version", options_.server_version},
              {"extensions", KserveExtensions()}};
}

json KserveService::ModelMetadataJson(const ServedModel& m, const ClassicModel& model) {
  json inputs = json::array(), outputs = json::array();
  const int mbs = m.config().max_batch_size;
  for (const TensorSpec& s : model.signature().inputs) inputs.push_back(TensorMetadata(s, mbs));
  for (const TensorSpec& s : model.signature().outputs) outputs.push_back(TensorMetadata(s, mbs));
  json j{{"name", m.name()},
         {"versions", json::array({m.version()})},
         {"platform", model.platform()},
         {"inputs", inputs},
         {"outputs", outputs}};
  if (!model.parameters().empty()) j["parameters"] = model.parameters();
  return j;
}

json KserveService::ModelConfigJson(const ServedModel& m, const ClassicModel& model) {
  json j = m.config().ToJson();
  j["name"] = m.name();
  j["platform"] = model.platform();
  j["backend"] = "stoke";
  j["version_policy"] = json{{"latest", json{{"num_versions", 1}}}};
  json in = json::array(), out = json::array();
  for (const TensorSpec& s : model.signature().inputs) {
    in.push_back(json{{"name", s.name},
                      {"data_type", std::string(TensorTypeConfigName(s.type))},
                      {"format", "FORMAT_NONE"},
                      {"dims", s.dims},
                      {"is_shape_tensor", false},
                      {"allow_ragged_batch", false},
                      {"optional", false}});
  }
  for (const TensorSpec& s : model.signature().outputs) {
    out.push_back(json{{"name", s.name},
                       {"data_type", std::string(TensorTypeConfigName(s.type))},
                       {"dims", s.dims},
                       {"label_filename", ""},
                       {"is_shape_tensor", false}});
  }
  j["input"] = in;
  j["output"] = out;
  j["model_transaction_policy"] = json{{"decoupled", false}};
  j["response_cache"] = json{{"enable", false}};
  // Triton's form: {"quantization": {"string_value": "fp8"}, ...} (an encoder's precision; else empty).
  json params = json::object();
  for (const auto& [k, v] : model.parameters()) params[k] = json{{"string_value", v}};
  j["parameters"] = std::move(params);
  return j;
}

json KserveService::ModelStatsJson(const ServedModel& m) {
  const ModelStats s = m.Stats();
  json batch = json::array();
  for (const auto& [rows, b] : s.batch_stats) {
    batch.push_back(json{{"batch_size", static_cast<uint64_t>(rows)},
                         {"compute_input", Duration(b.compute_input)},
                         {"compute_infer", Duration(b.compute_infer)},
                         {"compute_output", Duration(b.compute_output)}});
  }
  return json{{"name", m.name()},
              {"version", m.version()},
              {"last_inference", s.last_inference_ms},
              {"inference_count", s.inference_count},
              {"execution_count", s.execution_count},
              {"inference_stats", json{{"success", Duration(s.success)},
                                       {"fail", Duration(s.fail)},
                                       {"queue", Duration(s.queue)},
                                       {"compute_input", Duration(s.compute_input)},
                                       {"compute_infer", Duration(s.compute_infer)},
                                       {"compute_output", Duration(s.compute_output)},
                                       {"cache_hit", Duration(s.cache_hit)},
                                       {"cache_miss", Duration(s.cache_miss)}}},
              {"batch_stats", batch},
              {"memory_usage", json::array()}};
}

json KserveService::RepositoryIndexJson(const ModelRepository& repo, bool ready_only) {
  json all = json::array();
  auto add = [&](const std::string& name, const RepositoryModel& m) {
    const ModelState state = m.state();
    if (ready_only && state != ModelState::kReady) return;
    json e{{"name", name}, {"version", "1"}, {"state", ModelStateName(state)}};
    const std::string reason = m.reason();
    e["reason"] = state == ModelState::kUnavailable ? reason : "";
    all.push_back(std::move(e));
  };
  for (const auto& m : repo.models()) {
    if (m->served().empty()) {
      add(m->name(), *m);
    } else {
      for (const auto& s : m->served()) add(s->name(), *m);
    }
  }
  return all;
}

void KserveService::RegisterRoutes(HttpServer& server) {
  ModelRepository* repo = repo_;
  // Unknown paths under /v2 answer in KServe's shape (not the OpenAI one a server with a decoder uses for the
  // rest), naming the model.
  server.HandlePrefix("/v2/", [repo](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    r->Send(ErrorReply(UnroutedV2Path(*repo, req)));
  });
  server.Handle("GET", "/v2/health/live",
                [](const HttpRequest&, std::shared_ptr<HttpResponder> r) { r->Send(Empty(200)); });
  server.Handle("GET", "/v2/health/ready", [repo](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send(Empty(repo->ready() ? 200 : 400));
  });
  server.Handle("GET", "/v2", [this](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    r->Send(JsonReply(200, ServerMetadataJson().dump()));
  });
  server.Handle("GET", "/v2/models/stats", [repo](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
    json all = json::array();
    for (ServedModel* m : repo->served_models()) all.push_back(ModelStatsJson(*m));
    r->Send(JsonReply(200, json{{"model_stats", all}}.dump()));
  });
  server.Handle(
      "POST", "/v2/repository/index", [repo](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
        // Body: optional {"ready": true} (only the ready ones).
        bool ready_only = false;
        if (!req.body.empty()) {
          json j = json::parse(req.body, nullptr, false);
          if (j.is_discarded() || !j.is_object()) {
            return r->Send(ErrorReply(InvalidArgumentError("the request body must be a JSON object")));
          }
          if (j.contains("ready")) {
            if (!j["ready"].is_boolean())
              return r->Send(ErrorReply(InvalidArgumentError("'ready' must be a boolean")));
            ready_only = j["ready"].get<bool>();
          }
        }
        r->Send(JsonReply(200, RepositoryIndexJson(*repo, ready_only).dump()));
      });
  // Load and unload, per model name (and each served name, which acts on its model). They run on the
  // repository's worker; the answer goes out when they are done.
  std::vector<std::string> names;
  for (const auto& m : repo_->models()) {
    names.push_back(m->name());
    for (const auto& s : m->served()) {
      if (s->name() != m->name()) names.push_back(s->name());
    }
  }
  for (const std::string& name : names) {
    for (const bool load : {true, false}) {
      const std::string path = "/v2/repository/models/" + name + (load ? "/load" : "/unload");
      server.Handle("POST", path, [repo, name, load](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        auto done = [r](Status s) {
          r->Send(s.ok() ? JsonReply(200, "{}")
                         : JsonReply(s.code() == StatusCode::kUnavailable ? 503 : 400,
                                     KserveErrorBody(s.message())));
        };
        Status queued = load ? repo->Load(name, done) : repo->Unload(name, done);
        if (!queued.ok()) r->Send(ErrorReply(queued));
      });
    }
  }
  for (ServedModel* m : repo_->served_models()) {
    const std::string base = "/v2/models/" + m->name();
    for (const std::string& prefix : {base, base + "/versions/" + m->version()}) {
      server.Handle("GET", prefix, [m](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        ServedModel::Use use = m->Acquire();
        if (!use) return r->Send(ErrorReply(UnavailableError("model '{}' is not ready", m->name())));
        r->Send(JsonReply(200, ModelMetadataJson(*m, *use).dump()));
      });
      server.Handle("GET", prefix + "/ready", [m](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        if (m->ready()) {
          r->Send(Empty(200));
        } else {
          r->Send(JsonReply(400, KserveErrorBody("model '" + m->name() + "' is not ready")));
        }
      });
      server.Handle("GET", prefix + "/config", [m](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        ServedModel::Use use = m->Acquire();
        if (!use) return r->Send(ErrorReply(UnavailableError("model '{}' is not ready", m->name())));
        r->Send(JsonReply(200, ModelConfigJson(*m, *use).dump()));
      });
      server.Handle("GET", prefix + "/stats", [m](const HttpRequest&, std::shared_ptr<HttpResponder> r) {
        r->Send(JsonReply(200, json{{"model_stats", json::array({ModelStatsJson(*m)})}}.dump()));
      });
      server.Handle("POST", prefix + "/infer",
                    [this, m](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
                      HandleInfer(m, req, std::move(r));
                    });
    }
  }
}

void KserveService::HandleInfer(ServedModel* m, const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  // Holds the model loaded (an unload waits) until the request is queued.
  ServedModel::Use use = m->Acquire();
  if (!use) {
    r->Send(ErrorReply(UnavailableError("model '{}' is not ready", m->name())));
    return;
  }
  const std::string encoding = req.Header("content-encoding");
  if (!encoding.empty() && encoding != "identity") {
    // 415, as RFC 9110 says for a content coding the server does not know.
    r->Send(
        JsonReply(415, KserveErrorBody(fmt::format(
                           "Content-Encoding '{}' is not supported; send the body uncompressed", encoding))));
    return;
  }
  auto header_length = ParseHeaderLength(req.Header("inference-header-content-length"));
  if (!header_length.ok()) {
    r->Send(ErrorReply(header_length.status()));
    return;
  }
  StatusOr<RestInferRequest> parsed =
      (*header_length && **header_length == 0)
          ? ParseRawBinaryRequest(req.body, use->signature(), m->config().max_batch_size)
          : ParseRestInferRequest(req.body, *header_length);
  if (!parsed.ok()) {
    r->Send(ErrorReply(parsed.status()));
    return;
  }
  for (const RequestedOutput& o : parsed->outputs) {
    bool known = false;
    for (const TensorSpec& s : use->signature().outputs) known |= s.name == o.name;
    if (!known) {
      r->Send(ErrorReply(
          InvalidArgumentError("unexpected inference output '{}' for model '{}'", o.name, m->name())));
      return;
    }
  }
  InferOptions opts{.priority = parsed->priority, .timeout_us = parsed->timeout_us, .arrival = req.recv_time};
  std::vector<InferTensor> inputs = std::move(parsed->inputs);
  auto call = std::make_shared<RestInferRequest>(std::move(parsed).value());
  auto times =
      std::make_shared<CallTimes>(CallTimes{.recv = req.recv_time,
                                            .parsed = MonotonicNanos(),
                                            .want_ledger = LedgerRequested(req.Header(kLedgerHeader))});
  RequestLog* log = options_.request_log;
  const bool record = options_.record_ledger;
  Status s = m->Infer(std::move(inputs), opts, [m, r, call, times, log, record](InferResult result) {
    auto res = std::make_shared<InferResult>(std::move(result));
    r->Post([m, r, call, times, res, log, record] {
      if (!res->status.ok()) {
        r->Send(ErrorReply(res->status));
        return;
      }
      auto encoded = EncodeRestInferResponse(m->name(), m->version(), *call, std::move(res->outputs));
      if (!encoded.ok()) {
        r->Send(ErrorReply(encoded.status()));
        return;
      }
      HttpResponse resp;
      resp.body = std::move(encoded->body);
      const RequestTimes t = res->times;
      std::optional<size_t> header_length = encoded->header_length;
      if (times->want_ledger) {
        AddLedger(&resp, &header_length, RequestLedger(times->recv, times->parsed, t, MonotonicNanos()));
      }
      if (header_length) {
        resp.content_type = "application/octet-stream";
        resp.headers.emplace_back("Inference-Header-Content-Length", std::to_string(*header_length));
      }
      // The callback holds the responder: the exchange forgets it once nobody does, even mid-write.
      // Complete() runs it exactly once (written or abandoned) and drops it, which ends the cycle.
      if (record) {
        r->OnComplete([m, times, t, log, id = call->id.value_or(""), keep = r](bool ok, Nanos when) {
          if (ok) {
            RecordClassicRequest(m->metrics(), log, m->name(), "kserve_http", id,
                                 RequestLedger(times->recv, times->parsed, t, when));
          }
        });
      }
      r->Send(std::move(resp));
    });
  });
  if (!s.ok()) {
    // Queue-full rejections are counted by the batcher; malformed requests here.
    if (m->metrics() != nullptr && s.code() != StatusCode::kUnavailable) m->metrics()->OnFailure("OTHER");
    r->Send(ErrorReply(s));
  }
}

}  // namespace stoke
