// The GPU resize + normalise against the CPU Preprocess (engine/image/preprocess.h) on the same pixels, for
// each resize mode and channel order. Label gpu: skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/image_cuda/resize_normalize.h"
#include "kernels/cuda/gpu_test_util.h"

namespace stoke::image::cuda {
namespace {

using ::stoke::cuda::testing::DeviceBuffer;

RgbImage RandomImage(int64_t w, int64_t h, uint32_t seed) {
  std::mt19937 rng(seed);
  RgbImage img{.width = w, .height = h};
  img.pixels.resize(static_cast<size_t>(w * h * 3));
  for (uint8_t& p : img.pixels) p = static_cast<uint8_t>(rng() & 0xFF);
  return img;
}

struct Case {
  const char* name;
  int64_t src_w, src_h;
  PreprocessConfig cfg;
};

PreprocessConfig Cfg(int64_t h, int64_t w, const char* resize, const char* order, int64_t shorter = 0) {
  PreprocessConfig c;
  c.height = h;
  c.width = w;
  c.resize = resize;
  c.channel_order = order;
  c.resize_shorter = shorter > 0 ? shorter : (std::min(h, w) * 256 + 112) / 224;
  return c;
}

TEST(ResizeNormalizeGpuTest, MatchesTheCpuPreprocess) {
  SKIP_WITHOUT_GPU();
  const std::vector<Case> cases = {
      {"crop_landscape", 500, 375, Cfg(224, 224, "crop", "rgb")},
      {"crop_portrait", 333, 480, Cfg(224, 224, "crop", "rgb")},
      {"stretch_up", 40, 30, Cfg(96, 128, "stretch", "rgb")},
      {"fit_pad_bgr", 448, 172, Cfg(48, 192, "fit_pad", "bgr")},
      {"fit_pad_narrow", 60, 120, Cfg(48, 192, "fit_pad", "bgr")},
  };
  for (const Case& c : cases) {
    const RgbImage img = RandomImage(c.src_w, c.src_h, 7);
    const size_t n = static_cast<size_t>(3 * c.cfg.height * c.cfg.width);
    std::vector<float> want(n);
    Preprocess(img, c.cfg, want.data());
    DeviceBuffer<uint8_t> d_img(img.pixels);
    DeviceBuffer<float> d_out(n);
    STATUS_ASSERT(ResizeNormalizeNchw(d_img.get(), img.width, img.height, c.cfg, d_out.get(), nullptr));
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> got = d_out.Download();
    float worst = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << c.name << " left element " << i << " unwritten";
      worst = std::max(worst, std::abs(got[i] - want[i]));
    }
    // Within a hundredth of a grey level after normalising (std 0.225 -> 1/255/0.225 = 0.017 per level).
    EXPECT_LE(worst, 2e-4f) << c.name;
  }
}

TEST(ResizeNormalizeGpuTest, RefusesAnEmptyImage) {
  PreprocessConfig c;
  Status st = ResizeNormalizeNchw(nullptr, 0, 10, c, nullptr, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("empty image"), std::string::npos);
}

}  // namespace
}  // namespace stoke::image::cuda
