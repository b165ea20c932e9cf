// Element types and read-only tensor views shared by every model-file reader (GGUF, safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

// Storage types a weight can have on disk. Quantised types store blocks of `block_elems` values in
// `block_bytes` bytes along the innermost (contiguous) dimension; plain types have block_elems == 1.
enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64,
  kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool,
  kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ6_K,
};

struct DTypeInfo {
  std::string_view name;  // "F32", "Q4_1", ...
  int block_elems;        // values per block (1 for plain types)
  int block_bytes;        // bytes per block
  bool quantized;
};

const DTypeInfo& GetDTypeInfo(DType t);
inline std::string_view DTypeName(DType t) { return GetDTypeInfo(t).name; }

// Bytes for a row of `n` values; fails when n is not a multiple of the block size.
StatusOr<size_t> RowBytes(DType t, int64_t n);

// A tensor inside a mapped model file. Never owns memory; valid while its file is open.
struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  // Outermost first, as PyTorch writes it: a Linear weight is {out_features, in_features}.
  // (GGUF stores ne[] innermost first; the GGUF reader reverses it.)
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.size() <= 1 ? 1 : numel() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }  // innermost dimension
  std::string ShapeString() const;  // "[49152, 576]"
};

}  // namespace stoke
