// The synthetic model (engine/model/synthetic.h) as a classic model: input "INPUT0" UINT8 [batch,
// input_bytes], output "OUTPUT0" UINT8 [batch, output_bytes]; each instance has its own workspace, the
// weight buffer is shared (so instances compete for memory bandwidth, as on a GPU).
#pragma once

#include <memory>
#include <string>

#include "engine/model/synthetic.h"
#include "serve/batcher/classic_model.h"

namespace stoke {

class SyntheticClassicModel final : public ClassicModel {
 public:
  explicit SyntheticClassicModel(std::shared_ptr<const SyntheticModel> model);

  std::string platform() const override { return "stoke_synthetic"; }
  const ModelSignature& signature() const override { return signature_; }
  StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor> inputs, int64_t rows,
                                                   int64_t* tokens) const override;
  StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int index, int count) override;

 private:
  std::shared_ptr<const SyntheticModel> model_;
  ModelSignature signature_;
};

}  // namespace stoke
