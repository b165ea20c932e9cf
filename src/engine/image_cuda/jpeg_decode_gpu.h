// Encoded images -> RGB8 on the device, JPEGs decoded there by nvJPEG, for `--preprocess nvjpeg`
// (docs/images.md): the decoded pixels stay on the GPU and ResizeNormalizeNchw (resize_normalize.h) reads
// them.
//
//   image                                     path
//   JPEG, 1 or 3 components, baseline         nvjpegDecodeBatched: the hardware decoder (A100/H100/H200 NVJPG
//                                             engines) when `hardware` and the GPU has one, else the hybrid
//                                             backend (Huffman on this thread, IDCT + colour on the GPU)
//   JPEG the batched call rejects             nvjpegDecode one by one with the hybrid backend (progressive
//     (progressive on the hardware backend)
//   PNG, CMYK JPEG, anything nvJPEG refuses   the CPU decoder (engine/image/image_decode.h), pixels copied up
//   corrupt past what either decoder takes    InvalidArgument from the CPU decoder naming the image
//
// One decoder per CUDA stream (a CnnDeviceRunner's): it owns an nvJPEG handle pair, their states and its
// output buffer; not thread-safe. Built only when CMake found nvJPEG (cmake/StokeCuda.cmake); otherwise
// Create says "this build has no nvJPEG" (jpeg_decode_gpu_stub.cc).
//
//   ASSIGN_OR_RETURN(auto dec, GpuJpegDecoder::Create({.stream = s}));
//   std::vector<DeviceRgb> imgs;
//   RETURN_IF_ERROR(dec->Decode(encoded, &imgs, &stats));   // asynchronous on s; imgs valid until the next
//   call
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::image::cuda {

// Whether this build has nvJPEG (the decoder below can be created).
bool NvjpegInBuild();

struct GpuJpegDecoderOptions {
  cudaStream_t stream = nullptr;
  // Use the GPU's hardware JPEG decoder for baseline JPEGs when it has one (false: the hybrid backend only).
  bool hardware = true;
};

// One decoded image on the device: [height, width, 3] RGB8, row-major, inside the decoder's buffer.
struct DeviceRgb {
  const uint8_t* pixels = nullptr;
  int64_t width = 0, height = 0;
};

// How each image of the last Decode went.
struct GpuJpegStats {
  int batched = 0;  // by nvjpegDecodeBatched
  int single = 0;   // by nvjpegDecode (the batched call refused it)
  int cpu = 0;      // by the CPU decoder (PNG, or nvJPEG refused it)
};

class GpuJpegDecoder {
 public:
  virtual ~GpuJpegDecoder() = default;
  // FailedPrecondition "this build has no nvJPEG ..." without it; errors from nvJPEG or CUDA as Status.
  static StatusOr<std::unique_ptr<GpuJpegDecoder>> Create(const GpuJpegDecoderOptions& options);

  // Decodes every image (JPEG or PNG bytes) into `out`, one entry per image, asynchronously on the stream;
  // the pixels are valid until the next Decode. An image no decoder takes fails the call: InvalidArgument
  // naming its index and why. `stats` may be null.
  virtual Status Decode(std::span<const std::string_view> images, std::vector<DeviceRgb>* out,
                        GpuJpegStats* stats) = 0;
  // "hardware" or "hybrid": the backend nvjpegDecodeBatched uses.
  virtual const char* backend() const = 0;
};

}  // namespace stoke::image::cuda
