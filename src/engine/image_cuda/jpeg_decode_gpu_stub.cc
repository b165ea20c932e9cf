// GpuJpegDecoder in a build without nvJPEG (cmake/StokeCuda.cmake did not find it): asking for it says so.
#include "engine/image_cuda/jpeg_decode_gpu.h"

namespace stoke::image::cuda {

bool NvjpegInBuild() {
  return false;
}

StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(const GpuJpegDecoderOptions&) {
  return FailedPreconditionError(
      "this build has no nvJPEG (the GPU JPEG decoder): scripts/setup.sh installs the nvidia-nvjpeg wheel "
      "(tests/nvjpeg.txt) into .venv, where CMake finds it; then rebuild. --preprocess gpu decodes on the "
      "CPU");
}

}  // namespace stoke::image::cuda
