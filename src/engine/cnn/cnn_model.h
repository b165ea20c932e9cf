// An ONNX image classifier on the CPU: load once (cnn_graph.h: fold, fuse, pack), run from any number of
// instances, each with its own CnnRunner (plans per input shape and scratch buffers; not thread-safe).
//
//   ASSIGN_OR_RETURN(auto model, CnnModel::Load("resnet50.onnx"));
//   CnnRunner runner(model);
//   RETURN_IF_ERROR(runner.Run(x, {8, 3, 224, 224}, &logits, &dims, pool));   // x NCHW fp32
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/cnn/cnn_graph.h"
#include "engine/cnn/cnn_plan.h"

namespace stoke::cnn {

class CnnModel {
 public:
  static StatusOr<std::shared_ptr<const CnnModel>> Load(const std::string& path);
  static StatusOr<std::shared_ptr<const CnnModel>> FromOnnx(const onnx::OnnxModel& m,
                                                            const std::string& source);

  const std::string& input_name() const { return graph_->input_name; }
  // [N, C, H, W] as the file declares it; -1 = dynamic (the batch, often H and W).
  const std::vector<int64_t>& input_dims() const { return graph_->input_dims; }
  const std::string& output_name() const { return graph_->output_names[0]; }
  bool ends_with_softmax() const { return graph_->ends_with_softmax; }
  const CnnGraph& graph() const { return *graph_; }
  // "53 nodes: 33 Conv, 12 Add, ..." after folding and fusion.
  std::string Summary() const;

 private:
  std::unique_ptr<CnnGraph> graph_;
};

class CnnRunner {
 public:
  explicit CnnRunner(std::shared_ptr<const CnnModel> model) : model_(std::move(model)) {}

  // x: [N, C, H, W] fp32, row-major. *out: the first graph output, row-major; *out_dims its dims.
  // The first run of a shape plans it (kept for the next run; at most kMaxPlans shapes).
  Status Run(const float* x, const std::vector<int64_t>& dims, std::vector<float>* out,
             std::vector<int64_t>* out_dims, ThreadPool& pool);

  static constexpr size_t kMaxPlans = 64;

 private:
  std::shared_ptr<const CnnModel> model_;
  std::map<std::vector<int64_t>, std::unique_ptr<CnnPlan>> plans_;
  CnnWorkspace ws_;
};

}  // namespace stoke::cnn
