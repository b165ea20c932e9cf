#include "serve/batcher/synthetic_classic_model.h"

#include <cstring>

#include "base/logging.h"

namespace stoke {
namespace {

struct SyntheticInput : PreparedInput {
  std::string bytes;  // [rows, input_bytes]
};

class SyntheticInstance final : public ModelInstance {
 public:
  SyntheticInstance(std::shared_ptr<const SyntheticModel> m, std::unique_ptr<SyntheticRunner> runner)
      : model_(std::move(m)), runner_(std::move(runner)) {}

  Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                 std::vector<std::vector<InferTensor>>* outputs, ExecTimes* times) override {
    // One contiguous batch; concatenating is part of preprocess.
    const Nanos t0 = MonotonicNanos();
    batch_.clear();
    int64_t total = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      batch_ += static_cast<const SyntheticInput*>(inputs[i])->bytes;
      total += rows[i];
    }
    const Nanos gather = MonotonicNanos() - t0;
    SyntheticTimes t;
    RETURN_IF_ERROR(runner_->Run(reinterpret_cast<const uint8_t*>(batch_.data()), total, &out_, &t));
    const Nanos t1 = MonotonicNanos();
    const int64_t ob = model_->config().output_bytes;
    int64_t row = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      InferTensor o;
      o.name = "OUTPUT0";
      o.type = TensorType::kUint8;
      o.shape = {rows[i], ob};
      o.data.assign(reinterpret_cast<const char*>(out_.data()) + row * ob, static_cast<size_t>(rows[i] * ob));
      row += rows[i];
      (*outputs)[i].push_back(std::move(o));
    }
    times->preprocess = gather + t.preprocess;
    times->h2d = t.h2d;
    times->compute = t.compute;
    times->d2h = t.d2h;
    times->postprocess = t.postprocess + (MonotonicNanos() - t1);
    return OkStatus();
  }

 private:
  std::shared_ptr<const SyntheticModel> model_;
  std::unique_ptr<SyntheticRunner> runner_;
  std::string batch_;
  std::vector<uint8_t> out_;
};

}  // namespace

SyntheticClassicModel::SyntheticClassicModel(std::shared_ptr<const SyntheticModel> model, int64_t max_rows,
                                             const Backends& backends)
    : model_(std::move(model)), max_rows_(max_rows), backends_(backends) {
  signature_.inputs = {{"INPUT0", TensorType::kUint8, {model_->config().input_bytes}}};
  signature_.outputs = {{"OUTPUT0", TensorType::kUint8, {model_->config().output_bytes}}};
}

StatusOr<std::unique_ptr<PreparedInput>> SyntheticClassicModel::Prepare(std::vector<InferTensor> inputs,
                                                                        int64_t, int64_t* tokens) const {
  auto in = std::make_unique<SyntheticInput>();
  in->bytes = std::move(inputs[0].data);
  *tokens = 0;
  return std::unique_ptr<PreparedInput>(std::move(in));
}

StatusOr<std::unique_ptr<ModelInstance>> SyntheticClassicModel::CreateInstance(int index, int count) {
  ASSIGN_OR_RETURN(std::unique_ptr<SyntheticRunner> runner, NewSyntheticRunner(model_, max_rows_, backends_));
  LOG_INFO("synthetic: instance {} of {} runs on {}", index, count, runner->device());
  return std::unique_ptr<ModelInstance>(new SyntheticInstance(model_, std::move(runner)));
}

}  // namespace stoke
