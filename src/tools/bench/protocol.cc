#include "tools/bench/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/half.h"
#include "net/grpc/grpc_service.pb.h"

namespace stoke::bench {
namespace {

using nlohmann::json;

constexpr size_t kMaxBufferedBody = size_t{64} << 20;
constexpr size_t kMaxDetail = 200;

std::string Shorten(std::string_view s) {
  std::string out(s.substr(0, kMaxDetail));
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

// The message of an error body: OpenAI {"error": {"message"}}, KServe {"error": "..."}, else the raw text.
std::string ErrorMessage(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto it = j.find("error");
    if (it != j.end()) {
      if (it->is_string()) return Shorten(it->get<std::string>());
      if (it->is_object() && it->contains("message") && (*it)["message"].is_string()) {
        return Shorten((*it)["message"].get<std::string>());
      }
    }
  }
  return Shorten(body);
}

// The members of a top-level JSON object, each value as its raw text, without building a DOM: a response's
// success is judged by which members it has, and a KServe response's outputs (thousands of numbers) need no
// parsing. Strings (with escapes) and nesting are followed exactly; a number or literal is skipped as a run
// of characters. False when the text is not one object (unbalanced, unterminated, trailing bytes).
bool ScanTopLevel(std::string_view t, std::vector<std::pair<std::string_view, std::string_view>>* members) {
  size_t i = 0;
  auto ws = [&] {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  };
  auto string_end = [&](size_t at) -> size_t {  // t[at] == '"'; the index after the closing quote, or npos
    for (size_t j = at + 1; j < t.size(); ++j) {
      if (t[j] == '\\') {
        ++j;
      } else if (t[j] == '"') {
        return j + 1;
      }
    }
    return std::string_view::npos;
  };
  // One value from t[i]; sets i past it.
  auto value = [&]() -> bool {
    if (i >= t.size()) return false;
    if (t[i] == '"') {
      i = string_end(i);
      return i != std::string_view::npos;
    }
    if (t[i] == '{' || t[i] == '[') {
      std::string stack(1, t[i] == '{' ? '}' : ']');
      ++i;
      while (i < t.size() && !stack.empty()) {
        const char c = t[i];
        if (c == '"') {
          i = string_end(i);
          if (i == std::string_view::npos) return false;
          continue;
        }
        if (c == '{' || c == '[') {
          stack.push_back(c == '{' ? '}' : ']');
        } else if (c == '}' || c == ']') {
          if (c != stack.back()) return false;
          stack.pop_back();
        }
        ++i;
      }
      return stack.empty();
    }
    const size_t start = i;  // number or literal
    while (i < t.size() && t[i] != ',' && t[i] != '}' && t[i] != ']' && t[i] != ' ' && t[i] != '\n' &&
           t[i] != '\r' && t[i] != '\t')
      ++i;
    return i > start;
  };
  ws();
  if (i >= t.size() || t[i] != '{') return false;
  ++i;
  ws();
  if (i < t.size() && t[i] == '}') {
    ++i;
  } else {
    while (true) {
      ws();
      if (i >= t.size() || t[i] != '"') return false;
      const size_t kend = string_end(i);
      if (kend == std::string_view::npos) return false;
      const std::string_view key = t.substr(i + 1, kend - i - 2);
      i = kend;
      ws();
      if (i >= t.size() || t[i] != ':') return false;
      ++i;
      ws();
      const size_t vstart = i;
      if (!value()) return false;
      members->emplace_back(key, t.substr(vstart, i - vstart));
      ws();
      if (i < t.size() && t[i] == ',') {
        ++i;
        continue;
      }
      if (i < t.size() && t[i] == '}') {
        ++i;
        break;
      }
      return false;
    }
  }
  ws();
  return i == t.size();
}

// A raw JSON array value with at least one element.
bool NonEmptyArray(std::string_view v) {
  if (v.empty() || v.front() != '[') return false;
  v.remove_prefix(1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\n' || v.front() == '\r' || v.front() == '\t'))
    v.remove_prefix(1);
  return !v.empty() && v.front() != ']';
}

int64_t ElementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= std::max<int64_t>(d, 1);
  return n;
}

template <typename T>
void AppendRaw(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

// One KServe input: JSON data, or raw little-endian bytes for the binary extension. The datatype is resolved
// once, not per element: a 1 MiB UINT8 input took ~90 ms to build element by element (string compares and a
// growing append per byte), which the closed loop counted as the request's latency. Values and their order
// of draws are unchanged.
Status FillKserveInput(const KserveInput& in, const std::string& text, const std::vector<std::string>* bytes,
                       std::mt19937_64& rng, bool binary, json* data, std::string* raw) {
  const int64_t n = ElementCount(in.shape);
  if (n > (int64_t{1} << 26)) return InvalidArgumentError("input '{}': {} elements is too many", in.name, n);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 99);
  const std::string& t = in.datatype;
  *data = json::array();
  enum class Kind { kFloat, kBool, kBytes, kInt };
  Kind kind;
  int width = 0;  // bytes per element in the binary form (floats, bools, ints)
  if (t == "FP32" || t == "FP64" || t == "FP16" || t == "BF16") {
    kind = Kind::kFloat;
    width = t == "FP64" ? 8 : t == "FP32" ? 4 : 2;
  } else if (t == "BOOL") {
    kind = Kind::kBool;
    width = 1;
  } else if (t == "BYTES") {
    kind = Kind::kBytes;
    if (bytes != nullptr && !bytes->empty() && !binary) {
      return InvalidArgumentError("input '{}': BYTES from files need the binary tensor extension", in.name);
    }
  } else if (t.starts_with("INT") || t.starts_with("UINT")) {
    kind = Kind::kInt;
    if (t == "INT8" || t == "UINT8") {
      width = 1;
    } else if (t == "INT16" || t == "UINT16") {
      width = 2;
    } else if (t == "INT32" || t == "UINT32") {
      width = 4;
    } else if (t == "INT64" || t == "UINT64") {
      width = 8;
    } else if (binary && n > 0) {
      return InvalidArgumentError("input '{}': unknown datatype '{}'", in.name, t);
    }
  } else {
    if (n == 0) return OkStatus();
    return InvalidArgumentError("input '{}': unknown datatype '{}'", in.name, t);
  }
  if (binary) {
    raw->reserve(raw->size() + static_cast<size_t>(n) *
                                   (kind == Kind::kBytes ? text.size() + 4 : static_cast<size_t>(width)));
  }
  for (int64_t i = 0; i < n; ++i) {
    switch (kind) {
      case Kind::kFloat: {
        float v = unit(rng);
        if (!binary) {
          data->push_back(v);
        } else if (width == 4) {
          AppendRaw(raw, v);
        } else if (width == 8) {
          AppendRaw(raw, static_cast<double>(v));
        } else if (t == "FP16") {
          AppendRaw(raw, Fp32ToFp16(v));
        } else {
          AppendRaw(raw, Fp32ToBf16(v));
        }
        break;
      }
      case Kind::kBool: {
        bool v = small(rng) < 50;
        if (binary) {
          raw->push_back(static_cast<char>(v));
        } else {
          data->push_back(v);
        }
        break;
      }
      case Kind::kBytes:
        if (bytes != nullptr && !bytes->empty()) {
          const std::string& b = (*bytes)[rng() % bytes->size()];
          AppendRaw(raw, static_cast<uint32_t>(b.size()));
          raw->append(b);
        } else if (binary) {
          AppendRaw(raw, static_cast<uint32_t>(text.size()));
          raw->append(text);
        } else {
          data->push_back(text);
        }
        break;
      case Kind::kInt: {
        int v = small(rng);
        if (!binary) {
          data->push_back(v);
        } else if (width == 1) {
          raw->push_back(static_cast<char>(static_cast<uint8_t>(v)));
        } else if (width == 2) {
          AppendRaw(raw, static_cast<uint16_t>(v));
        } else if (width == 4) {
          AppendRaw(raw, static_cast<uint32_t>(v));
        } else {
          AppendRaw(raw, static_cast<uint64_t>(v));
        }
        break;
      }
    }
  }
  return OkStatus();
}

StatusOr<WireRequest> BuildKserve(const ProtocolOptions& opts, const PromptItem& item, std::mt19937_64& rng) {
  if (opts.model.empty()) return InvalidArgumentError("kserve-http needs --model");
  if (opts.kserve_inputs.empty()) return InvalidArgumentError("kserve-http: the model has no inputs");
  WireRequest w;
  w.target = fmt::format("{}/v2/models/{}/infer", opts.base_path, opts.model);
  json body;
  body["inputs"] = json::array();
  std::string raw;
  for (const KserveInput& in : opts.kserve_inputs) {
    json data;
    size_t before = raw.size();
    RETURN_IF_ERROR(
        FillKserveInput(in, item.text, opts.kserve_bytes.get(), rng, opts.kserve_binary, &data, &raw));
    json t{{"name", in.name}, {"datatype", in.datatype}, {"shape", json::array()}};
    for (int64_t d : in.shape) t["shape"].push_back(std::max<int64_t>(d, 1));
    if (opts.kserve_binary) {
      t["parameters"] = {{"binary_data_size", raw.size() - before}};
    } else {
      t["data"] = std::move(data);
    }
    body["inputs"].push_back(std::move(t));
  }
  w.body = body.dump();
  if (opts.kserve_binary) {
    w.headers.emplace_back("Inference-Header-Content-Length", std::to_string(w.body.size()));
    w.content_type = "application/octet-stream";
    w.body += raw;
  }
  w.input_tokens = 0;  // tensors, not tokens
  return w;
}

StatusOr<WireRequest> BuildKserveGrpc(const ProtocolOptions& opts, const PromptItem& item,
                                      std::mt19937_64& rng) {
  if (opts.model.empty()) return InvalidArgumentError("kserve-grpc needs --model");
  if (opts.kserve_inputs.empty()) return InvalidArgumentError("kserve-grpc: the model has no inputs");
  auto req = std::make_shared<inference::ModelInferRequest>();
  req->set_model_name(opts.model);
  for (const KserveInput& in : opts.kserve_inputs) {
    json unused;
    std::string* raw = req->add_raw_input_contents();
    RETURN_IF_ERROR(
        FillKserveInput(in, item.text, opts.kserve_bytes.get(), rng, /*binary=*/true, &unused, raw));
    auto* t = req->add_inputs();
    t->set_name(in.name);
    t->set_datatype(in.datatype);
    for (int64_t d : in.shape) t->add_shape(std::max<int64_t>(d, 1));
  }
  WireRequest w;
  w.method = "GRPC";
  w.target = "/inference.GRPCInferenceService/ModelInfer";
  w.input_tokens = 0;  // tensors, not tokens
  w.grpc = std::move(req);
  return w;
}

}  // namespace

const char* ApiName(Api api) {
  switch (api) {
    case Api::kOpenAiChat:
      return "openai-chat";
    case Api::kOpenAiCompletions:
      return "openai-completions";
    case Api::kOpenAiEmbeddings:
      return "openai-embeddings";
    case Api::kKserveHttp:
      return "kserve-http";
    case Api::kKserveGrpc:
      return "kserve-grpc";
  }
  return "?";
}

bool ApiStreamsTokens(Api api) {
  return api == Api::kOpenAiChat || api == Api::kOpenAiCompletions;
}

StatusOr<std::vector<KserveInput>> ParseKserveMetadata(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_array()) {
    return InvalidArgumentError("model metadata: expected an object with an 'inputs' array");
  }
  std::vector<KserveInput> out;
  for (const json& in : j["inputs"]) {
    if (!in.is_object() || !in.contains("name") || !in["name"].is_string() || !in.contains("datatype") ||
        !in["datatype"].is_string() || !in.contains("shape") || !in["shape"].is_array()) {
      return InvalidArgumentError("model metadata: each input needs name, datatype and shape");
    }
    KserveInput k{in["name"].get<std::string>(), in["datatype"].get<std::string>(), {}};
    for (const json& d : in["shape"]) {
      if (!d.is_number_integer()) return InvalidArgumentError("model metadata: input '{}' shape", k.name);
      k.shape.push_back(d.get<int64_t>());
    }
    out.push_back(std::move(k));
  }
  return out;
}

StatusOr<WireRequest> BuildRequest(const ProtocolOptions& opts, const PromptItem& item,
                                   std::mt19937_64& rng) {
  if (opts.api == Api::kKserveHttp) return BuildKserve(opts, item, rng);
  if (opts.api == Api::kKserveGrpc) return BuildKserveGrpc(opts, item, rng);
  WireRequest w;
  w.input_tokens = item.input_tokens;
  w.max_tokens = item.max_tokens;
  json body;
  if (!opts.model.empty()) body["model"] = opts.model;
  if (opts.api == Api::kOpenAiEmbeddings) {
    w.target = opts.base_path + "/v1/embeddings";
    body["input"] = item.text;
    w.body = body.dump();
    return w;
  }
  if (opts.api == Api::kOpenAiChat) {
    w.target = opts.base_path + "/v1/chat/completions";
    if (!item.messages_json.empty()) {
      body["messages"] = json::parse(item.messages_json);
    } else {
      body["messages"] = json::array({json{{"role", "user"}, {"content", item.text}}});
    }
  } else {
    w.target = opts.base_path + "/v1/completions";
    if (!item.ids.empty()) {
      body["prompt"] = item.ids;
    } else {
      body["prompt"] = item.text;
    }
  }
  body["max_tokens"] = item.max_tokens;
  if (opts.ignore_eos) {
    body["ignore_eos"] = true;
    body["min_tokens"] = item.max_tokens;
  }
  if (opts.temperature >= 0) body["temperature"] = opts.temperature;
  if (opts.stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  w.body = body.dump();
  return w;
}

void ResponseReader::Fail(std::string kind, std::string detail) {
  if (!error_.empty()) return;
  error_ = std::move(kind);
  error_detail_ = Shorten(detail);
}

void ResponseReader::OnToken(Nanos t) {
  if (tokens_ == 0) {
    first_token_ = t;
  } else {
    itl_ms_.push_back(static_cast<float>((t - last_token_) * 1e-6));
  }
  last_token_ = t;
  ++tokens_;
}

void ResponseReader::OnSseEvent(std::string_view data, Nanos t) {
  if (data == "[DONE]") {
    done_marker_ = true;
    return;
  }
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Fail("bad_stream", fmt::format("not JSON: {}", data));
  if (j.contains("error")) return Fail("stream_error", ErrorMessage(data));
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer()) {
      usage_prompt_ = (*u)["prompt_tokens"].get<int>();
    }
    if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer()) {
      usage_completion_ = (*u)["completion_tokens"].get<int>();
    }
  }
  auto c = j.find("choices");
  if (c == j.end() || !c->is_array() || c->empty() || !(*c)[0].is_object()) return;
  const json& choice = (*c)[0];
  const json* text = nullptr;
  if (api_ == Api::kOpenAiChat) {
    auto d = choice.find("delta");
    if (d != choice.end() && d->is_object()) {
      auto ct = d->find("content");
      if (ct != d->end()) text = &*ct;
    }
  } else {
    auto tx = choice.find("text");
    if (tx != choice.end()) text = &*tx;
  }
  if (text != nullptr && text->is_string() && !text->get_ref<const std::string&>().empty()) OnToken(t);
}

void ResponseReader::OnBody(std::string_view bytes, Nanos t) {
  if (!stream_ || status_ != 200) {
    if (buffer_.size() + bytes.size() <= kMaxBufferedBody) buffer_.append(bytes);
    return;
  }
  // SSE: events end with a blank line; "\r\n" is folded to "\n" as it arrives.
  for (char ch : bytes) {
    if (ch != '\r') buffer_.push_back(ch);
  }
  size_t start = 0;
  while (true) {
    size_t end = buffer_.find("\n\n", start);
    if (end == std::string::npos) break;
    std::string_view event(buffer_.data() + start, end - start);
    std::string data;
    bool has_data = false;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      std::string_view line =
          event.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
      if (line.starts_with("data:")) {
        line.remove_prefix(5);
        if (line.starts_with(' ')) line.remove_prefix(1);
        if (has_data) data += '\n';
        data.append(line);
        has_data = true;
      }
      if (nl == std::string_view::npos) break;
      pos = nl + 1;
    }
    if (has_data) OnSseEvent(data, t);
    start = end + 2;
  }
  buffer_.erase(0, start);
}

void ResponseReader::End(Nanos t) {
  end_ = t;
  if (status_ != 200) return Fail(fmt::format("http_{}", status_), ErrorMessage(buffer_));
  if (api_ == Api::kKserveGrpc) return;  // the gRPC connection checked the decoded response
  if (stream_) {
    if (!done_marker_) Fail("no_done", "the stream ended without data: [DONE]");
    return;
  }
  std::string_view text = buffer_;
  if (json_length_ >= 0 && static_cast<size_t>(json_length_) <= text.size())
    text = text.substr(0, json_length_);
  // Judged by its top-level members, without a DOM (ScanTopLevel): parsing every number of a KServe response
  // was most of the generator's time per request.
  std::vector<std::pair<std::string_view, std::string_view>> members;
  if (!ScanTopLevel(text, &members)) return Fail("bad_json", std::string(text));
  auto member = [&](std::string_view name) -> std::optional<std::string_view> {
    for (const auto& [k, v] : members)
      if (k == name) return v;
    return std::nullopt;
  };
  if (member("error")) return Fail("bad_response", ErrorMessage(buffer_));
  if (std::optional<std::string_view> usage = member("usage")) {
    json u = json::parse(*usage, nullptr, /*allow_exceptions=*/false);
    if (u.is_object()) {
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
        usage_prompt_ = u["prompt_tokens"].get<int>();
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
        usage_completion_ = u["completion_tokens"].get<int>();
    }
  }
  switch (api_) {
    case Api::kOpenAiChat:
    case Api::kOpenAiCompletions: {
      std::optional<std::string_view> c = member("choices");
      if (!c || !NonEmptyArray(*c)) return Fail("bad_response", "no choices");
      first_token_ = t;
      break;
    }
    case Api::kOpenAiEmbeddings: {
      std::optional<std::string_view> d = member("data");
      if (!d || !NonEmptyArray(*d)) return Fail("bad_response", "no embedding data");
      break;
    }
    case Api::kKserveHttp: {
      std::optional<std::string_view> o = member("outputs");
      if (!o || o->empty() || o->front() != '[') return Fail("bad_response", "no outputs");
      break;
    }
    case Api::kKserveGrpc:
      break;
  }
}

void ResponseReader::Finish(RequestRecord* r) const {
  r->done = end_;
  r->first_token = first_token_;
  r->output_tokens = usage_completion_ >= 0 ? usage_completion_ : tokens_;
  if (usage_prompt_ >= 0) r->input_tokens = usage_prompt_;
  r->itl_ms = itl_ms_;
  if (!error_.empty() && r->error.empty()) {
    r->error = error_;
    r->error_detail = error_detail_;
  }
}

}  // namespace stoke::bench
