#include "engine/cnn/cnn_model.h"

#include <fmt/format.h>

#include <map>

namespace stoke::cnn {
namespace {

std::string KindName(const CnnNode& n) {
  switch (n.kind) {
    case OpKind::kConv:
      return n.conv.groups > 1 && n.conv.in_c_per_group == 1 ? "DepthwiseConv" : "Conv";
    case OpKind::kActivation:
      switch (n.act.kind) {
        case cpu::Activation::kHardSwish:
          return "HardSwish";
        case cpu::Activation::kClip:
          return "Clip";
        default:
          return n.src.op_type;
      }
    default:
      return n.src.op_type;
  }
}

}  // namespace

StatusOr<std::shared_ptr<const CnnModel>> CnnModel::FromOnnx(const onnx::OnnxModel& m,
                                                             const std::string& source) {
  auto model = std::shared_ptr<CnnModel>(new CnnModel());
  ASSIGN_OR_RETURN(model->graph_, BuildCnnGraph(m, source));
  return std::shared_ptr<const CnnModel>(std::move(model));
}

StatusOr<std::shared_ptr<const CnnModel>> CnnModel::Load(const std::string& path) {
  ASSIGN_OR_RETURN(onnx::OnnxModel m, onnx::ReadOnnxFile(path));
  return FromOnnx(m, path);
}

std::string CnnModel::Summary() const {
  std::map<std::string, int> counts;
  int total = 0, fused = 0;
  for (const CnnNode& n : graph_->nodes) {
    if (n.dead) continue;
    ++counts[KindName(n)];
    ++total;
    fused += n.act.kind != cpu::Activation::kNone && n.kind != OpKind::kActivation;
  }
  std::vector<std::string> parts;
  for (const auto& [k, v] : counts) parts.push_back(fmt::format("{} {}", v, k));
  return fmt::format("{} nodes ({}; {} with a fused activation)", total, fmt::join(parts, ", "), fused);
}

Status CnnRunner::Run(const float* x, const std::vector<int64_t>& dims, std::vector<float>* out,
                      std::vector<int64_t>* out_dims, ThreadPool& pool) {
  auto it = plans_.find(dims);
  if (it == plans_.end()) {
    if (plans_.size() >= kMaxPlans) plans_.clear();
    ASSIGN_OR_RETURN(std::unique_ptr<CnnPlan> plan, CnnPlan::Create(model_->graph(), dims));
    it = plans_.emplace(dims, std::move(plan)).first;
  }
  return it->second->Run(x, &ws_, pool, out, out_dims);
}

}  // namespace stoke::cnn
