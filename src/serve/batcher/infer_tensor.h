// Tensors as the classic (KServe v2 / Triton) APIs carry them: a name, a wire datatype, a shape and the
// elements packed row-major little-endian. BYTES elements are stored in their binary wire form (u32 LE
// length + raw bytes, one after another), which is what HTTP binary data and gRPC raw contents carry, so a
// tensor moves from the wire to the model without re-encoding.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

// KServe v2 datatypes (kserve-v2.md §3).
enum class TensorType : uint8_t {
  kBool,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kBf16,
  kFp32,
  kFp64,
  kBytes,
};

std::string_view TensorTypeName(TensorType t);        // "FP32", "BYTES"
std::string_view TensorTypeConfigName(TensorType t);  // Triton model config: "TYPE_FP32", "TYPE_STRING"
std::optional<TensorType> ParseTensorType(std::string_view name);  // "FP32"; nullopt if unknown
// Bytes per element; 0 for BYTES (variable).
int TensorTypeSize(TensorType t);

struct InferTensor {
  std::string name;
  TensorType type = TensorType::kFp32;
  std::vector<int64_t> shape;  // with the batch dim when the model batches
  std::string data;            // packed elements (BYTES: length-prefixed)

  int64_t NumElements() const;
};

// Product of the dims; -1 when a dim is negative or the product overflows int64.
int64_t ShapeElementCount(std::span<const int64_t> shape);
std::string ShapeString(std::span<const int64_t> shape);  // "[2, 384]"

// Checks that `data` holds exactly `count` elements of `type` (fixed size: the byte count; BYTES: a walk over
// the length prefixes). Errors are InvalidArgument naming `what` (e.g. "input 'text'").
Status CheckTensorBytes(TensorType type, std::string_view data, int64_t count, std::string_view what);

// BYTES helpers. Split assumes CheckTensorBytes passed.
void AppendBytesElement(std::string_view element, std::string* data);
std::vector<std::string_view> SplitBytesElements(std::string_view data);

}  // namespace stoke
