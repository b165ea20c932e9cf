// The CNN engine's graph, built once at load from an ONNX model (engine/onnx/) and shared read-only by
// every instance:
//   1. initializers and Constant nodes become ConstTensors; nodes whose inputs are all constant are folded
//      (a reshaped bias, a Cast of a shape);
//   2. each remaining node becomes a CnnNode of a kind the engine runs (table in docs/images.md), or the
//      load fails naming the node and what is unsupported;
//   3. rewrites: the x * clip(x + 3, 0, 6) / 6 chain becomes one HardSwish; BatchNormalization and a
//      per-channel Add after a Conv fold into its weights and bias; a Relu / Clip / HardSigmoid / HardSwish /
//      Sigmoid after a Conv (or Gemm) becomes the Conv's epilogue;
//   4. conv and gemm weights are packed for kernels/cpu (conv.h, matmul.h).
// Shapes are not fixed here: the plan (cnn_plan.h) resolves them per input shape.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/cnn/const_tensor.h"
#include "engine/onnx/onnx_model.h"
#include "kernels/cpu/conv.h"

namespace stoke::cnn {

enum class OpKind : uint8_t {
  kConv,
  kMaxPool,
  kAveragePool,
  kGlobalAveragePool,
  kBinary,         // Add, Sub, Mul, Div with numpy broadcasting
  kActivation,     // Relu, Clip, HardSigmoid, HardSwish, Sigmoid (node.act)
  kChannelAffine,  // a BatchNormalization that could not be folded: y = x * scale[c] + shift[c]
  kGemm,           // Gemm, or MatMul by a constant: y = x . W^T + bias
  kSoftmax,
  kAlias,  // Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout: same values, new dims
  kConcat,
  kShape,     // known from the dims alone
  kFoldOnly,  // Cast, Slice, Gather, Transpose: supported only on known (shape or constant) inputs
};

struct ConvParams {
  int64_t out_c = 0, in_c_per_group = 0, kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
  std::vector<int64_t> pads;   // [top, left, bottom, right]
  std::string auto_pad;        // NOTSET, SAME_UPPER, SAME_LOWER, VALID
  std::vector<float> weights;  // ONNX [out_c, in_c/groups, kh, kw] until packed, then conv.h's layout
  std::vector<float> bias;     // [out_c], empty = none
  bool packed = false;
};

struct PoolParams {
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  std::vector<int64_t> pads;  // [top, left, bottom, right]
  std::string auto_pad;
  bool ceil_mode = false;
  bool count_include_pad = false;
};

struct GemmParams {
  int64_t n = 0, k = 0;
  std::vector<float> weights;  // [n, k]: one row per output feature (alpha applied)
  std::vector<float> bias;     // [n] (beta applied), empty = none
};

struct CnnNode {
  onnx::OnnxNode src;  // the ONNX node it came from: name, op type, attributes (and errors)
  OpKind kind = OpKind::kAlias;
  std::vector<std::string> inputs;  // value names; "" = omitted
  std::vector<std::string> outputs;
  ConvParams conv;
  PoolParams pool;
  GemmParams gemm;
  cpu::ActivationParams act;        // kActivation, or the fused epilogue of kConv / kGemm
  std::vector<float> scale, shift;  // kChannelAffine
  int64_t axis = 0;                 // kSoftmax, kConcat
  bool dead = false;                // removed by a rewrite
};

struct CnnGraph {
  int64_t opset = 0;
  std::string input_name;
  std::vector<int64_t> input_dims;  // from the ONNX file; -1 = dynamic
  std::vector<std::string> output_names;
  std::map<std::string, ConstTensor, std::less<>> constants;
  std::vector<CnnNode> nodes;      // topological order; dead ones skipped
  bool ends_with_softmax = false;  // the first output comes straight from a Softmax
};

// Builds the graph; errors name the node (and op) and say what is not supported.
StatusOr<std::unique_ptr<CnnGraph>> BuildCnnGraph(const onnx::OnnxModel& model, const std::string& source);

}  // namespace stoke::cnn
