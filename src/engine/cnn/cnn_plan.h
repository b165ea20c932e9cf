// A CnnGraph resolved for one input shape: every value's dims and layout, the run-time steps in order,
// and which scratch buffer each value lives in (buffers are reused once a value's last reader has run).
//
// Layout: 4-D activations run NHWC (conv.h); the graph's input and output, and anything reshaped, flattened,
// multiplied by a matrix or soft-maxed, are plain row-major (NCHW for 4-D). The planner inserts the
// transposes (a [N, C, 1, 1] tensor is the same memory in both layouts, so that one is free). Nodes whose
// inputs are all known here (Shape and what is computed from shapes, constants) are evaluated now.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/cnn/cnn_graph.h"

namespace stoke::cnn {

// A run-time tensor: dims as ONNX sees them; where its floats are.
struct RtValue {
  std::vector<int64_t> dims;
  bool nhwc = false;             // 4-D stored as [N, H, W, C]
  int root = -1;                 // the value that owns the memory (itself, or what it aliases)
  const float* konst = nullptr;  // a constant operand (graph- or plan-owned), no buffer
};

enum class StepKind : uint8_t {
  kConv,
  kPool,
  kGlobalAveragePool,
  kBinary,
  kActivation,
  kChannelAffine,
  kGemm,
  kSoftmax,
  kConcat,
  kToNhwc,
  kToNchw,
};

struct Step {
  StepKind kind = StepKind::kActivation;
  const CnnNode* node = nullptr;  // null for inserted transposes
  std::vector<int> in;            // value ids
  int out = -1;
  cpu::Conv2dShape conv;
  cpu::Pool2dShape pool;
  cpu::PoolKind pool_kind = cpu::PoolKind::kMax;
  char op = '+';                          // kBinary: + - * /
  std::vector<int64_t> bdims;             // kBinary: physical output dims
  std::vector<int64_t> bstride[2];        // kBinary: each input's strides over bdims (0 = broadcast)
  int64_t outer = 0, len = 0, inner = 0;  // kSoftmax, kChannelAffine (len = channels), transposes (N, C, HW)
  std::vector<int64_t> parts;             // kConcat: each input's run length (plain) or channels (nhwc)
  bool nhwc_concat = false;
};

// Per-instance memory: one plan's buffers are reused by the next plan of any shape.
struct CnnWorkspace;

class CnnPlan {
 public:
  // input_dims: the concrete input shape (NCHW).
  static StatusOr<std::unique_ptr<CnnPlan>> Create(const CnnGraph& graph,
                                                   const std::vector<int64_t>& input_dims);

  // x: the input (dims as planned). Writes the first graph output, row-major, to *out / *out_dims.
  Status Run(const float* x, CnnWorkspace* ws, ThreadPool& pool, std::vector<float>* out,
             std::vector<int64_t>* out_dims) const;

  size_t num_steps() const { return steps_.size(); }
  int64_t buffer_floats() const;  // all buffers together

  // What another executor (engine/cnn_cuda/) needs to run the same plan: the values, the steps in order,
  // the buffer of each root value (-1 = the graph input) and each buffer's size in elements.
  const std::vector<RtValue>& values() const { return values_; }
  const std::vector<Step>& steps() const { return steps_; }
  int buffer_of(int root) const { return buffer_of_[root]; }
  const std::vector<int64_t>& buffer_sizes() const { return buffer_floats_; }
  int input_value() const { return input_; }
  int output_value() const { return output_; }

 private:
  friend class Planner;
  const float* Data(int v, const std::vector<std::vector<float>>& bufs, const float* x) const;
  Status RunStep(const Step& s, const std::vector<const float*>& in, float* out, CnnWorkspace* ws,
                 ThreadPool& pool) const;

  std::vector<RtValue> values_;
  std::vector<Step> steps_;
  std::vector<int> buffer_of_;          // per root value: buffer index, -1 = the graph input
  std::vector<int64_t> buffer_floats_;  // per buffer
  int input_ = -1, output_ = -1;
  std::vector<std::vector<float>> owned_;  // constants converted for a layout
};

struct CnnWorkspace {
  std::vector<std::vector<float>> buffers;
};

}  // namespace stoke::cnn
