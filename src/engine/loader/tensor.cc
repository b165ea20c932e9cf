#include "engine/loader/tensor.h"

namespace stoke {

std::string TensorRef::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace stoke
