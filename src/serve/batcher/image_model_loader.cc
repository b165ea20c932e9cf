#include "serve/batcher/image_model_loader.h"

#include "engine/loader/model_registry.h"

namespace stoke {

bool IsImageModel(const std::string& model) {
  if (model.ends_with(".onnx")) return true;
  const ModelSpec* spec = FindModelSpec(model);
  return spec != nullptr && spec->entry.ends_with(".onnx");
}

StatusOr<LoadedImageModel> LoadImageModel(const ImageServeSpec& spec) {
  if (spec.preprocess != "cpu" && spec.preprocess != "gpu" && spec.preprocess != "nvjpeg") {
    return InvalidArgumentError("--preprocess '{}': expected cpu, gpu or nvjpeg", spec.preprocess);
  }
  // auto stays on the CPU for image models: the GPU executor (fp16, a few 1e-3 of the scores' range from the
  // CPU's fp32) is asked for by name, --device cuda, until its figures are committed (docs/images.md).
  std::string device = spec.device.empty() ? "auto" : spec.device;
  if (device != "cpu" && device != "cuda" && device != "auto") {
    return InvalidArgumentError("unknown device '{}' (expected cpu, cuda or auto)", spec.device);
  }
  if (device == "auto") device = "cpu";
  LoadedImageModel out;
  ASSIGN_OR_RETURN(out.path, ResolveModel(spec.model));
  ASSIGN_OR_RETURN(std::shared_ptr<const cnn::CnnModel> model, cnn::CnnModel::Load(out.path));
  out.summary = model->Summary();
  // On a GPU the weights are uploaded once and shared by both forms' instances.
  const Backends cpu_only = CpuBackends();
  ImageDevice dev;
  ASSIGN_OR_RETURN(dev.model,
                   LoadCnnOnDevice(model,
                                   {.device = device,
                                    .precision = spec.precision,
                                    .conv_backend = spec.conv_backend.empty() ? "auto" : spec.conv_backend},
                                   spec.backends != nullptr ? *spec.backends : cpu_only));
  dev.gpu_preprocess = spec.preprocess == "gpu" || spec.preprocess == "nvjpeg";
  dev.gpu_decode = spec.preprocess == "nvjpeg";
  image::ImageModelConfig config;
  const image::ImageModelConfig* known = image::KnownImageConfig(spec.model);
  if (known != nullptr)
    config = *known;
  else
    config = image::DefaultImageConfig(model->input_dims());
  if (spec.file.is_object()) {
    // Keys the file gives replace the alias's or the defaults; "preprocess" replaces them whole.
    image::ImageModelConfig from_file;
    ASSIGN_OR_RETURN(from_file, image::ImageModelConfig::FromJson(spec.file, spec.source));
    if (spec.file.contains("preprocess")) config.preprocess = from_file.preprocess;
    if (spec.file.contains("labels")) config.labels = from_file.labels;
    if (spec.file.contains("top_k")) config.top_k = from_file.top_k;
  }
  ASSIGN_OR_RETURN(out.encoded,
                   ImageClassicModel::Create(model, config, ImageInputForm::kEncoded, spec.threads, dev));
  ASSIGN_OR_RETURN(out.tensor,
                   ImageClassicModel::Create(model, config, ImageInputForm::kTensor, spec.threads, dev));
  out.device = out.encoded->device_name();
  return out;
}

}  // namespace stoke
