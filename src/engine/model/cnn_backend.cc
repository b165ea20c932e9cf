#include "engine/model/cnn_backend.h"

#include "engine/model/backends.h"

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
  const bool usable = b.create != nullptr && (b.available == nullptr || b.available());
  std::string device = options.device.empty() ? "auto" : options.device;
  if (device == "auto") device = usable ? "cuda" : "cpu";
  if (device == "cpu") {
    if (options.conv_backend != "auto") {
      return InvalidArgumentError(
          "--conv-backend {}: the image model runs on the CPU, where convolutions are im2col + sgemm; the "
          "choice is for the GPU executor (--device cuda)",
          options.conv_backend);
    }
    return std::shared_ptr<CnnDeviceModel>();
  }
  if (device != "cuda") {
    return InvalidArgumentError("unknown device '{}' (expected cpu, cuda or auto)", options.device);
  }
  if (b.create == nullptr) {
    return FailedPreconditionError(
        "--device cuda: this stoke was built without CUDA (configure with the release-cuda preset on a "
        "machine with nvcc)");
  }
  if (!usable) {
    return FailedPreconditionError(
        "--device cuda: no CUDA GPU is visible (driver missing or CUDA_VISIBLE_DEVICES empty); use --device "
        "cpu");
  }
  if (model == nullptr) return InvalidArgumentError("LoadCnnOnDevice: no model");
  return b.create(std::move(model), options);
}

}  // namespace stoke
