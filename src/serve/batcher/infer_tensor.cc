#include "serve/batcher/infer_tensor.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>

namespace stoke {
namespace {

struct TypeRow {
  TensorType type;
  std::string_view name;
  std::string_view config_name;
  int size;
};

constexpr TypeRow kTypes[] = {
    {TensorType::kBool, "BOOL", "TYPE_BOOL", 1},       {TensorType::kUint8, "UINT8", "TYPE_UINT8", 1},
    {TensorType::kUint16, "UINT16", "TYPE_UINT16", 2}, {TensorType::kUint32, "UINT32", "TYPE_UINT32", 4},
    {TensorType::kUint64, "UINT64", "TYPE_UINT64", 8}, {TensorType::kInt8, "INT8", "TYPE_INT8", 1},
    {TensorType::kInt16, "INT16", "TYPE_INT16", 2},    {TensorType::kInt32, "INT32", "TYPE_INT32", 4},
    {TensorType::kInt64, "INT64", "TYPE_INT64", 8},    {TensorType::kFp16, "FP16", "TYPE_FP16", 2},
    {TensorType::kBf16, "BF16", "TYPE_BF16", 2},       {TensorType::kFp32, "FP32", "TYPE_FP32", 4},
    {TensorType::kFp64, "FP64", "TYPE_FP64", 8},       {TensorType::kBytes, "BYTES", "TYPE_STRING", 0},
};

const TypeRow& Row(TensorType t) {
  return kTypes[static_cast<int>(t)];
}

}  // namespace

std::string_view TensorTypeName(TensorType t) {
  return Row(t).name;
}
std::string_view TensorTypeConfigName(TensorType t) {
  return Row(t).config_name;
}
int TensorTypeSize(TensorType t) {
  return Row(t).size;
}

std::optional<TensorType> ParseTensorType(std::string_view name) {
  for (const TypeRow& r : kTypes) {
    if (r.name == name) return r.type;
  }
  return std::nullopt;
}

int64_t ShapeElementCount(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t InferTensor::NumElements() const {
  return ShapeElementCount(shape);
}

Status CheckTensorBytes(TensorType type, std::string_view data, int64_t count, std::string_view what) {
  if (count < 0) return InvalidArgumentError("{}: invalid shape", what);
  if (type != TensorType::kBytes) {
    const int64_t size = TensorTypeSize(type);
    if (count > std::numeric_limits<int64_t>::max() / size ||
        static_cast<int64_t>(data.size()) != count * size) {
      return InvalidArgumentError("{}: {} bytes of data, but the shape needs {} elements of {} ({} bytes)",
                                  what, data.size(), count, TensorTypeName(type), count * size);
    }
    return OkStatus();
  }
  size_t pos = 0;
  int64_t n = 0;
  while (pos < data.size()) {
    if (data.size() - pos < 4) {
      return InvalidArgumentError("{}: BYTES element {} has a truncated length prefix", what, n);
    }
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);  // little-endian host (x86-64, aarch64)
    pos += 4;
    if (data.size() - pos < len) {
      return InvalidArgumentError("{}: BYTES element {} claims {} bytes but only {} remain", what, n, len,
                                  data.size() - pos);
    }
    pos += len;
    ++n;
  }
  if (n != count) {
    return InvalidArgumentError("{}: {} BYTES elements in the data, but the shape needs {}", what, n, count);
  }
  return OkStatus();
}

void AppendBytesElement(std::string_view element, std::string* data) {
  const uint32_t len = static_cast<uint32_t>(element.size());
  char prefix[4];
  std::memcpy(prefix, &len, 4);
  data->append(prefix, 4);
  data->append(element);
}

std::vector<std::string_view> SplitBytesElements(std::string_view data) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos + 4 <= data.size()) {
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    pos += 4;
    if (data.size() - pos < len) break;
    out.push_back(data.substr(pos, len));
    pos += len;
  }
  return out;
}

}  // namespace stoke
