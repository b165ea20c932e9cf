#include "net/openai/embeddings_service.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "net/openai/openai_codec.h"
#include "net/openai/openai_service.h"
#include "serve/batcher/classic_metrics.h"

namespace stoke {
namespace {

using nlohmann::json;

void SendError(HttpResponder& r, const Status& s, std::string param = {}) {
  ApiError e = ApiErrorFromStatus(s, std::move(param));
  HttpResponse resp{.status = e.status, .body = ErrorJson(e)};
  if (e.status == 503) resp.headers.emplace_back("Retry-After", "1");
  r.Send(std::move(resp));
}

std::string Base64(const void* data, size_t n) {
  static const char kTable[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    const uint32_t v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < n) {
    const uint32_t v = (p[i] << 16) | (i + 1 < n ? p[i + 1] << 8 : 0);
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < n ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

struct EmbeddingsRequest {
  std::vector<std::string> texts;                // either texts
  std::vector<std::vector<int32_t>> token_rows;  // or token ids
  bool base64 = false;
  std::string model;
};

// Parse + validate; on error *param names the field.
StatusOr<EmbeddingsRequest> ParseEmbeddingsRequest(const json& j, int hidden, std::string* param) {
  EmbeddingsRequest r;
  if (j.contains("model")) {
    *param = "model";
    if (!j["model"].is_string()) return InvalidArgumentError("'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  *param = "input";
  if (!j.contains("input")) return InvalidArgumentError("'input' is required");
  const json& in = j["input"];
  auto token_id = [](const json& v, int32_t* out) {
    if (!v.is_number_integer()) return false;
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > INT32_MAX) return false;
    *out = static_cast<int32_t>(x);
    return true;
  };
  if (in.is_string()) {
    r.texts.push_back(in.get<std::string>());
  } else if (in.is_array()) {
    if (in.empty()) return InvalidArgumentError("'input' must not be an empty list");
    if (in[0].is_string()) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!in[i].is_string()) return InvalidArgumentError("input[{}] must be a string like the others", i);
        r.texts.push_back(in[i].get<std::string>());
      }
    } else if (in[0].is_number()) {
      std::vector<int32_t> row;
      for (size_t i = 0; i < in.size(); ++i) {
        int32_t id;
        if (!token_id(in[i], &id))
          return InvalidArgumentError("input[{}] must be a token id (integer >= 0)", i);
        row.push_back(id);
      }
      r.token_rows.push_back(std::move(row));
    } else if (in[0].is_array()) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!in[i].is_array() || in[i].empty()) {
          return InvalidArgumentError("input[{}] must be a non-empty list of token ids", i);
        }
        std::vector<int32_t> row;
        for (size_t k = 0; k < in[i].size(); ++k) {
          int32_t id;
          if (!token_id(in[i][k], &id)) {
            return InvalidArgumentError("input[{}][{}] must be a token id (integer >= 0)", i, k);
          }
          row.push_back(id);
        }
        r.token_rows.push_back(std::move(row));
      }
    } else {
      return InvalidArgumentError("'input' must be a string, a list of strings or a list of token ids");
    }
  } else {
    return InvalidArgumentError("'input' must be a string, a list of strings or a list of token ids");
  }
  if (j.contains("encoding_format")) {
    *param = "encoding_format";
    const json& f = j["encoding_format"];
    if (!f.is_string() || (f.get<std::string>() != "float" && f.get<std::string>() != "base64")) {
      return InvalidArgumentError("'encoding_format' must be \"float\" or \"base64\"");
    }
    r.base64 = f.get<std::string>() == "base64";
  }
  if (j.contains("dimensions") && !j["dimensions"].is_null()) {
    *param = "dimensions";
    if (!j["dimensions"].is_number_integer() || j["dimensions"].get<int64_t>() != hidden) {
      return InvalidArgumentError("'dimensions' must be {} for this model (it cannot be shortened)", hidden);
    }
  }
  param->clear();
  return r;
}

// Collects the chunks' results; the last one to arrive sends the response (on the strand).
struct EmbeddingsCall {
  std::mutex mu;
  std::vector<float> embeddings;  // [rows, hidden]
  int pending = 0;
  Status error;
  int64_t hidden = 0;
  size_t rows = 0;
  int64_t prompt_tokens = 0;
  bool base64 = false;
  std::string model;
  // The ledger: first byte, request parsed (tokenising next), and the batch times of the chunk that
  // finished last (its queue and execution are what the response waited for).
  Nanos recv = 0, parsed = 0;
  RequestTimes last;
  bool want_ledger = false;
};

std::string EmbeddingsResponseJson(const EmbeddingsCall& c) {
  std::string out = R"({"object":"list","data":[)";
  for (size_t i = 0; i < c.rows; ++i) {
    if (i) out += ',';
    fmt::format_to(std::back_inserter(out), R"({{"object":"embedding","index":{},"embedding":)", i);
    const float* row = c.embeddings.data() + i * c.hidden;
    if (c.base64) {
      out += '"' + Base64(row, c.hidden * sizeof(float)) + '"';
    } else {
      out += '[';
      for (int64_t k = 0; k < c.hidden; ++k) {
        if (k) out += ',';
        fmt::format_to(std::back_inserter(out), "{}", row[k]);
      }
      out += ']';
    }
    out += '}';
  }
  fmt::format_to(std::back_inserter(out),
                 R"(],"model":{},"usage":{{"prompt_tokens":{},"total_tokens":{}}}}})", json(c.model).dump(),
                 c.prompt_tokens, c.prompt_tokens);
  return out;
}

}  // namespace

EmbeddingsService::EmbeddingsService(EmbeddingsServiceOptions options, const ModelRepository* repo)
    : options_(std::move(options)), repo_(repo) {}

void EmbeddingsService::RegisterRoutes(HttpServer& server) {
  server.Handle("POST", "/v1/embeddings", [this](const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    HandleEmbeddings(req, std::move(r));
  });
}

void EmbeddingsService::HandleEmbeddings(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    SendError(*r, InvalidArgumentError("the request body must be a JSON object"));
    return;
  }
  // The model first (its hidden size checks 'dimensions').
  std::string requested;
  if (auto it = body.find("model"); it != body.end()) {
    if (!it->is_string()) {
      SendError(*r, InvalidArgumentError("'model' must be a string"), "model");
      return;
    }
    requested = it->get<std::string>();
  }
  ApiError lookup_error;
  const ModelRepository::Entry* entry =
      FindRequestModel(*repo_, requested, ModelKind::kEncoder, "/v1/embeddings", &lookup_error);
  if (entry == nullptr) {
    r->Send({.status = lookup_error.status, .body = ErrorJson(lookup_error)});
    return;
  }
  ServedModel* m = entry->served;
  ServedModel::Use use = m->Acquire();
  if (!use) {
    const bool loading = entry->model->state() == ModelState::kLoading;
    SendError(*r, UnavailableError(
                      "{}", loading ? std::string("the model is still loading")
                                    : fmt::format("the model '{}' is not loaded ({})", entry->model->name(),
                                                  ModelStateName(entry->model->state()))));
    return;
  }
  const TextEmbedder* model = use->text_embedder();
  if (model == nullptr) {
    SendError(*r,
              InvalidArgumentError("the model '{}' takes token ids (input_ids, attention_mask), not text: "
                                   "use KServe infer, or '{}' for /v1/embeddings",
                                   m->name(), entry->model->name()),
              "model");
    return;
  }
  std::string param;
  auto parsed = ParseEmbeddingsRequest(body, model->hidden_size(), &param);
  const Nanos parsed_at = MonotonicNanos();
  if (!parsed.ok()) {
    SendError(*r, parsed.status(), param);
    return;
  }
  int64_t longest = 0, total = 0;
  auto rows = parsed->texts.empty() ? model->CheckIds(std::move(parsed->token_rows), &longest, &total)
                                    : model->TokenizeTexts(parsed->texts, &longest, &total);
  if (!rows.ok()) {
    SendError(*r, rows.status(), "input");
    return;
  }
  auto call = std::make_shared<EmbeddingsCall>();
  std::vector<std::vector<int32_t>>& all = (*rows)->rows;
  call->hidden = model->hidden_size();
  call->rows = all.size();
  call->embeddings.resize(all.size() * call->hidden);
  call->prompt_tokens = total;
  call->base64 = parsed->base64;
  call->model = m->name();
  // Requests of at most max_batch_size rows, all submitted before any can finish.
  const size_t chunk = static_cast<size_t>(std::max(1, m->config().max_batch_size));
  const size_t num_chunks = (all.size() + chunk - 1) / chunk;
  call->pending = static_cast<int>(num_chunks);
  call->recv = req.recv_time;
  call->parsed = parsed_at;
  call->want_ledger = LedgerRequested(req.Header(kLedgerHeader));
  RequestLog* log = options_.request_log;
  const bool record = options_.record_ledger;
  const InferOptions opts{.arrival = req.recv_time};
  for (size_t c = 0; c < num_chunks; ++c) {
    const size_t begin = c * chunk, end = std::min(all.size(), begin + chunk);
    auto part = std::make_unique<TokenRows>();
    int64_t part_longest = 0;
    for (size_t i = begin; i < end; ++i) {
      part_longest = std::max<int64_t>(part_longest, all[i].size());
      part->rows.push_back(std::move(all[i]));
    }
    Status s = m->Submit(
        std::move(part), static_cast<int64_t>(end - begin), part_longest, opts,
        [call, r, m, begin, log, record](InferResult res) {
          std::lock_guard lock(call->mu);
          if (res.status.ok()) {
            const InferTensor& t = res.outputs.at(0);
            std::memcpy(call->embeddings.data() + begin * call->hidden, t.data.data(), t.data.size());
            if (res.times.done >= call->last.done) call->last = res.times;
          } else if (call->error.ok()) {
            call->error = res.status;
          }
          if (--call->pending > 0) return;
          r->Post([call, r, m, log, record] {
            if (!call->error.ok()) {
              SendError(*r, call->error);
              return;
            }
            // As for KServe infer: the ledger closes when the last byte is written. The
            // callback holds the responder until Complete() drops it.
            if (record) {
              r->OnComplete([m, call, log, keep = r](bool ok, Nanos when) {
                if (ok) {
                  RecordClassicRequest(m->metrics(), log, m->name(), "embeddings", "",
                                       RequestLedger(call->recv, call->parsed, call->last, when),
                                       call->prompt_tokens);
                }
              });
            }
            HttpResponse resp{.body = EmbeddingsResponseJson(*call)};
            if (call->want_ledger) {
              const Ledger l = RequestLedger(call->recv, call->parsed, call->last, MonotonicNanos());
              resp.body.pop_back();  // the closing brace
              resp.body += R"(,"ledger":)" + LedgerJson(l) + "}";
              resp.headers.emplace_back(kLedgerResponseHeader, LedgerHeaderValue(l));
            }
            r->Send(std::move(resp));
          });
        });
    if (!s.ok()) {
      // Chunks already queued finish on their own; the response carries this error.
      std::lock_guard lock(call->mu);
      if (call->error.ok()) call->error = s;
      call->pending -= static_cast<int>(num_chunks - c);
      if (call->pending == 0) SendError(*r, call->error);
      return;
    }
  }
}

}  // namespace stoke
