// An image classifier's preprocessing, as a stage of the model: decoded RGB pixels -> the model's input
// tensor [3, height, width] fp32 (NCHW, one image).
//
//   resize      what                                                  used by
//   "crop"      shorter side to resize_shorter, then a centre crop    torchvision ImageNet models (256 ->
//   224) "stretch"   both sides to height x width                          models trained on squashed images
//   "fit_pad"   height to `height`, width in proportion (at most       PaddleOCR's text-direction classifier
//               `width`), zeros (after normalising) on the right
//
// Resizing is bilinear with half-pixel centres and no antialiasing (OpenCV's INTER_LINEAR, computed in
// float). Then value = (pixel * scale - mean[c]) / std[c], channels in `channel_order`.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "engine/image/image_decode.h"

namespace stoke::image {

struct PreprocessConfig {
  int64_t height = 224;
  int64_t width = 224;
  std::string resize = "crop";   // crop | stretch | fit_pad
  int64_t resize_shorter = 256;  // crop: the shorter side before cropping
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  float scale = 1.0f / 255.0f;        // applied to the 0..255 pixel before mean/std
  std::string channel_order = "rgb";  // rgb | bgr
  std::string layout = "nchw";        // the CNN engine's input layout (only nchw)

  // Checks every field; InvalidArgument naming the field and value.
  Status Validate() const;
  // Fields present in `j` override the defaults above; unknown keys are an error naming them.
  static StatusOr<PreprocessConfig> FromJson(const nlohmann::json& j, std::string_view source);
  nlohmann::json ToJson() const;
};

// Where an image of width x height lands in the model's input: it is resized (virtually) to scaled_h x
// scaled_w, and the window [y0, y0 + rows) x [x0, x0 + cols) of that is written to the top-left of the
// [3, height, width] tensor; the rest (fit_pad's right side) is 0. The CPU path and its GPU twin
// (engine/image_cuda/) both follow it.
struct ResizeGeometry {
  int64_t scaled_h = 0, scaled_w = 0;
  int64_t y0 = 0, x0 = 0;
  int64_t rows = 0, cols = 0;
};
ResizeGeometry Geometry(int64_t width, int64_t height, const PreprocessConfig& cfg);

// Writes [3, height, width] floats to `out`.
void Preprocess(const RgbImage& img, const PreprocessConfig& cfg, float* out);

}  // namespace stoke::image
