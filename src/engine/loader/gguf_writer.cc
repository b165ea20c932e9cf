#include "engine/loader/gguf_writer.h"

#include "base/file_util.h"

namespace stoke {

std::string GgufWriter::EncodeString(std::string_view s) {
  return EncodePod<uint64_t>(s.size()) + std::string(s);
}

std::string GgufWriter::EncodeArrayHeader(GgufType elem, uint64_t count) {
  return EncodePod(static_cast<uint32_t>(elem)) + EncodePod(count);
}

GgufWriter& GgufWriter::AddRawTyped(std::string_view key, uint32_t type, std::string payload) {
  kv_bytes_ += EncodeString(key) + EncodePod(type) + payload;
  ++kv_count_;
  return *this;
}

GgufWriter& GgufWriter::AddRaw(std::string_view key, GgufType type, std::string payload) {
  return AddRawTyped(key, static_cast<uint32_t>(type), std::move(payload));
}

GgufWriter& GgufWriter::AddScalar(std::string_view key, GgufType type, const void* v, size_t n) {
  return AddRaw(key, type, std::string(static_cast<const char*>(v), n));
}

GgufWriter& GgufWriter::AddBool(std::string_view key, bool v) {
  const uint8_t b = v ? 1 : 0;
  return AddScalar(key, GgufType::kBool, &b, 1);
}

GgufWriter& GgufWriter::AddString(std::string_view key, std::string_view v) {
  return AddRaw(key, GgufType::kString, EncodeString(v));
}

GgufWriter& GgufWriter::AddStringArray(std::string_view key, const std::vector<std::string>& v) {
  std::string payload = EncodeArrayHeader(GgufType::kString, v.size());
  for (const std::string& s : v) payload += EncodeString(s);
  return AddRaw(key, GgufType::kArray, std::move(payload));
}

GgufWriter& GgufWriter::AddBoolArray(std::string_view key, const std::vector<bool>& v) {
  std::string payload = EncodeArrayHeader(GgufType::kBool, v.size());
  for (bool b : v) payload += static_cast<char>(b ? 1 : 0);
  return AddRaw(key, GgufType::kArray, std::move(payload));
}

GgufWriter& GgufWriter::AddTensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> ne,
                                  std::string data, std::optional<uint64_t> offset) {
  tensors_.push_back(Tensor{std::string(name), ggml_type, std::move(ne), std::move(data), offset});
  return *this;
}

Status GgufWriter::AddTensor(std::string_view name, DType dtype, std::span<const int64_t> shape,
                             std::string data) {
  ASSIGN_OR_RETURN(uint32_t ggml_type, GgmlTypeFromDType(dtype));
  int64_t numel = 1;
  std::vector<uint64_t> ne;
  for (size_t i = shape.size(); i > 0; --i) {
    if (shape[i - 1] <= 0)
      return InvalidArgumentError("tensor '{}': dimension {} is not positive", name, shape[i - 1]);
    ne.push_back(static_cast<uint64_t>(shape[i - 1]));
    numel *= shape[i - 1];
  }
  const int64_t row = shape.empty() ? 1 : shape.back();
  ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(dtype, row));
  const size_t want = row_bytes * static_cast<size_t>(numel / row);
  if (data.size() != want) {
    return InvalidArgumentError("tensor '{}': {} bytes given, {} {} needs {}", name, data.size(),
                                DTypeName(dtype), fmt::join(shape, "x"), want);
  }
  AddTensor(name, ggml_type, std::move(ne), std::move(data));
  return OkStatus();
}

std::string GgufWriter::Finish() const {
  const auto pad = [&](std::string& s) { s.append((alignment_ - s.size() % alignment_) % alignment_, '\0'); };
  std::string out = "GGUF";
  out += EncodePod(version_);
  out += EncodePod<uint64_t>(tensor_count_override_.value_or(tensors_.size()));
  out += EncodePod<uint64_t>(kv_count_override_.value_or(kv_count_));
  out += kv_bytes_;
  std::string data;
  for (const Tensor& t : tensors_) {
    uint64_t offset;
    if (t.offset) {
      offset = *t.offset;
    } else {
      offset = data.size();
      data += t.data;
      pad(data);  // like gguf-py and ggml, every tensor (the last one too) is padded to the alignment
    }
    out += EncodeString(t.name);
    out += EncodePod(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) out += EncodePod(d);
    out += EncodePod(t.ggml_type);
    out += EncodePod(offset);
  }
  if (!tensors_.empty()) pad(out);
  return out + data;
}

Status GgufWriter::WriteFile(const std::string& path) const {
  return WriteStringToFile(path, Finish());
}

}  // namespace stoke
