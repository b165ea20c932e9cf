// The synthetic model (engine/model/synthetic.h) as a classic model: input "INPUT0" UINT8 [batch,
// input_bytes], output "OUTPUT0" UINT8 [batch, output_bytes]; each instance has its own SyntheticRunner (on
// the CPU: its own workspace, the weight buffer shared so instances compete for memory bandwidth; with
// "device": "cuda": its own CUDA stream, staging and device buffers).
#pragma once

#include <memory>
#include <string>

#include "engine/model/backends.h"
#include "engine/model/synthetic.h"
#include "serve/batcher/classic_model.h"

namespace stoke {

class SyntheticClassicModel final : public ClassicModel {
 public:
  // max_rows: the largest batch an instance gets (max_batch_size, or 1); device buffers are sized for it.
  // backends: where each instance's runner comes from (NewSyntheticRunner; the model's "device" key picks).
  SyntheticClassicModel(std::shared_ptr<const SyntheticModel> model, int64_t max_rows,
                        const Backends& backends);

  std::string platform() const override { return "stoke_synthetic"; }
  const ModelSignature& signature() const override { return signature_; }
  StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor> inputs, int64_t rows,
                                                   int64_t* tokens) const override;
  StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int index, int count) override;
  const char* copy_memory() const override { return model_->config().pinned ? "pinned" : "pageable"; }

 private:
  std::shared_ptr<const SyntheticModel> model_;
  int64_t max_rows_ = 1;
  Backends backends_;  // a copy: a few function pointers
  ModelSignature signature_;
};

}  // namespace stoke
