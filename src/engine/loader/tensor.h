// Element types and read-only tensor views shared by every model-file reader (GGUF, safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke {

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
