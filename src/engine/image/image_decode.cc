#include "engine/image/image_decode.h"

// clang-format off
#include <cstdio>    // jpeglib.h needs FILE and size_t first
#include <csetjmp>
#include <jpeglib.h>
#include <png.h>
// clang-format on

#include <cstring>
#include <string>

namespace stoke::image {
namespace {

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegSilence(j_common_ptr, int) {}

Status CheckSize(int64_t w, int64_t h, std::string_view what) {
  if (w < 1 || h < 1) return InvalidArgumentError("{}: empty image ({}x{})", what, w, h);
  if (w * h > kMaxPixels) {
    return InvalidArgumentError("{}: {}x{} pixels is more than the {} allowed", what, w, h, kMaxPixels);
  }
  return OkStatus();
}

}  // namespace

Status DecodeJpeg(std::string_view bytes, RgbImage* out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  err.mgr.emit_message = JpegSilence;  // warnings (e.g. extraneous bytes) are not errors
  // Nothing with a destructor may live between setjmp and a longjmp to it.
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgumentError("JPEG: {}", err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgumentError("JPEG: CMYK images are not supported (convert to RGB)");
  }
  cinfo.out_color_space = JCS_RGB;
  const int64_t w = cinfo.image_width, h = cinfo.image_height;
  if (Status s = CheckSize(w, h, "JPEG"); !s.ok()) {
    jpeg_destroy_decompress(&cinfo);
    return s;
  }
  out->width = w;
  out->height = h;
  out->pixels.resize(static_cast<size_t>(w * h * 3));
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + static_cast<size_t>(cinfo.output_scanline) * w * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return OkStatus();
}

Status DecodePng(std::string_view bytes, RgbImage* out) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) {
    const std::string msg = img.message;
    png_image_free(&img);
    return InvalidArgumentError("PNG: {}", msg);
  }
  if (Status s = CheckSize(img.width, img.height, "PNG"); !s.ok()) {
    png_image_free(&img);
    return s;
  }
  img.format = PNG_FORMAT_RGB;  // grey widened, alpha removed (composited by libpng), 16-bit reduced
  out->width = img.width;
  out->height = img.height;
  out->pixels.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, out->pixels.data(), 0, nullptr)) {
    const std::string msg = img.message;
    png_image_free(&img);
    return InvalidArgumentError("PNG: {}", msg);
  }
  return OkStatus();
}

Status ProbeImage(std::string_view bytes, int64_t* width, int64_t* height) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    jpeg_decompress_struct cinfo;
    JpegError err;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = JpegErrorExit;
    err.mgr.emit_message = JpegSilence;
    if (setjmp(err.jump)) {
      jpeg_destroy_decompress(&cinfo);
      return InvalidArgumentError("JPEG: {}", err.message);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, b, static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(&cinfo, TRUE);
    *width = cinfo.image_width;
    *height = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return CheckSize(*width, *height, "JPEG");
  }
  if (bytes.size() >= 8 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G') {
    png_image img;
    std::memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) {
      const std::string msg = img.message;
      png_image_free(&img);
      return InvalidArgumentError("PNG: {}", msg);
    }
    *width = img.width;
    *height = img.height;
    png_image_free(&img);
    return CheckSize(*width, *height, "PNG");
  }
  return DecodeImage(bytes, nullptr);  // the error naming the bytes
}

Status DecodeImage(std::string_view bytes, RgbImage* out) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return DecodeJpeg(bytes, out);
  if (bytes.size() >= 8 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G')
    return DecodePng(bytes, out);
  return InvalidArgumentError(
      "not a JPEG or PNG image ({} bytes; the first bytes are neither FF D8 FF nor "
      "89 'PNG')",
      bytes.size());
}

}  // namespace stoke::image
