// An ONNX CNN (engine/cnn/) on another device than the CPU (the CUDA backend, engine/cnn_cuda/cuda_cnn.h),
// behind an interface this CPU-only library can name: the backend travels in the Backends value main() builds
// (engine/model/backends.h), so the image serving path (serve/batcher/image_classic_model.cc) selects a
// device without linking CUDA. Same pattern as bert_backend.h.
//
//   ASSIGN_OR_RETURN(auto dev, LoadCnnOnDevice(model, {.device = "cuda"}, backends));  // weights uploaded
//   ASSIGN_OR_RETURN(auto runner, dev->CreateRunner());   // one per instance: its own stream + scratch
//   RETURN_IF_ERROR(runner->Run(x, {8, 3, 224, 224}, &scores, &dims, &times));
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

struct Backends;  // engine/model/backends.h
namespace cnn {
class CnnModel;  // engine/cnn/cnn_model.h
}
namespace image {
struct PreprocessConfig;  // engine/image/preprocess.h
}

// Where one batch's time went, ns. h2d/compute/d2h are CUDA events on the runner's stream; preprocess is the
// device resize + normalise of RunImages (0 for Run), and for RunEncoded the decoding too (nvJPEG's host
// Huffman work, its bitstream upload, the CPU-decoded images' upload: h2d is 0 there); host_ns is host time
// inside the call outside those (staging into and out of pinned memory, waiting).
struct CnnDeviceTimes {
  int64_t preprocess_ns = 0;
  int64_t h2d_ns = 0;
  int64_t compute_ns = 0;
  int64_t d2h_ns = 0;
  int64_t host_ns = 0;
};

// One decoded image on the host: [height, width, 3] RGB8, row-major.
struct RgbView {
  const uint8_t* pixels = nullptr;
  int64_t width = 0, height = 0;
};

// One execution context (a stream, a cuBLAS handle, activations, pinned staging); not thread-safe; one per
// instance. Both calls block until the scores are on the host and have CnnRunner::Run's output contract.
class CnnDeviceRunner {
 public:
  virtual ~CnnDeviceRunner() = default;
  // x: [N, 3, H, W] fp32 on the host.
  virtual Status Run(const float* x, const std::vector<int64_t>& dims, std::vector<float>* out,
                     std::vector<int64_t>* out_dims, CnnDeviceTimes* times) = 0;
  // Decoded images, one per row: copied to the device as RGB8, resized and normalised there (`cfg`, the
  // GPU twin of image::Preprocess) straight into the model's input, then run.
  virtual Status RunImages(std::span<const RgbView> images, const image::PreprocessConfig& cfg,
                           std::vector<float>* out, std::vector<int64_t>* out_dims,
                           CnnDeviceTimes* times) = 0;
  // Encoded images (JPEG or PNG bytes), one per row: JPEGs decoded on the device by nvJPEG (PNG and what
  // nvJPEG refuses on the host), then as RunImages. InvalidArgument naming the image that no decoder takes;
  // FailedPrecondition on a backend or build without a GPU JPEG decoder.
  virtual Status RunEncoded(std::span<const std::string_view> images, const image::PreprocessConfig& cfg,
                            std::vector<float>* out, std::vector<int64_t>* out_dims, CnnDeviceTimes* times) {
    return FailedPreconditionError("this device has no JPEG decoder");
  }
};

// A CNN's weights on a device, shared by every runner created from it. Thread-safe.
class CnnDeviceModel {
 public:
  virtual ~CnnDeviceModel() = default;
  virtual std::string device_name() const = 0;  // "cuda:0 (NVIDIA H200), fp16"
  virtual StatusOr<std::unique_ptr<CnnDeviceRunner>> CreateRunner() = 0;
  // Whether its runners' RunEncoded decodes JPEGs on the device (a CUDA build with nvJPEG).
  virtual bool decodes_jpeg() const { return false; }
};

struct CnnDeviceOptions {
  std::string device = "cuda";  // "cpu", "cuda", or "auto" (cuda when available)
  int gpu_index = 0;
  // Weights and activations on the device: "fp16" (tensor cores, fp32 accumulation; ImageNet CNNs stay far
  // inside its range) or "bf16" (more range, 3 fewer mantissa bits).
  std::string precision = "fp16";
  // How the device runs the non-depthwise convolutions: "cudnn" (cuDNN, conv + bias (+ ReLU) in one call,
  // the algorithm found per shape), "im2col" (our im2col + a cuBLAS GEMM, then bias + activation), or "auto"
  // (cudnn when the build has cuDNN, else im2col). Depthwise convs always run our direct kernel.
  std::string conv_backend = "auto";
};

// A device CNN backend (engine/cnn_cuda: CudaCnnBackend()), carried in Backends::cuda_cnn. `available`: a
// usable GPU is visible (null = always).
struct CnnBackend {
  StatusOr<std::shared_ptr<CnnDeviceModel>> (*create)(std::shared_ptr<const cnn::CnnModel> model,
                                                      const CnnDeviceOptions& options) = nullptr;
  bool (*available)() = nullptr;
};

// "cpu" (or "auto" without a usable backends.cuda_cnn): nullptr, run cnn::CnnRunner. "cuda": the model
// uploaded by backends.cuda_cnn, or FailedPrecondition saying why not (built without CUDA, no GPU).
// Anything else, an unknown precision or conv_backend, or a conv_backend other than auto for a model that
// stays on the CPU: InvalidArgument.
StatusOr<std::shared_ptr<CnnDeviceModel>> LoadCnnOnDevice(std::shared_ptr<const cnn::CnnModel> model,
                                                          const CnnDeviceOptions& options,
                                                          const Backends& backends);

}  // namespace stoke
