#include "engine/image/image_model_config.h"

#include <cmath>

namespace stoke::image {

StatusOr<ImageModelConfig> ImageModelConfig::FromJson(const nlohmann::json& j, std::string_view source) {
  ImageModelConfig c;
  if (j.contains("preprocess")) {
    ASSIGN_OR_RETURN(c.preprocess, PreprocessConfig::FromJson(j["preprocess"], source));
  }
  if (j.contains("labels")) {
    if (!j["labels"].is_array())
      return InvalidArgumentError("{}: \"labels\" must be an array of strings", source);
    for (const auto& l : j["labels"]) {
      if (!l.is_string()) return InvalidArgumentError("{}: \"labels\" must be an array of strings", source);
      c.labels.push_back(l.get<std::string>());
    }
  }
  if (j.contains("top_k")) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() < 1 ||
        j["top_k"].get<int64_t>() > 1000) {
      return InvalidArgumentError("{}: \"top_k\" must be an integer in [1, 1000], got {}", source,
                                  j["top_k"].dump());
    }
    c.top_k = j["top_k"].get<int>();
  }
  return c;
}

const ImageModelConfig* KnownImageConfig(std::string_view alias) {
  // PaddleOCR's text-direction classifier as RapidOCR runs it (ch_ppocr_cls/text_cls.py: cls_image_shape
  // [3, 48, 192], BGR from cv2, /255, -0.5, /0.5, right padding; labels '0' and '180').
  static const ImageModelConfig kPpocrCls = [] {
    ImageModelConfig c;
    c.preprocess.height = 48;
    c.preprocess.width = 192;
    c.preprocess.resize = "fit_pad";
    c.preprocess.mean = {0.5f, 0.5f, 0.5f};
    c.preprocess.std = {0.5f, 0.5f, 0.5f};
    c.preprocess.channel_order = "bgr";
    c.labels = {"0", "180"};
    c.top_k = 2;
    return c;
  }();
  if (alias == "ppocr-mobile-v2-cls") return &kPpocrCls;
  return nullptr;
}

ImageModelConfig DefaultImageConfig(const std::vector<int64_t>& dims) {
  ImageModelConfig c;
  if (dims.size() == 4 && dims[2] > 0 && dims[3] > 0) {
    c.preprocess.height = dims[2];
    c.preprocess.width = dims[3];
    c.preprocess.resize_shorter =
        static_cast<int64_t>(std::lround(std::min(dims[2], dims[3]) * 256.0 / 224.0));
  }
  return c;
}

}  // namespace stoke::image
