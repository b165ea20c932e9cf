#include "engine/model/cnn_backend.h"

#include "engine/model/backends.h"
#include "engine/model/device_choice.h"

namespace stoke {

StatusOr<std::shared_ptr<CnnDeviceModel>> LoadCnnOnDevice(std::shared_ptr<const cnn::CnnModel> model,
                                                          const CnnDeviceOptions& options,
                                                          const Backends& backends) {
  if (options.precision != "fp16" && options.precision != "bf16") {
    return InvalidArgumentError("image model precision '{}': expected fp16 or bf16", options.precision);
  }
  if (options.conv_backend != "auto" && options.conv_backend != "cudnn" && options.conv_backend != "im2col") {
    return InvalidArgumentError("--conv-backend '{}': expected auto, cudnn or im2col", options.conv_backend);
  }
  const CnnBackend& b = backends.cuda_cnn;
  ASSIGN_OR_RETURN(const std::string device,
                   ResolveBackendDevice(options.device.empty() ? "auto" : options.device, b.create != nullptr,
                                        b.available, "--device cuda:", "--device cpu"));
  if (device == "cpu") {
    if (options.conv_backend != "auto") {
      return InvalidArgumentError(
          "--conv-backend {}: the image model runs on the CPU, where convolutions are im2col + sgemm; the "
          "choice is for the GPU executor (--device cuda)",
          options.conv_backend);
    }
    return std::shared_ptr<CnnDeviceModel>();
  }
  if (model == nullptr) return InvalidArgumentError("LoadCnnOnDevice: no model");
  return b.create(std::move(model), options);
}

}  // namespace stoke
