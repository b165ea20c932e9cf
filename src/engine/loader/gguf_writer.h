// Builds GGUF v2/v3 files in memory: test inputs (also deliberately broken ones), fuzz seeds, and small
// generated models. Layout as in shared/reference/model-formats.md §1; gguf_reader.h reads it back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/loader/gguf_reader.h"

namespace stoke {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // Alignment of the data section and of each tensor. Writes no key: add "general.alignment" (u32) to declare
  // a value other than the default 32.
  void set_alignment(uint32_t alignment) { alignment_ = alignment; }

  GgufWriter& AddU8(std::string_view key, uint8_t v) { return AddScalar(key, GgufType::kU8, &v, 1); }
  GgufWriter& AddI8(std::string_view key, int8_t v) { return AddScalar(key, GgufType::kI8, &v, 1); }
  GgufWriter& AddU16(std::string_view key, uint16_t v) { return AddScalar(key, GgufType::kU16, &v, 2); }
  GgufWriter& AddI16(std::string_view key, int16_t v) { return AddScalar(key, GgufType::kI16, &v, 2); }
  GgufWriter& AddU32(std::string_view key, uint32_t v) { return AddScalar(key, GgufType::kU32, &v, 4); }
  GgufWriter& AddI32(std::string_view key, int32_t v) { return AddScalar(key, GgufType::kI32, &v, 4); }
  GgufWriter& AddF32(std::string_view key, float v) { return AddScalar(key, GgufType::kF32, &v, 4); }
  GgufWriter& AddU64(std::string_view key, uint64_t v) { return AddScalar(key, GgufType::kU64, &v, 8); }
  GgufWriter& AddI64(std::string_view key, int64_t v) { return AddScalar(key, GgufType::kI64, &v, 8); }
  GgufWriter& AddF64(std::string_view key, double v) { return AddScalar(key, GgufType::kF64, &v, 8); }
  GgufWriter& AddBool(std::string_view key, bool v);
  GgufWriter& AddString(std::string_view key, std::string_view v);
  GgufWriter& AddStringArray(std::string_view key, const std::vector<std::string>& v);
  GgufWriter& AddBoolArray(std::string_view key, const std::vector<bool>& v);
  // Arrays of fixed-size numbers; the element type follows T (uint8_t ... int64_t, float, double).
  template <typename T>
  GgufWriter& AddArray(std::string_view key, std::span<const T> v) {
    std::string payload = EncodeArrayHeader(TypeOf<T>(), v.size());
    payload.append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
    return AddRaw(key, GgufType::kArray, std::move(payload));
  }
  template <typename T>
  GgufWriter& AddArray(std::string_view key, const std::vector<T>& v) {
    return AddArray(key, std::span<const T>(v));
  }
  // A value given as its encoded payload (after the type field): nested arrays, odd or broken encodings.
  GgufWriter& AddRaw(std::string_view key, GgufType type, std::string payload);
  // Same, with a type id that need not be valid.
  GgufWriter& AddRawTyped(std::string_view key, uint32_t type, std::string payload);

  // A tensor record. `ne` is innermost first (as stored); `data` is written at the next aligned offset of the
  // data section. With `offset` given, the record says that offset and the data is NOT written (for tests of
  // bad offsets). A record's byte size is not checked here: broken records are allowed.
  GgufWriter& AddTensor(std::string_view name, uint32_t ggml_type, std::vector<uint64_t> ne, std::string data,
                        std::optional<uint64_t> offset = std::nullopt);
  // Convenience: a tensor of a stoke DType with a PyTorch-order (outermost first) shape.
  Status AddTensor(std::string_view name, DType dtype, std::span<const int64_t> shape, std::string data);

  // Overrides the header's counts (to write inconsistent files); nullopt = the real counts.
  void set_count_overrides(std::optional<uint64_t> tensors, std::optional<uint64_t> kvs) {
    tensor_count_override_ = tensors;
    kv_count_override_ = kvs;
  }

  std::string Finish() const;
  Status WriteFile(const std::string& path) const;

  static std::string EncodeString(std::string_view s);
  static std::string EncodeArrayHeader(GgufType elem, uint64_t count);
  template <typename T>
  static std::string EncodePod(const T& v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
  }

 private:
  template <typename T>
  static constexpr GgufType TypeOf() {
    if constexpr (std::is_same_v<T, uint8_t>)
      return GgufType::kU8;
    else if constexpr (std::is_same_v<T, int8_t>)
      return GgufType::kI8;
    else if constexpr (std::is_same_v<T, uint16_t>)
      return GgufType::kU16;
    else if constexpr (std::is_same_v<T, int16_t>)
      return GgufType::kI16;
    else if constexpr (std::is_same_v<T, uint32_t>)
      return GgufType::kU32;
    else if constexpr (std::is_same_v<T, int32_t>)
      return GgufType::kI32;
    else if constexpr (std::is_same_v<T, uint64_t>)
      return GgufType::kU64;
    else if constexpr (std::is_same_v<T, int64_t>)
      return GgufType::kI64;
    else if constexpr (std::is_same_v<T, float>)
      return GgufType::kF32;
    else {
      static_assert(std::is_same_v<T, double>, "unsupported GGUF array element type");
      return GgufType::kF64;
    }
  }
  GgufWriter& AddScalar(std::string_view key, GgufType type, const void* v, size_t n);

  struct Tensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<uint64_t> ne;
    std::string data;
    std::optional<uint64_t> offset;
  };
  uint32_t version_;
  uint32_t alignment_ = 32;
  std::string kv_bytes_;  // encoded metadata records, in order
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
  std::optional<uint64_t> tensor_count_override_, kv_count_override_;
};

}  // namespace stoke
