// GGUF model files (v2 and v3): header, typed metadata and tensor records, validated in full before any
// tensor byte is touched; tensors are views into the mmapped file. Layout: shared/reference/model-formats.md
// §1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/dtype.h"
#include "base/file_util.h"
#include "base/status.h"
#include "engine/loader/tensor.h"

namespace stoke {

// GGUF metadata value types (gguf_type).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view GgufTypeName(GgufType t);

// ggml_type id (tensor records) <-> DType. Only the types stoke can compute with map; the removed ids
// (4, 5, 31-33, 36-38), unknown ids and types stoke lacks (Q2_K, Q5_K, IQ*, ...) return nullopt.
std::optional<DType> DTypeFromGgmlType(uint32_t ggml_type);
// Fails for DTypes ggml has no type for (unsigned integers, bool); I8..I64 and F64 map to ids 24..28.
StatusOr<uint32_t> GgmlTypeFromDType(DType t);
// Human name of a ggml type id: "Q2_K", "IQ4_XS", ..., "type 4 (removed Q4_2)", "type 99 (unknown)".
std::string GgmlTypeName(uint32_t ggml_type);

class GgufFile {
 public:
  // Maps `path` and validates the whole file. Errors name the file and the byte/key/tensor at fault:
  // DataLoss for truncation and out-of-file/overlapping data; InvalidArgument for what the format forbids
  // (v1, byte-swapped, bad alignment, absurd dims, removed/unknown types, duplicates); Unimplemented for real
  // ggml types stoke cannot compute with (Q5_K, IQ*, ...).
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a caller-owned buffer without copying it (fuzzing, tests); the buffer must outlive the GgufFile.
  static StatusOr<std::unique_ptr<GgufFile>> FromBuffer(const uint8_t* data, size_t size, std::string name);
  ~GgufFile();

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  size_t data_offset() const { return data_offset_; }  // start of the data section, bytes from file start
  uint32_t alignment() const { return alignment_; }

  bool Has(std::string_view key) const;
  StatusOr<std::string> GetString(
      std::string_view key) const;  // NotFound names the key; wrong type: InvalidArgument
  StatusOr<int64_t> GetInt(std::string_view key) const;   // any integer type or bool (u64 > INT64_MAX fails)
  StatusOr<double> GetFloat(std::string_view key) const;  // f32/f64 (ints accepted)
  StatusOr<bool> GetBool(std::string_view key) const;
  StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(
      std::string_view key) const;  // array of any integer type or bool
  StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;  // array of f32/f64 (ints accepted)
  std::vector<std::string> Keys() const;                                   // in file order
  // Short printable form: scalars as text, strings quoted and cut at ~60 chars, arrays as "[f32 x 49152]".
  std::string ValueSummary(std::string_view key) const;
  // The value's GGUF type (kArray for arrays) and, for arrays, the element type; nullopt if absent.
  std::optional<GgufType> TypeOf(std::string_view key) const;
  std::optional<GgufType> ArrayElementType(std::string_view key) const;
  // Any value as JSON (for dumps and tests): integers exact (u64 stays unsigned), f32 widened to double,
  // bool, string, arrays (nested too) as lists. null if the key is absent. Callers include
  // <nlohmann/json.hpp>.
  nlohmann::json ValueAsJson(std::string_view key) const;

  const std::vector<TensorRef>& tensors() const { return tensors_; }  // shape reversed to outermost-first
  const TensorRef* FindTensor(std::string_view name) const;           // nullptr if absent
  // The tensor's ggml_type id as stored in the file (tensors() carries the mapped DType).
  uint32_t GgmlType(size_t tensor_index) const { return ggml_types_[tensor_index]; }

 private:
  // A parsed metadata value: where it lives in the file (validated, so accessors read it without checks).
  struct Value {
    GgufType type;
    GgufType elem_type;  // arrays only
    uint64_t count;      // arrays only: number of elements
    size_t offset;       // byte offset of the payload (arrays: of the header: element type, count)
  };

  GgufFile() = default;
  Status Parse();
  StatusOr<const Value*> Lookup(std::string_view key) const;

  std::unique_ptr<MappedFile> file_;  // null for FromBuffer
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, Value, std::less<>> values_;
  std::vector<TensorRef> tensors_;
  std::vector<uint32_t> ggml_types_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace stoke
