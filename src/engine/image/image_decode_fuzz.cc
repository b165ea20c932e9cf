// libFuzzer target: arbitrary bytes as an encoded image through ProbeImage, DecodeImage and Preprocess must
// give a Status, never crash or read outside the buffer.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/image/image_decode.h"
#include "engine/image/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  int64_t w = 0, h = 0;
  if (!stoke::image::ProbeImage(bytes, &w, &h).ok() || w * h > (int64_t{1} << 22)) return 0;
  stoke::image::RgbImage img;
  if (!stoke::image::DecodeImage(bytes, &img).ok()) return 0;
  for (const char* resize : {"crop", "stretch", "fit_pad"}) {
    stoke::image::PreprocessConfig c;
    c.height = 8;
    c.width = 12;
    c.resize = resize;
    c.resize_shorter = 10;
    std::vector<float> out(3 * 8 * 12);
    stoke::image::Preprocess(img, c, out.data());
  }
  return 0;
}
