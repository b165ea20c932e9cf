#include "engine/image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

namespace stoke::image {
namespace {

// Source coordinate and weights for output index i of a resize from `in` to `out` samples.
struct Tap {
  int64_t i0, i1;
  float w1;  // weight of i1; i0 gets 1 - w1
};

std::vector<Tap> Taps(int64_t in, int64_t out) {
  std::vector<Tap> taps(static_cast<size_t>(out));
  const double ratio = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t i = 0; i < out; ++i) {
    double src = (static_cast<double>(i) + 0.5) * ratio - 0.5;
    if (src < 0) src = 0;
    int64_t i0 = static_cast<int64_t>(std::floor(src));
    if (i0 > in - 1) i0 = in - 1;
    const int64_t i1 = std::min(i0 + 1, in - 1);
    taps[i] = {i0, i1, static_cast<float>(src - static_cast<double>(i0))};
  }
  return taps;
}

// Bilinear resize of the region [y0, y0 + rh) x [x0, x0 + rw) of a (resized) image of size sh x sw, i.e.
// resize to sh x sw and take the window, without materialising the whole resized image. Writes the
// normalised window into out[c, oy + y, ox + x] of a [3, out_h, out_w] tensor.
void ResizeWindow(const RgbImage& img, int64_t sh, int64_t sw, int64_t y0, int64_t x0, int64_t rh, int64_t rw,
                  const PreprocessConfig& cfg, int64_t oy, int64_t ox, float* out) {
  const std::vector<Tap> ty = Taps(img.height, sh);
  const std::vector<Tap> tx = Taps(img.width, sw);
  const bool bgr = cfg.channel_order == "bgr";
  float mul[3], add[3];
  for (int c = 0; c < 3; ++c) {
    mul[c] = cfg.scale / cfg.std[c];
    add[c] = -cfg.mean[c] / cfg.std[c];
  }
  const int64_t plane = cfg.height * cfg.width;
  const uint8_t* px = img.pixels.data();
  const int64_t stride = img.width * 3;
  for (int64_t y = 0; y < rh; ++y) {
    const Tap& a = ty[y0 + y];
    const uint8_t* r0 = px + a.i0 * stride;
    const uint8_t* r1 = px + a.i1 * stride;
    for (int64_t x = 0; x < rw; ++x) {
      const Tap& b = tx[x0 + x];
      for (int c = 0; c < 3; ++c) {
        const float top = r0[b.i0 * 3 + c] * (1 - b.w1) + r0[b.i1 * 3 + c] * b.w1;
        const float bot = r1[b.i0 * 3 + c] * (1 - b.w1) + r1[b.i1 * 3 + c] * b.w1;
        const float v = top * (1 - a.w1) + bot * a.w1;
        const int oc = bgr ? 2 - c : c;
        out[oc * plane + (oy + y) * cfg.width + ox + x] = v * mul[oc] + add[oc];
      }
    }
  }
}

}  // namespace

Status PreprocessConfig::Validate() const {
  if (height < 1 || width < 1 || height > 8192 || width > 8192) {
    return InvalidArgumentError("preprocess: height and width must be in [1, 8192], got {}x{}", height,
                                width);
  }
  if (resize != "crop" && resize != "stretch" && resize != "fit_pad") {
    return InvalidArgumentError("preprocess: resize must be crop, stretch or fit_pad, got '{}'", resize);
  }
  if (resize == "crop" && resize_shorter < std::min(height, width)) {
    return InvalidArgumentError("preprocess: resize_shorter {} is smaller than the {}x{} crop",
                                resize_shorter, height, width);
  }
  for (int c = 0; c < 3; ++c) {
    if (!(std[c] > 0)) return InvalidArgumentError("preprocess: std[{}] must be > 0, got {}", c, std[c]);
  }
  if (channel_order != "rgb" && channel_order != "bgr") {
    return InvalidArgumentError("preprocess: channel_order must be rgb or bgr, got '{}'", channel_order);
  }
  if (layout != "nchw") {
    return InvalidArgumentError("preprocess: layout must be nchw (the CNN engine's input), got '{}'", layout);
  }
  return OkStatus();
}

StatusOr<PreprocessConfig> PreprocessConfig::FromJson(const nlohmann::json& j, std::string_view source) {
  PreprocessConfig c;
  if (!j.is_object()) return InvalidArgumentError("{}: \"preprocess\" must be an object", source);
  static const std::set<std::string> kKeys = {"height", "width", "resize",        "resize_shorter", "mean",
                                              "std",    "scale", "channel_order", "layout"};
  for (const auto& [k, v] : j.items()) {
    if (kKeys.count(k) == 0) return InvalidArgumentError("{}: unknown preprocess key '{}'", source, k);
  }
  try {
    if (j.contains("height")) c.height = j["height"].get<int64_t>();
    if (j.contains("width")) c.width = j["width"].get<int64_t>();
    if (j.contains("resize")) c.resize = j["resize"].get<std::string>();
    c.resize_shorter = j.contains("resize_shorter")
                           ? j["resize_shorter"].get<int64_t>()
                           : static_cast<int64_t>(std::lround(std::min(c.height, c.width) * 256.0 / 224.0));
    if (j.contains("mean")) c.mean = j["mean"].get<std::array<float, 3>>();
    if (j.contains("std")) c.std = j["std"].get<std::array<float, 3>>();
    if (j.contains("scale")) c.scale = j["scale"].get<float>();
    if (j.contains("channel_order")) c.channel_order = j["channel_order"].get<std::string>();
    if (j.contains("layout")) c.layout = j["layout"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("{}: preprocess: {}", source, e.what());
  }
  RETURN_IF_ERROR(c.Validate().WithContext(source));
  return c;
}

nlohmann::json PreprocessConfig::ToJson() const {
  return {{"height", height}, {"width", width}, {"resize", resize}, {"resize_shorter", resize_shorter},
          {"mean", mean},     {"std", std},     {"scale", scale},   {"channel_order", channel_order},
          {"layout", layout}};
}

ResizeGeometry Geometry(int64_t width, int64_t height, const PreprocessConfig& cfg) {
  const int64_t h = cfg.height, w = cfg.width;
  ResizeGeometry g{.scaled_h = h, .scaled_w = w, .rows = h, .cols = w};
  if (cfg.resize == "stretch") return g;
  if (cfg.resize == "fit_pad") {
    const double ratio = static_cast<double>(width) / static_cast<double>(height);
    g.scaled_w = g.cols = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(h * ratio)), 1, w);
    return g;
  }
  // crop: shorter side to resize_shorter (the other in proportion, rounded down as torchvision does),
  // then the centre h x w window.
  int64_t sh, sw;
  if (height <= width) {
    sh = cfg.resize_shorter;
    sw = std::max<int64_t>(1, cfg.resize_shorter * width / height);
  } else {
    sw = cfg.resize_shorter;
    sh = std::max<int64_t>(1, cfg.resize_shorter * height / width);
  }
  g.scaled_h = std::max(sh, h);
  g.scaled_w = std::max(sw, w);
  // Ties to even, as torchvision's int(round(...)).
  g.y0 = static_cast<int64_t>(std::nearbyint((g.scaled_h - h) / 2.0));
  g.x0 = static_cast<int64_t>(std::nearbyint((g.scaled_w - w) / 2.0));
  return g;
}

void Preprocess(const RgbImage& img, const PreprocessConfig& cfg, float* out) {
  const ResizeGeometry g = Geometry(img.width, img.height, cfg);
  if (g.rows < cfg.height || g.cols < cfg.width) std::fill(out, out + 3 * cfg.height * cfg.width, 0.0f);
  ResizeWindow(img, g.scaled_h, g.scaled_w, g.y0, g.x0, g.rows, g.cols, cfg, 0, 0, out);
}

}  // namespace stoke::image
