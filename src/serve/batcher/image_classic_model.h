// An ONNX image classifier (engine/cnn/) as a classic model, in two input forms over one loaded graph:
//
//   encoded form:  input  "image"        BYTES [batch, 1]         one JPEG or PNG per row
//   tensor form:   input  "input"        FP32  [batch, 3, H, W]   already preprocessed (NCHW)
//   both:          output "scores"       FP32  [batch, classes]   the model's output (logits or
//   probabilities)
//                         "top_k_index"  INT64 [batch, k]         best classes first
//                         "top_k_score"  FP32  [batch, k]         their probabilities (softmax of the scores
//                                                                 unless the model ends with a Softmax)
//                         "top_k_label"  BYTES [batch, k]         their labels (the index when unlabelled)
//
// Where it runs (ImageDevice): on the CPU (cnn::CnnRunner), or on a GPU (a CnnDeviceModel from
// LoadCnnOnDevice, engine/model/cnn_backend.h: one CnnDeviceRunner per instance). With gpu_preprocess the
// images are only decoded on the CPU; resize + normalise run on the GPU straight into the model's input. With
// gpu_decode too (--preprocess nvjpeg) the encoded bytes go to the runner (RunEncoded): nvJPEG decodes them on
// the GPU (PNG and what it refuses on the CPU, inside the runner) and no thread-pool work is left.
//
// Ledger stages of an execution: preprocess = decode (+ resize + normalise on the CPU, or their GPU time;
// with gpu_decode the whole nvJPEG decode, its bitstream upload included, and the resize)
// of every row into one batch tensor (on the instance's thread pool, one image per task), plus staging into
// pinned memory on a GPU; h2d and d2h = the copies (0 on the CPU); compute = the CNN; postprocess = top-k
// and the output tensors. Prepare (net thread) only checks each image's header (type and size), so a
// request with a non-image is refused with 400 before it is queued. Each instance has its own thread pool
// (threads split across instances) and its own runner (CnnRunner, or a CnnDeviceRunner with its stream).
#pragma once

#include <memory>
#include <string>

#include "engine/cnn/cnn_model.h"
#include "engine/image/image_model_config.h"
#include "engine/model/cnn_backend.h"
#include "serve/batcher/classic_model.h"

namespace stoke {

enum class ImageInputForm { kEncoded, kTensor };

struct ImageDevice {
  std::shared_ptr<CnnDeviceModel> model;  // null: the CPU
  bool gpu_preprocess = false;            // --preprocess gpu: needs `model`
  bool gpu_decode = false;                // --preprocess nvjpeg: needs gpu_preprocess and model->decodes_jpeg()
};

class ImageClassicModel final : public ClassicModel {
 public:
  // Plans the model once at the configured input size (batch 1) to learn the number of classes; errors
  // (an unsupported op, a size the model cannot take) come from here, at load.
  static StatusOr<std::shared_ptr<ImageClassicModel>> Create(std::shared_ptr<const cnn::CnnModel> model,
                                                             image::ImageModelConfig config,
                                                             ImageInputForm form, int threads = 0,
                                                             ImageDevice device = {});

  std::string platform() const override { return "stoke_onnx_cnn"; }
  const ModelSignature& signature() const override { return signature_; }
  StatusOr<std::unique_ptr<PreparedInput>> Prepare(std::vector<InferTensor> inputs, int64_t rows,
                                                   int64_t* tokens) const override;
  StatusOr<std::unique_ptr<ModelInstance>> CreateInstance(int index, int count) override;

  int64_t num_classes() const { return classes_; }
  bool graph_ends_with_softmax() const { return model_->ends_with_softmax(); }
  const image::ImageModelConfig& config() const { return config_; }
  // "cpu", or the device's name ("cuda:0 (NVIDIA H200), fp16") and ", gpu preprocessing" (", nvjpeg decoding
  // + gpu preprocessing") when it applies.
  std::string device_name() const;

 private:
  ImageClassicModel() = default;

  std::shared_ptr<const cnn::CnnModel> model_;
  image::ImageModelConfig config_;
  ImageInputForm form_ = ImageInputForm::kEncoded;
  int threads_ = 0;
  ImageDevice device_;
  int64_t classes_ = 0;
  ModelSignature signature_;
};

}  // namespace stoke
