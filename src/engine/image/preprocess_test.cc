#include "engine/image/preprocess.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cstring>

#include "engine/image/image_decode.h"
#include "engine/image/image_model_config.h"

namespace stoke::image {
namespace {

RgbImage Pattern(int64_t w, int64_t h) {
  RgbImage img{.width = w, .height = h};
  img.pixels.resize(static_cast<size_t>(w * h * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[(y * w + x) * 3 + c] = static_cast<uint8_t>((x * 7 + y * 13 + c * 50) % 256);
  return img;
}

PreprocessConfig Plain(int64_t h, int64_t w, std::string resize) {
  PreprocessConfig c;
  c.height = h;
  c.width = w;
  c.resize = std::move(resize);
  c.mean = {0, 0, 0};
  c.std = {1, 1, 1};
  c.scale = 1;
  return c;
}

TEST(PreprocessTest, SameSizeStretchKeepsThePixels) {
  const RgbImage img = Pattern(5, 4);
  std::vector<float> out(3 * 4 * 5);
  Preprocess(img, Plain(4, 5, "stretch"), out.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x) EXPECT_EQ(out[(c * 4 + y) * 5 + x], img.pixels[(y * 5 + x) * 3 + c]);
}

TEST(PreprocessTest, HalvingAveragesPixelPairs) {
  // Half-pixel centres: output x samples input 2x + 0.5, the mean of columns 2x and 2x + 1.
  RgbImage img = Pattern(4, 2);
  std::vector<float> out(3 * 1 * 2);
  Preprocess(img, Plain(1, 2, "stretch"), out.data());
  for (int x = 0; x < 2; ++x) {
    float sum = 0;
    for (int yy = 0; yy < 2; ++yy)
      for (int xx = 0; xx < 2; ++xx) sum += img.pixels[(yy * 4 + 2 * x + xx) * 3];
    EXPECT_FLOAT_EQ(out[x], sum / 4);
  }
}

TEST(PreprocessTest, NormaliseAndBgr) {
  RgbImage img{.width = 1, .height = 1, .pixels = {255, 0, 51}};
  PreprocessConfig c = Plain(1, 1, "stretch");
  c.scale = 1.0f / 255;
  c.mean = {0.5f, 0.25f, 0.1f};  // in the model's channel order: B, G, R
  c.std = {0.5f, 0.5f, 0.5f};
  c.channel_order = "bgr";
  std::vector<float> out(3);
  Preprocess(img, c, out.data());
  EXPECT_NEAR(out[0], (0.2f - 0.5f) / 0.5f, 1e-6);   // B = 51
  EXPECT_NEAR(out[1], (0.0f - 0.25f) / 0.5f, 1e-6);  // G = 0
  EXPECT_NEAR(out[2], (1.0f - 0.1f) / 0.5f, 1e-6);   // R = 255
}

TEST(PreprocessTest, FitPadFillsTheRightWithZeros) {
  const RgbImage img = Pattern(8, 8);  // square: 4 high -> 4 wide of 12
  std::vector<float> out(3 * 4 * 12, -1);
  PreprocessConfig c = Plain(4, 12, "fit_pad");
  c.mean = {100, 100, 100};  // padding stays 0 after normalising
  Preprocess(img, c, out.data());
  for (int ch = 0; ch < 3; ++ch)
    for (int y = 0; y < 4; ++y) {
      for (int x = 4; x < 12; ++x) EXPECT_EQ(out[(ch * 4 + y) * 12 + x], 0.0f);
      EXPECT_NE(out[(ch * 4 + y) * 12 + 0], 0.0f);
    }
}

TEST(PreprocessTest, CropTakesTheCentre) {
  // 6x4 (w x h) -> shorter side 4 stays 4 (no scaling), centre 4x4 window = columns 1..4.
  const RgbImage img = Pattern(6, 4);
  PreprocessConfig c = Plain(4, 4, "crop");
  c.resize_shorter = 4;
  std::vector<float> out(3 * 4 * 4);
  Preprocess(img, c, out.data());
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_EQ(out[y * 4 + x], img.pixels[(y * 6 + x + 1) * 3]);
}

TEST(PreprocessConfigTest, ErrorsNameTheField) {
  auto c = PreprocessConfig::FromJson(nlohmann::json{{"hieght", 3}}, "m.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unknown preprocess key 'hieght'"), std::string::npos);
  c = PreprocessConfig::FromJson(nlohmann::json{{"resize", "zoom"}}, "m.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("resize must be crop, stretch or fit_pad, got 'zoom'"),
            std::string::npos);
  c = PreprocessConfig::FromJson(nlohmann::json{{"std", {1, 0, 1}}}, "m.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("std[1] must be > 0"), std::string::npos);
  c = PreprocessConfig::FromJson(nlohmann::json{{"height", 48}, {"width", 192}}, "m.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->resize_shorter, 55);  // 48 * 256 / 224, rounded
}

TEST(ImageModelConfigTest, KnownAliasAndDefaults) {
  const ImageModelConfig* k = KnownImageConfig("ppocr-mobile-v2-cls");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->preprocess.height, 48);
  EXPECT_EQ(k->preprocess.width, 192);
  EXPECT_EQ(k->labels, (std::vector<std::string>{"0", "180"}));
  EXPECT_EQ(KnownImageConfig("resnet50"), nullptr);
  const ImageModelConfig d = DefaultImageConfig({-1, 3, 299, 299});
  EXPECT_EQ(d.preprocess.height, 299);
  EXPECT_EQ(d.preprocess.resize_shorter, 342);
}

std::string EncodePng(const RgbImage& img) {
  png_image p;
  std::memset(&p, 0, sizeof(p));
  p.version = PNG_IMAGE_VERSION;
  p.width = static_cast<png_uint_32>(img.width);
  p.height = static_cast<png_uint_32>(img.height);
  p.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&p, nullptr, &size, 0, img.pixels.data(), 0, nullptr));
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&p, out.data(), &size, 0, img.pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

TEST(ImageDecodeTest, PngRoundTripAndProbe) {
  const RgbImage img = Pattern(13, 7);
  const std::string png = EncodePng(img);
  RgbImage back;
  ASSERT_TRUE(DecodeImage(png, &back).ok());
  EXPECT_EQ(back.width, 13);
  EXPECT_EQ(back.height, 7);
  EXPECT_EQ(back.pixels, img.pixels);
  int64_t w = 0, h = 0;
  ASSERT_TRUE(ProbeImage(png, &w, &h).ok());
  EXPECT_EQ(w, 13);
  EXPECT_EQ(h, 7);
}

TEST(ImageDecodeTest, BadBytesAreNamed) {
  RgbImage img;
  Status st = DecodeImage("GIF89a....", &img);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a JPEG or PNG image (10 bytes"), std::string::npos) << st.message();
  const std::string truncated = EncodePng(Pattern(13, 7)).substr(0, 40);
  st = DecodeImage(truncated, &img);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("PNG:"), std::string::npos) << st.message();
  st = DecodeImage(std::string("\xff\xd8\xff\xe0garbage", 11), &img);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("JPEG:"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace stoke::image
