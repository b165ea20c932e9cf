#include "net/openai/openai_codec.h"

#include <cmath>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

namespace stoke {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Deeply nested bodies are refused before parsing: nothing we accept nests more than a few levels, and it
// bounds the work (and recursion) any later code does on the document.
constexpr int kMaxJsonDepth = 32;

bool TooDeep(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Field access with OpenAI-style validation messages; the first failing field is reported as `param`.
class Fields {
 public:
  Fields(const json& obj, std::string* param) : obj_(obj), param_(param) {}

  Status Fail(std::string_view name, std::string message) const {
    if (param_ != nullptr) *param_ = std::string(name);
    return InvalidArgumentError("{}", message);
  }
  Status WrongType(std::string_view name, std::string_view want, const json& v) const {
    return Fail(name, fmt::format("'{}' must be {}, got {}", name, want, v.type_name()));
  }

  // nullptr when absent or null (OpenAI treats an explicit null as "not given").
  const json* Get(std::string_view name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Bool(std::string_view name, bool* out) const {
    const json* v = Get(name);
    if (v == nullptr) return OkStatus();
    if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
    *out = v->get<bool>();
    return OkStatus();
  }

  Status Int(std::string_view name, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return OkStatus();
    if (!v->is_number_integer()) return WrongType(name, "an integer", *v);
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Fail(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v->get<uint64_t>()));
    }
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) return Fail(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x));
    *out = x;
    return OkStatus();
  }

  // lo_open: the bound lo itself is excluded.
  Status Number(std::string_view name, double lo, double hi, bool lo_open, std::optional<double>* out) const {
    const json* v = Get(name);
    if (v == nullptr) return OkStatus();
    if (!v->is_number()) return WrongType(name, "a number", *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
      return Fail(name,
                  fmt::format("'{}' must be in {}{}, {}], got {}", name, lo_open ? "(" : "[", lo, hi, x));
    }
    *out = x;
    return OkStatus();
  }

  Status String(std::string_view name, std::string* out) const {
    const json* v = Get(name);
    if (v == nullptr) return OkStatus();
    if (!v->is_string()) return WrongType(name, "a string", *v);
    *out = v->get<std::string>();
    return OkStatus();
  }

 private:
  const json& obj_;
  std::string* param_;
};

StatusOr<json> ParseBody(std::string_view body, std::string* param) {
  if (TooDeep(body))
    return InvalidArgumentError("request body nests JSON deeper than {} levels", kMaxJsonDepth);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error ("[json.exception.parse_error.101] parse error at line 1, column 5: ...") or out_of_range
    // (a number too large for a double).
    std::string what = e.what();
    const size_t p = what.find("] ");
    return InvalidArgumentError("request body is not valid JSON: {}",
                                p == std::string::npos ? what : what.substr(p + 2));
  }
  if (!j.is_object())
    return InvalidArgumentError("request body must be a JSON object, got {}", j.type_name());
  return j;
}

// The knobs chat and completions share.
Status ParseCommon(const Fields& f, OpenAiRequest* r) {
  RETURN_IF_ERROR(f.String("model", &r->model));
  if (const json* m = f.Get("model"); m != nullptr && r->model.empty()) {
    return f.Fail("model", "'model' must not be empty");
  }

  std::optional<double> d;
  RETURN_IF_ERROR(f.Number("temperature", 0.0, 2.0, false, &d));
  if (d) r->sampling.temperature = static_cast<float>(*d);
  d.reset();
  RETURN_IF_ERROR(f.Number("top_p", 0.0, 1.0, true, &d));
  if (d) r->sampling.top_p = static_cast<float>(*d);

  std::optional<int64_t> i;
  RETURN_IF_ERROR(f.Int("top_k", -1, 1 << 20, &i));
  if (i) r->sampling.top_k = *i < 0 ? 0 : static_cast<int>(*i);  // -1 (vLLM) and 0 both mean off
  i.reset();
  RETURN_IF_ERROR(
      f.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &i));
  if (i) r->sampling.seed = static_cast<uint64_t>(*i);

  i.reset();
  RETURN_IF_ERROR(f.Int("n", 1, 1 << 20, &i));
  if (i && *i != 1) return f.Fail("n", fmt::format("only n=1 is supported, got n={}", *i));
  i.reset();
  RETURN_IF_ERROR(f.Int("best_of", 1, 1 << 20, &i));
  if (i && *i != 1) return f.Fail("best_of", fmt::format("only best_of=1 is supported, got {}", *i));

  // Stop strings: a string or a list of strings.
  if (const json* s = f.Get("stop")) {
    if (s->is_string()) {
      r->sampling.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) return f.Fail("stop", "'stop' may hold at most 16 strings");
      for (const json& e : *s) {
        if (!e.is_string()) return f.Fail("stop", "'stop' must be a string or a list of strings");
        r->sampling.stop.push_back(e.get<std::string>());
      }
    } else {
      return f.WrongType("stop", "a string or a list of strings", *s);
    }
    for (const std::string& stop : r->sampling.stop) {
      if (stop.empty()) return f.Fail("stop", "'stop' strings must not be empty");
    }
  }
  if (const json* s = f.Get("stop_token_ids")) {  // vLLM extension
    if (!s->is_array()) return f.WrongType("stop_token_ids", "a list of integers", *s);
    for (const json& e : *s) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return f.Fail("stop_token_ids", "'stop_token_ids' must be a list of non-negative token ids");
      }
      r->sampling.stop_token_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
  }

  RETURN_IF_ERROR(f.Bool("stream", &r->stream));
  if (const json* so = f.Get("stream_options")) {
    if (!so->is_object()) return f.WrongType("stream_options", "an object", *so);
    if (!r->stream) return f.Fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    const auto iu = so->find("include_usage");
    if (iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) return f.WrongType("stream_options.include_usage", "a boolean", *iu);
      r->include_usage = iu->get<bool>();
    }
  }

  RETURN_IF_ERROR(f.Bool("ignore_eos", &r->sampling.ignore_eos));
  i.reset();
  RETURN_IF_ERROR(f.Int("min_tokens", 0, 1 << 30, &i));
  if (i) r->sampling.min_tokens = static_cast<int>(*i);
  i.reset();
  RETURN_IF_ERROR(f.Int("priority", -(1 << 30), 1 << 30, &i));
  if (i) r->priority = static_cast<int>(*i);

  // Known knobs we don't implement: refuse anything but their neutral value, rather than silently ignore.
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> p;
    RETURN_IF_ERROR(f.Number(name, -2.0, 2.0, false, &p));
    if (p && *p != 0.0) return f.Fail(name, fmt::format("'{}' is not supported (only 0)", name));
  }
  {
    std::optional<double> p;
    RETURN_IF_ERROR(f.Number("repetition_penalty", 0.0, 100.0, true, &p));
    if (p && *p != 1.0) return f.Fail("repetition_penalty", "'repetition_penalty' is not supported (only 1)");
  }
  if (const json* lb = f.Get("logit_bias")) {
    if (!lb->is_object()) return f.WrongType("logit_bias", "an object", *lb);
    if (!lb->empty()) return f.Fail("logit_bias", "'logit_bias' is not supported");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* t = f.Get(name); t != nullptr && !(t->is_array() && t->empty())) {
      return f.Fail(name, fmt::format("'{}' (tool calling) is not supported", name));
    }
  }
  if (const json* tc = f.Get("tool_choice");
      tc != nullptr && !(tc->is_string() && tc->get<std::string>() == "none")) {
    return f.Fail("tool_choice", "'tool_choice' is not supported (only \"none\")");
  }
  if (const json* rf = f.Get("response_format")) {
    const json* type = rf->is_object() ? Fields(*rf, nullptr).Get("type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return f.Fail("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
  }
  std::string user;
  RETURN_IF_ERROR(f.String("user", &user));
  return OkStatus();
}

Status ParseMessages(const Fields& f, const json& body, OpenAiRequest* r) {
  const json* msgs = f.Get("messages");
  if (msgs == nullptr) return f.Fail("messages", "'messages' is required");
  if (!msgs->is_array()) return f.WrongType("messages", "a list of messages", *msgs);
  if (msgs->empty()) return f.Fail("messages", "'messages' must not be empty");
  for (size_t k = 0; k < msgs->size(); ++k) {
    const json& m = (*msgs)[k];
    const std::string where = fmt::format("messages[{}]", k);
    if (!m.is_object()) return f.Fail("messages", fmt::format("{} must be an object", where));
    const auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return f.Fail("messages", fmt::format("{}.role must be a string", where));
    }
    ChatMessage out;
    out.role = role_it->get<std::string>();
    if (out.role == "developer") out.role = "system";
    if (out.role != "system" && out.role != "user" && out.role != "assistant") {
      return f.Fail(
          "messages",
          fmt::format("{}.role '{}' is not supported (system, user, assistant, developer)", where, out.role));
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !(tc->is_array() && tc->empty())) {
      return f.Fail("messages", fmt::format("{}.tool_calls is not supported", where));
    }
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      if (out.role != "assistant") return f.Fail("messages", fmt::format("{}.content is required", where));
    } else if (content->is_string()) {
      out.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text, joined with newlines (as vLLM does).
      for (size_t p = 0; p < content->size(); ++p) {
        const json& part = (*content)[p];
        const auto type = part.is_object() ? part.find("type") : part.end();
        const auto text = part.is_object() ? part.find("text") : part.end();
        if (type == part.end() || !type->is_string() || type->get<std::string>() != "text" ||
            text == part.end() || !text->is_string()) {
          return f.Fail("messages",
                        fmt::format("{}.content[{}]: only {{\"type\": \"text\", \"text\": ...}} parts "
                                    "are supported",
                                    where, p));
        }
        if (p > 0) out.content += "\n";
        out.content += text->get<std::string>();
      }
    } else {
      return f.Fail("messages", fmt::format("{}.content must be a string or a list of content parts, got {}",
                                            where, content->type_name()));
    }
    r->messages.push_back(std::move(out));
  }
  (void)body;
  return OkStatus();
}

Status ParsePrompt(const Fields& f, OpenAiRequest* r) {
  const json* p = f.Get("prompt");
  if (p == nullptr) return f.Fail("prompt", "'prompt' is required");
  auto ids_from = [&](const json& arr) -> Status {
    for (const json& e : arr) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
          e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return f.Fail("prompt", "token-id prompts must hold non-negative integers");
      }
      r->prompt_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    if (r->prompt_ids.empty()) return f.Fail("prompt", "'prompt' must not be empty");
    r->prompt_is_ids = true;
    return OkStatus();
  };
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    return OkStatus();
  }
  if (!p->is_array())
    return f.WrongType("prompt", "a string, a list of token ids, or a list of one of them", *p);
  if (p->empty()) return f.Fail("prompt", "'prompt' must not be empty");
  const json& first = (*p)[0];
  if (first.is_number()) return ids_from(*p);
  if (p->size() != 1) {
    return f.Fail("prompt", fmt::format("a batch of {} prompts is not supported: send one prompt per request",
                                        p->size()));
  }
  if (first.is_string()) {
    r->prompt_text = first.get<std::string>();
    return OkStatus();
  }
  if (first.is_array()) return ids_from(first);
  return f.WrongType("prompt", "a string, a list of token ids, or a list of one of them", *p);
}

Status CheckMinTokens(const Fields& f, const OpenAiRequest& r) {
  if (r.max_tokens && r.sampling.min_tokens > *r.max_tokens) {
    return f.Fail("min_tokens", fmt::format("'min_tokens' ({}) must not exceed 'max_tokens' ({})",
                                            r.sampling.min_tokens, *r.max_tokens));
  }
  return OkStatus();
}

}  // namespace

StatusOr<OpenAiRequest> ParseChatCompletionRequest(std::string_view body, std::string* error_param) {
  ASSIGN_OR_RETURN(json j, ParseBody(body, error_param));
  Fields f(j, error_param);
  OpenAiRequest r;
  r.kind = ApiKind::kChat;
  RETURN_IF_ERROR(ParseMessages(f, j, &r));
  RETURN_IF_ERROR(ParseCommon(f, &r));

  std::optional<int64_t> i;
  RETURN_IF_ERROR(f.Int("max_tokens", 1, 1 << 30, &i));
  std::optional<int64_t> mct;
  RETURN_IF_ERROR(f.Int("max_completion_tokens", 1, 1 << 30, &mct));
  if (mct) i = mct;  // the newer name wins
  if (i) r.max_tokens = static_cast<int>(*i);
  RETURN_IF_ERROR(CheckMinTokens(f, r));

  bool logprobs = false;
  RETURN_IF_ERROR(f.Bool("logprobs", &logprobs));
  std::optional<int64_t> top;
  RETURN_IF_ERROR(f.Int("top_logprobs", 0, 20, &top));
  if (top && !logprobs) return f.Fail("top_logprobs", "'top_logprobs' requires 'logprobs': true");
  r.sampling.logprobs = logprobs ? static_cast<int>(top.value_or(0)) : -1;
  return r;
}

StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body, std::string* error_param) {
  ASSIGN_OR_RETURN(json j, ParseBody(body, error_param));
  Fields f(j, error_param);
  OpenAiRequest r;
  r.kind = ApiKind::kCompletion;
  RETURN_IF_ERROR(ParsePrompt(f, &r));
  RETURN_IF_ERROR(ParseCommon(f, &r));

  std::optional<int64_t> i;
  RETURN_IF_ERROR(f.Int("max_tokens", 1, 1 << 30, &i));
  if (i) r.max_tokens = static_cast<int>(*i);
  RETURN_IF_ERROR(CheckMinTokens(f, r));

  std::optional<int64_t> lp;
  RETURN_IF_ERROR(f.Int("logprobs", 0, 20, &lp));
  r.sampling.logprobs = lp ? static_cast<int>(*lp) : -1;
  bool echo = false;
  RETURN_IF_ERROR(f.Bool("echo", &echo));
  if (echo) return f.Fail("echo", "'echo' is not supported");
  if (f.Get("suffix") != nullptr) return f.Fail("suffix", "'suffix' is not supported");
  return r;
}

// ---- errors ----

int HttpStatusFromCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return 400;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

ApiError ApiErrorFromStatus(const Status& s, std::string param) {
  ApiError e;
  e.status = HttpStatusFromCode(s.code());
  e.message = s.message();
  e.param = std::move(param);
  return e;
}

std::string ErrorJson(const ApiError& e) {
  ojson err;
  err["message"] = e.message;
  err["type"] = !e.type.empty() ? e.type : (e.status >= 500 ? "server_error" : "invalid_request_error");
  err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  err["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  ojson out;
  out["error"] = std::move(err);
  return out.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string OpenAiErrorBody(int status, std::string_view message) {
  ApiError e;
  e.status = status;
  e.message = std::string(message);
  if (status == 404) e.code = "not_found";
  if (status == 405) e.code = "method_not_allowed";
  if (status == 413) e.code = "request_too_large";
  return ErrorJson(e);
}

// ---- responses ----
namespace {

ojson FinishJson(FinishReason f) {
  return f == FinishReason::kNone ? ojson(nullptr) : ojson(FinishReasonName(f));
}

// -inf (a token of probability 0 under top-k/top-p) has no JSON form; vLLM's convention.
double SafeLogprob(float lp) {
  return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0;
}

ojson Bytes(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

ojson ChatLogprobsJson(const std::vector<TokenLogprobText>& lps) {
  ojson content = ojson::array();
  for (const auto& t : lps) {
    ojson e;
    e["token"] = t.token;
    e["logprob"] = SafeLogprob(t.logprob);
    e["bytes"] = Bytes(t.token);
    ojson top = ojson::array();
    for (const auto& [tok, lp] : t.top) {
      ojson a;
      a["token"] = tok;
      a["logprob"] = SafeLogprob(lp);
      a["bytes"] = Bytes(tok);
      top.push_back(std::move(a));
    }
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  ojson out;
  out["content"] = std::move(content);
  return out;
}

ojson CompletionLogprobsJson(const std::vector<TokenLogprobText>& lps, size_t text_offset) {
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  size_t off = text_offset;
  for (const auto& t : lps) {
    tokens.push_back(t.token);
    token_lps.push_back(SafeLogprob(t.logprob));
    ojson top = ojson::object();
    for (const auto& [tok, lp] : t.top) top[tok] = SafeLogprob(lp);
    tops.push_back(std::move(top));
    offsets.push_back(off);
    off += t.token.size();
  }
  ojson out;
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(token_lps);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

ojson UsageJson(const UsageCounts& u) {
  ojson out;
  out["prompt_tokens"] = u.prompt_tokens;
  out["completion_tokens"] = u.completion_tokens;
  out["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  ojson details;
  details["cached_tokens"] = u.cached_tokens;
  out["prompt_tokens_details"] = std::move(details);
  return out;
}

ojson Head(const ResponseHeader& h, const char* object) {
  ojson out;
  out["id"] = h.id;
  out["object"] = object;
  out["created"] = h.created;
  out["model"] = h.model;
  return out;
}

std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

std::string ChatCompletionJson(const ResponseHeader& h, std::string_view text, FinishReason finish,
                               const std::vector<TokenLogprobText>* logprobs, const UsageCounts& usage) {
  ojson out = Head(h, "chat.completion");
  ojson choice;
  choice["index"] = 0;
  ojson message;
  message["role"] = "assistant";
  message["content"] = std::string(text);
  choice["message"] = std::move(message);
  choice["logprobs"] = logprobs ? ChatLogprobsJson(*logprobs) : ojson(nullptr);
  choice["finish_reason"] = FinishJson(finish);
  out["choices"] = ojson::array({std::move(choice)});
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string CompletionJson(const ResponseHeader& h, std::string_view text, FinishReason finish,
                           const std::vector<TokenLogprobText>* logprobs, const UsageCounts& usage) {
  ojson out = Head(h, "text_completion");
  ojson choice;
  choice["index"] = 0;
  choice["text"] = std::string(text);
  choice["logprobs"] = logprobs ? CompletionLogprobsJson(*logprobs, 0) : ojson(nullptr);
  choice["finish_reason"] = FinishJson(finish);
  out["choices"] = ojson::array({std::move(choice)});
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string ChatChunkJson(const ResponseHeader& h, std::optional<std::string_view> role,
                          std::optional<std::string_view> content,
                          const std::vector<TokenLogprobText>* logprobs, FinishReason finish,
                          bool usage_null) {
  ojson out = Head(h, "chat.completion.chunk");
  ojson choice;
  choice["index"] = 0;
  ojson delta = ojson::object();
  if (role) delta["role"] = std::string(*role);
  if (content) delta["content"] = std::string(*content);
  choice["delta"] = std::move(delta);
  choice["logprobs"] = logprobs ? ChatLogprobsJson(*logprobs) : ojson(nullptr);
  choice["finish_reason"] = FinishJson(finish);
  out["choices"] = ojson::array({std::move(choice)});
  if (usage_null) out["usage"] = nullptr;
  return Dump(out);
}

std::string CompletionChunkJson(const ResponseHeader& h, std::string_view text,
                                const std::vector<TokenLogprobText>* logprobs, size_t text_offset,
                                FinishReason finish, bool usage_null) {
  ojson out = Head(h, "text_completion");
  ojson choice;
  choice["index"] = 0;
  choice["text"] = std::string(text);
  choice["logprobs"] = logprobs ? CompletionLogprobsJson(*logprobs, text_offset) : ojson(nullptr);
  choice["finish_reason"] = FinishJson(finish);
  out["choices"] = ojson::array({std::move(choice)});
  if (usage_null) out["usage"] = nullptr;
  return Dump(out);
}

std::string UsageChunkJson(const ResponseHeader& h, ApiKind kind, const UsageCounts& usage) {
  ojson out = Head(h, kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = ojson::array();
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string SseData(std::string_view json_text) {
  return fmt::format("data: {}\n\n", json_text);
}

std::string ModelListJson(const std::string& model, int64_t created, int max_model_len) {
  ojson m;
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "stoke";
  m["max_model_len"] = max_model_len;
  ojson out;
  out["object"] = "list";
  out["data"] = ojson::array({std::move(m)});
  return Dump(out);
}

std::string ModelListJson(const std::vector<ModelListEntry>& models, int64_t created) {
  ojson data = ojson::array();
  for (const ModelListEntry& e : models) {
    ojson m;
    m["id"] = e.id;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "stoke";
    if (e.max_model_len > 0) m["max_model_len"] = e.max_model_len;
    data.push_back(std::move(m));
  }
  ojson out;
  out["object"] = "list";
  out["data"] = std::move(data);
  return Dump(out);
}

}  // namespace stoke
