// The GPU twin of engine/image/preprocess.h's resize + normalise: an RGB8 image already on the device (from
// nvJPEG, later) -> the model's [3, height, width] fp32 input, written in place in the batch tensor. Same
// geometry (ResizeGeometry), same bilinear taps (half-pixel centres, no antialiasing), same normalisation;
// checked against the CPU Preprocess by resize_normalize_gpu_test.cc (label gpu). Step one of
// `--preprocess gpu` (docs/images.md); nvJPEG decoding and the serving path are not built yet.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "engine/image/preprocess.h"

namespace stoke::image::cuda {

// rgb: device [height, width, 3] uint8; out: device [3, cfg.height, cfg.width] fp32. Asynchronous on
// `stream`. InvalidArgument for an empty image or an invalid config.
Status ResizeNormalizeNchw(const uint8_t* rgb, int64_t width, int64_t height, const PreprocessConfig& cfg,
                           float* out, cudaStream_t stream);

}  // namespace stoke::image::cuda
