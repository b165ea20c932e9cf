// Element types of weights and tensors: plain (F32, I64, ...) and GGML block-quantised (Q4_1, Q8_0, ...).
// Shared by loaders, kernels and the network codecs, so it lives below all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace stoke {

// Storage types a weight can have on disk. Quantised types store blocks of `block_elems` values in
// `block_bytes` bytes along the innermost (contiguous) dimension; plain types have block_elems == 1.
enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64,
  kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool,
  kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kQ4_K, kQ6_K,
  // fp8 E4M3 ("e4m3fn": no infinities, 0x7f / 0xff are NaN, largest finite 448), one byte per value. Only
  // pre-quantised FP8 checkpoints (safetensors "F8_E4M3") hold it, beside their scale tensors; the values of
  // the type alone are unscaled (docs/precision.md, "Pre-quantised FP8 checkpoints").
  kF8E4M3,
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

}  // namespace stoke
