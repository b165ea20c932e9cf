// Small tensors the CNN engine knows before running: weights, shapes, the results of folding a node whose
// inputs are all known (Shape -> Cast -> Slice -> Concat -> Reshape chains, reshaped biases). Values are
// kept as fp32 (floating ONNX types) or int64 (integer and bool types), row-major, logical ONNX dims.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/onnx/onnx_model.h"

namespace stoke::cnn {

struct ConstTensor {
  std::vector<int64_t> dims;
  bool is_int = false;
  std::vector<float> f;    // !is_int
  std::vector<int64_t> i;  // is_int

  int64_t size() const { return is_int ? static_cast<int64_t>(i.size()) : static_cast<int64_t>(f.size()); }
  double At(int64_t k) const { return is_int ? static_cast<double>(i[k]) : f[k]; }
  static ConstTensor FromOnnx(const onnx::OnnxTensor& t);
};

int64_t NumElements(const std::vector<int64_t>& dims);
std::string DimsString(const std::vector<int64_t>& dims);  // "[1, 3, 224, 224]"
// numpy broadcasting of two shapes; InvalidArgument naming `what` when they do not broadcast.
StatusOr<std::vector<int64_t>> BroadcastDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                             std::string_view what);
// A negative axis counts from the end; InvalidArgument naming `what` when out of [-rank, rank).
StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank, std::string_view what);

// Evaluates `node` on known inputs (nullptr for an omitted optional input). Supports the shape and
// constant ops: Shape, Cast, Slice, Concat, Gather, Unsqueeze, Squeeze, Reshape, Flatten, Identity,
// Add, Sub, Mul, Div, Transpose. Unimplemented for any other op (the caller then runs it at run time or
// refuses it). `opset` selects attribute-vs-input forms (Slice < 10, Squeeze/Unsqueeze < 13).
StatusOr<ConstTensor> FoldNode(const onnx::OnnxNode& node, const std::vector<const ConstTensor*>& inputs,
                               int64_t opset);
// The output dims of Reshape given the input dims and the target (0 = copy, -1 = infer).
StatusOr<std::vector<int64_t>> ReshapeDims(const std::vector<int64_t>& in, const std::vector<int64_t>& target,
                                           bool allowzero, std::string_view what);

}  // namespace stoke::cnn
