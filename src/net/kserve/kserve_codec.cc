#include "net/kserve/kserve_codec.h"

#include <fmt/format.h>

#include <charconv>
#include <cstring>
#include <limits>

namespace stoke {
namespace {

using nlohmann::json;

template <typename T>
void AppendPod(T v, std::string* out) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
Status AppendInt(const json& v, std::string* out, std::string_view what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return InvalidArgumentError("{}: {} is out of range", what, u);
    }
    AppendPod(static_cast<T>(u), out);
    return OkStatus();
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (i > 0 && static_cast<uint64_t>(i) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return InvalidArgumentError("{}: {} is out of range", what, i);
    }
    AppendPod(static_cast<T>(i), out);
    return OkStatus();
  }
  return InvalidArgumentError("{}: expected an integer, got {}", what, v.dump());
}

// Appends one JSON element of `type` in binary form.
Status AppendElement(const json& v, TensorType type, std::string* out, std::string_view what) {
  switch (type) {
    case TensorType::kBool:
      if (!v.is_boolean()) return InvalidArgumentError("{}: expected true or false, got {}", what, v.dump());
      out->push_back(v.get<bool>() ? 1 : 0);
      return OkStatus();
    case TensorType::kUint8:
      return AppendInt<uint8_t>(v, out, what);
    case TensorType::kUint16:
      return AppendInt<uint16_t>(v, out, what);
    case TensorType::kUint32:
      return AppendInt<uint32_t>(v, out, what);
    case TensorType::kUint64:
      return AppendInt<uint64_t>(v, out, what);
    case TensorType::kInt8:
      return AppendInt<int8_t>(v, out, what);
    case TensorType::kInt16:
      return AppendInt<int16_t>(v, out, what);
    case TensorType::kInt32:
      return AppendInt<int32_t>(v, out, what);
    case TensorType::kInt64:
      return AppendInt<int64_t>(v, out, what);
    case TensorType::kFp32:
    case TensorType::kFp64:
      if (!v.is_number()) return InvalidArgumentError("{}: expected a number, got {}", what, v.dump());
      if (type == TensorType::kFp32) {
        AppendPod(v.get<float>(), out);
      } else {
        AppendPod(v.get<double>(), out);
      }
      return OkStatus();
    case TensorType::kBytes:
      if (!v.is_string()) return InvalidArgumentError("{}: expected a string, got {}", what, v.dump());
      AppendBytesElement(v.get_ref<const std::string&>(), out);
      return OkStatus();
    case TensorType::kFp16:
    case TensorType::kBf16:
      break;
  }
  return InvalidArgumentError("{}: {} has no JSON form; send it as binary data", what, TensorTypeName(type));
}

// Flattens nested arrays (row-major) into binary elements; *count += elements seen.
Status FlattenData(const json& data, TensorType type, std::string* out, int64_t* count, std::string_view what,
                   int depth = 0) {
  if (depth > 64) return InvalidArgumentError("{}: data is nested too deeply", what);
  if (data.is_array()) {
    for (const json& e : data) RETURN_IF_ERROR(FlattenData(e, type, out, count, what, depth + 1));
    return OkStatus();
  }
  ++*count;
  return AppendElement(data, type, out, what);
}

StatusOr<std::vector<int64_t>> ParseShape(const json& j, std::string_view what) {
  if (!j.is_array()) return InvalidArgumentError("{}: 'shape' must be a list of non-negative integers", what);
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return InvalidArgumentError("{}: 'shape' must be a list of non-negative integers, got {}", what,
                                  j.dump());
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

StatusOr<int64_t> IntParam(const json& v, std::string_view name) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    int64_t x = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec == std::errc() && p == s.data() + s.size()) return x;
  }
  return InvalidArgumentError("parameter '{}' must be an integer, got {}", name, v.dump());
}

Status ParseRequestParameters(const json& params, RestInferRequest* r) {
  if (!params.is_object()) return InvalidArgumentError("'parameters' must be an object");
  for (const auto& [key, v] : params.items()) {
    if (key == "binary_data_output") {
      if (!v.is_boolean())
        return InvalidArgumentError("parameter 'binary_data_output' must be true or false");
      r->binary_data_output = v.get<bool>();
    } else if (key == "priority") {
      ASSIGN_OR_RETURN(int64_t p, IntParam(v, key));
      if (p < 0 || p > (1 << 20)) return InvalidArgumentError("parameter 'priority' {} is out of range", p);
      r->priority = static_cast<int>(p);
    } else if (key == "timeout") {
      ASSIGN_OR_RETURN(int64_t t, IntParam(v, key));
      if (t < 0) return InvalidArgumentError("parameter 'timeout' must be >= 0 microseconds");
      r->timeout_us = t;
    } else if (key == "sequence_id" || key == "sequence_start" || key == "sequence_end") {
      // A feature this server lacks (sequence batching, shared memory, classification) is answered 400: the
      // request cannot be served as sent, and a 5xx would read as a server fault.
      return InvalidArgumentError("parameter '{}': sequence batching is not supported", key);
    } else if (key.starts_with("shared_memory_")) {
      return InvalidArgumentError("parameter '{}': shared memory is not supported", key);
    }
    // Anything else is a custom parameter for the model (the parameters extension); ours take none.
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::optional<size_t>> ParseHeaderLength(std::string_view value) {
  if (value.empty()) return std::optional<size_t>();
  size_t n = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || p != value.data() + value.size()) {
    return InvalidArgumentError("Inference-Header-Content-Length '{}' is not a byte count", value);
  }
  return std::optional<size_t>(n);
}

StatusOr<RestInferRequest> ParseRestInferRequest(std::string_view body, std::optional<size_t> header_length) {
  const size_t json_len = header_length.value_or(body.size());
  if (json_len > body.size()) {
    return InvalidArgumentError("Inference-Header-Content-Length {} exceeds the body's {} bytes", json_len,
                                body.size());
  }
  json j = json::parse(body.substr(0, json_len), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("the request's JSON header is not valid JSON");
  if (!j.is_object()) return InvalidArgumentError("the inference request must be a JSON object");
  RestInferRequest r;
  if (j.contains("id")) {
    if (!j["id"].is_string()) return InvalidArgumentError("'id' must be a string");
    r.id = j["id"].get<std::string>();
  }
  if (j.contains("parameters")) RETURN_IF_ERROR(ParseRequestParameters(j["parameters"], &r));
  if (!j.contains("inputs") || !j["inputs"].is_array()) {
    return InvalidArgumentError("'inputs' must be a list of tensors");
  }
  size_t binary_pos = json_len;
  for (size_t i = 0; i < j["inputs"].size(); ++i) {
    const json& in = j["inputs"][i];
    if (!in.is_object()) return InvalidArgumentError("inputs[{}] must be an object", i);
    if (!in.contains("name") || !in["name"].is_string()) {
      return InvalidArgumentError("inputs[{}]: 'name' must be a string", i);
    }
    InferTensor t;
    t.name = in["name"].get<std::string>();
    const std::string what = fmt::format("input '{}'", t.name);
    if (!in.contains("datatype") || !in["datatype"].is_string()) {
      return InvalidArgumentError("{}: 'datatype' must be a string", what);
    }
    auto type = ParseTensorType(in["datatype"].get<std::string>());
    if (!type)
      return InvalidArgumentError("{}: unknown datatype '{}'", what, in["datatype"].get<std::string>());
    t.type = *type;
    if (!in.contains("shape")) return InvalidArgumentError("{}: 'shape' is missing", what);
    ASSIGN_OR_RETURN(t.shape, ParseShape(in["shape"], what));
    const int64_t count = ShapeElementCount(t.shape);
    if (count < 0) return InvalidArgumentError("{}: shape {} is too large", what, ShapeString(t.shape));
    std::optional<int64_t> binary_size;
    if (in.contains("parameters")) {
      const json& p = in["parameters"];
      if (!p.is_object()) return InvalidArgumentError("{}: 'parameters' must be an object", what);
      for (const auto& [key, v] : p.items()) {
        if (key == "binary_data_size") {
          if (!v.is_number_integer() || v.get<int64_t>() < 0) {
            return InvalidArgumentError("{}: binary_data_size must be a non-negative integer", what);
          }
          binary_size = v.get<int64_t>();
        } else if (key.starts_with("shared_memory_")) {
          return InvalidArgumentError("{}: shared memory is not supported", what);
        }
      }
    }
    if (binary_size) {
      if (in.contains("data")) return InvalidArgumentError("{}: has both binary_data_size and 'data'", what);
      if (!header_length) {
        return InvalidArgumentError(
            "{}: binary_data_size given but the Inference-Header-Content-Length header "
            "is missing",
            what);
      }
      if (static_cast<uint64_t>(*binary_size) > body.size() - binary_pos) {
        return InvalidArgumentError("{}: binary_data_size {} but only {} bytes of binary data remain", what,
                                    *binary_size, body.size() - binary_pos);
      }
      t.data.assign(body.substr(binary_pos, *binary_size));
      binary_pos += *binary_size;
      RETURN_IF_ERROR(CheckTensorBytes(t.type, t.data, count, what));
    } else {
      if (!in.contains("data")) return InvalidArgumentError("{}: 'data' is missing", what);
      int64_t seen = 0;
      const size_t size = TensorTypeSize(t.type);
      if (size > 0 && count > 0) t.data.reserve(static_cast<size_t>(count) * size);
      RETURN_IF_ERROR(FlattenData(in["data"], t.type, &t.data, &seen, what));
      if (seen != count) {
        return InvalidArgumentError("{}: 'data' has {} elements but shape {} needs {}", what, seen,
                                    ShapeString(t.shape), count);
      }
    }
    r.inputs.push_back(std::move(t));
  }
  if (binary_pos != body.size()) {
    return InvalidArgumentError("{} bytes of binary data follow the JSON header but no input claims them",
                                body.size() - binary_pos);
  }
  if (j.contains("outputs")) {
    if (!j["outputs"].is_array()) return InvalidArgumentError("'outputs' must be a list");
    for (const json& o : j["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) {
        return InvalidArgumentError("each requested output needs a 'name' string");
      }
      RequestedOutput ro;
      ro.name = o["name"].get<std::string>();
      if (o.contains("parameters")) {
        const json& p = o["parameters"];
        if (!p.is_object())
          return InvalidArgumentError("output '{}': 'parameters' must be an object", ro.name);
        for (const auto& [key, v] : p.items()) {
          if (key == "binary_data") {
            if (!v.is_boolean())
              return InvalidArgumentError("output '{}': binary_data must be a boolean", ro.name);
            ro.binary = v.get<bool>();
          } else if (key == "classification") {
            return InvalidArgumentError("output '{}': classification is not supported", ro.name);
          } else if (key.starts_with("shared_memory_")) {
            return InvalidArgumentError("output '{}': shared memory is not supported", ro.name);
          }
        }
      }
      r.outputs.push_back(std::move(ro));
    }
  }
  return r;
}

StatusOr<RestInferRequest> ParseRawBinaryRequest(std::string_view body, const ModelSignature& sig,
                                                 int max_batch_size) {
  if (sig.inputs.size() != 1) {
    return InvalidArgumentError(
        "a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
        "one input; this one has {}",
        sig.inputs.size());
  }
  const TensorSpec& s = sig.inputs[0];
  InferTensor t;
  t.name = s.name;
  t.type = s.type;
  if (max_batch_size > 0) t.shape.push_back(1);
  if (s.type == TensorType::kBytes) {
    if (s.dims != std::vector<int64_t>{1}) {
      return InvalidArgumentError("input '{}': raw binary BYTES needs shape [1]", s.name);
    }
    t.shape.push_back(1);
  } else {
    int variable = -1;
    int64_t fixed = 1;
    for (size_t i = 0; i < s.dims.size(); ++i) {
      if (s.dims[i] < 0) {
        if (variable >= 0) {
          return InvalidArgumentError("input '{}': a raw binary request cannot fill two variable dims",
                                      s.name);
        }
        variable = static_cast<int>(i);
      } else {
        fixed *= s.dims[i];
      }
    }
    const int64_t elems = static_cast<int64_t>(body.size()) / TensorTypeSize(s.type);
    for (size_t i = 0; i < s.dims.size(); ++i) {
      t.shape.push_back(static_cast<int>(i) == variable ? (fixed > 0 ? elems / fixed : 0) : s.dims[i]);
    }
  }
  t.data.assign(body);
  RETURN_IF_ERROR(CheckTensorBytes(t.type, t.data, t.NumElements(), fmt::format("input '{}'", s.name)));
  RestInferRequest r;
  r.inputs.push_back(std::move(t));
  r.binary_data_output = true;
  return r;
}

StatusOr<std::string> TensorDataJson(const InferTensor& t) {
  std::string out = "[";
  const int64_t n = t.NumElements();
  const char* p = t.data.data();
  auto sep = [&](int64_t i) {
    if (i) out += ',';
  };
  switch (t.type) {
    case TensorType::kFp32:
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + i * 4, 4);
        sep(i);
        fmt::format_to(std::back_inserter(out), "{}", v);
      }
      break;
    case TensorType::kFp64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + i * 8, 8);
        sep(i);
        fmt::format_to(std::back_inserter(out), "{}", v);
      }
      break;
    case TensorType::kBytes: {
      int64_t i = 0;
      for (std::string_view s : SplitBytesElements(t.data)) {
        sep(i++);
        out += json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
      }
      break;
    }
    case TensorType::kFp16:
    case TensorType::kBf16:
      return InvalidArgumentError("output '{}': {} has no JSON form; request it with binary_data", t.name,
                                  TensorTypeName(t.type));
    default: {
      const int size = TensorTypeSize(t.type);
      for (int64_t i = 0; i < n; ++i) {
        sep(i);
        const char* e = p + i * size;
        switch (t.type) {
          case TensorType::kBool:
            out += *e ? "true" : "false";
            break;
          case TensorType::kUint8:
            fmt::format_to(std::back_inserter(out), "{}", *reinterpret_cast<const uint8_t*>(e));
            break;
          case TensorType::kInt8:
            fmt::format_to(std::back_inserter(out), "{}", *reinterpret_cast<const int8_t*>(e));
            break;
          default: {
            // Wider integers: copy out to stay aligned.
            int64_t sv = 0;
            uint64_t uv = 0;
            switch (t.type) {
              case TensorType::kUint16: {
                uint16_t x;
                std::memcpy(&x, e, 2);
                uv = x;
                break;
              }
              case TensorType::kUint32: {
                uint32_t x;
                std::memcpy(&x, e, 4);
                uv = x;
                break;
              }
              case TensorType::kUint64: {
                std::memcpy(&uv, e, 8);
                break;
              }
              case TensorType::kInt16: {
                int16_t x;
                std::memcpy(&x, e, 2);
                sv = x;
                break;
              }
              case TensorType::kInt32: {
                int32_t x;
                std::memcpy(&x, e, 4);
                sv = x;
                break;
              }
              case TensorType::kInt64: {
                std::memcpy(&sv, e, 8);
                break;
              }
              default:
                break;
            }
            const bool is_unsigned = t.type == TensorType::kUint16 || t.type == TensorType::kUint32 ||
                                     t.type == TensorType::kUint64;
            if (is_unsigned) {
              fmt::format_to(std::back_inserter(out), "{}", uv);
            } else {
              fmt::format_to(std::back_inserter(out), "{}", sv);
            }
          }
        }
      }
    }
  }
  out += ']';
  return out;
}

StatusOr<RestInferResponse> EncodeRestInferResponse(const std::string& model_name, const std::string& version,
                                                    const RestInferRequest& request,
                                                    std::vector<InferTensor> outputs) {
  // Which outputs, in which order, binary or not.
  std::vector<std::pair<InferTensor*, bool>> chosen;
  if (request.outputs.empty()) {
    for (InferTensor& t : outputs) chosen.emplace_back(&t, request.binary_data_output);
  } else {
    for (const RequestedOutput& ro : request.outputs) {
      InferTensor* found = nullptr;
      for (InferTensor& t : outputs) {
        if (t.name == ro.name) found = &t;
      }
      if (found == nullptr) return InvalidArgumentError("unexpected inference output '{}'", ro.name);
      chosen.emplace_back(found, ro.binary.value_or(request.binary_data_output));
    }
  }
  std::string head = "{";
  fmt::format_to(std::back_inserter(head), "\"model_name\":{},\"model_version\":{}", json(model_name).dump(),
                 json(version).dump());
  if (request.id) fmt::format_to(std::back_inserter(head), ",\"id\":{}", json(*request.id).dump());
  head += ",\"outputs\":[";
  std::string binary;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const InferTensor& t = *chosen[i].first;
    if (i) head += ',';
    fmt::format_to(std::back_inserter(head), "{{\"name\":{},\"datatype\":\"{}\",\"shape\":[{}]",
                   json(t.name).dump(), TensorTypeName(t.type), fmt::join(t.shape, ","));
    if (chosen[i].second) {
      fmt::format_to(std::back_inserter(head), ",\"parameters\":{{\"binary_data_size\":{}}}}}",
                     t.data.size());
      binary += t.data;
    } else {
      ASSIGN_OR_RETURN(std::string data, TensorDataJson(t));
      head += ",\"data\":";
      head += data;
      head += '}';
    }
  }
  head += "]}";
  RestInferResponse r;
  if (!binary.empty() || std::any_of(chosen.begin(), chosen.end(), [](const auto& c) { return c.second; })) {
    r.header_length = head.size();
    r.body = std::move(head);
    r.body += binary;
  } else {
    r.body = std::move(head);
  }
  return r;
}

std::string KserveErrorBody(std::string_view message) {
  return json{{"error", std::string(message)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnavailable:
    case StatusCode::kResourceExhausted:
      return 503;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kInternal:
    case StatusCode::kDataLoss:
      return 500;
    default:
      return 400;
  }
}

}  // namespace stoke
