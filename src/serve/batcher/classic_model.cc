#include "serve/batcher/classic_model.h"

#include <fmt/format.h>

#include <set>

namespace stoke {

StatusOr<int64_t> ValidateInputs(const ModelSignature& sig, int max_batch_size,
                                 const std::vector<InferTensor>& inputs) {
  std::set<std::string> seen;
  for (const InferTensor& t : inputs) {
    if (!seen.insert(t.name).second) return InvalidArgumentError("input '{}' is given twice", t.name);
    bool known = false;
    for (const TensorSpec& s : sig.inputs) known |= s.name == t.name;
    if (!known) {
      std::vector<std::string> names;
      for (const TensorSpec& s : sig.inputs) names.push_back("'" + s.name + "'");
      return InvalidArgumentError("unexpected input '{}': the model's inputs are {}", t.name,
                                  fmt::join(names, ", "));
    }
  }
  int64_t batch = -1;
  std::string batch_from;
  for (const TensorSpec& s : sig.inputs) {
    const InferTensor* t = nullptr;
    for (const InferTensor& x : inputs) {
      if (x.name == s.name) t = &x;
    }
    if (t == nullptr) return InvalidArgumentError("input '{}' is missing", s.name);
    if (t->type != s.type) {
      return InvalidArgumentError("input '{}': datatype {} does not match the model's {}", s.name,
                                  TensorTypeName(t->type), TensorTypeName(s.type));
    }
    const size_t batch_dims = max_batch_size > 0 ? 1 : 0;
    if (t->shape.size() != s.dims.size() + batch_dims) {
      std::vector<int64_t> expected;
      if (batch_dims) expected.push_back(-1);
      expected.insert(expected.end(), s.dims.begin(), s.dims.end());
      return InvalidArgumentError("input '{}': shape {} does not match the model's {}", s.name,
                                  ShapeString(t->shape), ShapeString(expected));
    }
    for (int64_t d : t->shape) {
      if (d < 0)
        return InvalidArgumentError("input '{}': shape {} has a negative dim", s.name, ShapeString(t->shape));
    }
    for (size_t i = 0; i < s.dims.size(); ++i) {
      const int64_t got = t->shape[i + batch_dims];
      if (s.dims[i] >= 0 && got != s.dims[i]) {
        return InvalidArgumentError("input '{}': dim {} is {} but the model needs {}", s.name, i + batch_dims,
                                    got, s.dims[i]);
      }
    }
    if (batch_dims) {
      const int64_t b = t->shape[0];
      if (b < 1) return InvalidArgumentError("input '{}': batch size must be at least 1, got {}", s.name, b);
      if (b > max_batch_size) {
        return InvalidArgumentError("input '{}': batch size {} exceeds the model's max_batch_size {}", s.name,
                                    b, max_batch_size);
      }
      if (batch >= 0 && b != batch) {
        return InvalidArgumentError("input '{}': batch size {} differs from {} of input '{}'", s.name, b,
                                    batch, batch_from);
      }
      batch = b;
      batch_from = s.name;
    }
    RETURN_IF_ERROR(CheckTensorBytes(t->type, t->data, t->NumElements(), fmt::format("input '{}'", s.name)));
  }
  return batch < 0 ? 1 : batch;
}

}  // namespace stoke
