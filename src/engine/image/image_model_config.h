// What an image classifier needs beyond its ONNX file: preprocessing, class labels, how many top classes
// to return. From a model file ({"type": "image", ...}; docs/images.md), from the table of known aliases,
// or the ImageNet defaults for a bare .onnx (input size from the file when it is fixed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/image/preprocess.h"

namespace stoke::image {

struct ImageModelConfig {
  PreprocessConfig preprocess;
  std::vector<std::string> labels;  // index -> name; empty = the index as text
  int top_k = 5;                    // capped at the number of classes

  // Reads "preprocess", "labels", "top_k" from a model file object (other keys are the server's).
  static StatusOr<ImageModelConfig> FromJson(const nlohmann::json& j, std::string_view source);
};

// The built-in configuration of a known image alias (model_registry.h), or null.
const ImageModelConfig* KnownImageConfig(std::string_view alias);

// ImageNet defaults (crop 256 -> 224, ImageNet mean/std, RGB) with the size taken from an ONNX input's
// [N, 3, H, W] when H and W are fixed.
ImageModelConfig DefaultImageConfig(const std::vector<int64_t>& onnx_input_dims);

}  // namespace stoke::image
