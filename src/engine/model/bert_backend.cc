#include "engine/model/bert_backend.h"

#include "engine/model/backends.h"
#include "engine/model/device_choice.h"

namespace stoke {

Status ValidateBertDeviceOptions(const BertDeviceOptions& options) {
  const std::string& a = options.attention;
  if (a != "auto" && a != "tensor32" && a != "tensor" && a != "vectorized" && a != "simple") {
    return InvalidArgumentError("--encoder-attention '{}': expected auto, tensor32, tensor, vectorized or simple",
                                a);
  }
  const std::string& e = options.epilogues;
  if (e != "fused" && e != "fused-tanh" && e != "separate") {
    return InvalidArgumentError("--encoder-epilogues '{}': expected fused-tanh, fused or separate", e);
  }
  return OkStatus();
}

std::string ResolveBertDevice(const std::string& device, const Backends& backends) {
  if (device != "auto") return device;
  const BertBackend& b = backends.cuda_bert;
  const bool usable = b.create != nullptr && (b.available == nullptr || b.available());
  return usable ? "cuda" : "cpu";
}

StatusOr<std::shared_ptr<BertDeviceModel>> LoadBertOnDevice(std::shared_ptr<const BertEncoder> encoder,
                                                            const BertDeviceOptions& options,
                                                            const Backends& backends) {
  RETURN_IF_ERROR(ValidateBertDeviceOptions(options));
  const BertBackend& b = backends.cuda_bert;
  ASSIGN_OR_RETURN(const std::string device, ResolveBackendDevice(options.device, b.create != nullptr,
                                                                  b.available, "--device cuda:", "--device cpu"));
  if (device == "cpu") return std::shared_ptr<BertDeviceModel>();
  if (encoder != nullptr && encoder->quantization() != WeightQuantization::kNone) {
    // The device quantises its own copies (options.quantization) from the checkpoint's weights.
    return FailedPreconditionError(
        "--device cuda: the encoder's CPU weights are already quantised ({}); load it unquantised and set "
        "BertDeviceOptions::quantization",
        WeightQuantizationName(encoder->quantization()));
  }
  return b.create(std::move(encoder), options);
}

}  // namespace stoke
