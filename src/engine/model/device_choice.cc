#include "engine/model/device_choice.h"

namespace stoke {

StatusOr<std::string> ResolveBackendDevice(const std::string& device, bool compiled, bool (*available)(),
                                           std::string_view context, std::string_view cpu_hint) {
  const bool usable = compiled && (available == nullptr || available());
  if (device == "auto") return std::string(usable ? "cuda" : "cpu");
  if (device == "cpu") return device;
  if (device != "cuda") return InvalidArgumentError("unknown device '{}' (expected cpu, cuda or auto)", device);
  if (!compiled) {
    return FailedPreconditionError(
        "{} this stoke was built without CUDA (configure with the release-cuda preset on a machine with nvcc)",
        context);
  }
  if (!usable) {
    return FailedPreconditionError(
        "{} no CUDA GPU is visible (driver missing or CUDA_VISIBLE_DEVICES empty); use {}", context, cpu_hint);
  }
  return device;
}

}  // namespace stoke
