// Encoded images (JPEG through libjpeg-turbo, PNG through libpng) to 8-bit RGB pixels. Grey images are
// widened to RGB, alpha is removed (libpng composites it), 16-bit PNG channels are reduced to 8 bits.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::image {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3], row-major
};

// Images larger than this many pixels are refused (a small file can declare a huge image).
inline constexpr int64_t kMaxPixels = int64_t{1} << 26;  // 64 Mpixel

// Decodes by magic bytes (JPEG FF D8 FF, PNG 89 'P' 'N' 'G'); InvalidArgument naming the problem for
// anything else, a corrupt or truncated file, or an unsupported colour space.
Status DecodeImage(std::string_view bytes, RgbImage* out);
// Reads only the header: the format and the size (checked against kMaxPixels). Cheap enough for a net
// thread; a file corrupt past its header still fails in DecodeImage.
Status ProbeImage(std::string_view bytes, int64_t* width, int64_t* height);
Status DecodeJpeg(std::string_view bytes, RgbImage* out);
Status DecodePng(std::string_view bytes, RgbImage* out);

}  // namespace stoke::image
