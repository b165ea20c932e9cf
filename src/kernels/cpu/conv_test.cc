#include "kernels/cpu/conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace stoke::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// x NHWC, onnx_w [out_c, in_c/groups, kh, kw]: the convolution written from its definition.
std::vector<float> NaiveConv(const std::vector<float>& x, const Conv2dShape& s, const std::vector<float>& w,
                             const std::vector<float>& bias) {
  std::vector<float> y(static_cast<size_t>(s.batch * s.out_h * s.out_w * s.out_c));
  const int64_t cpg = s.in_c / s.groups, opg = s.out_c / s.groups;
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t oh = 0; oh < s.out_h; ++oh)
      for (int64_t ow = 0; ow < s.out_w; ++ow)
        for (int64_t o = 0; o < s.out_c; ++o) {
          double acc = bias.empty() ? 0 : bias[o];
          const int64_t g = o / opg;
          for (int64_t c = 0; c < cpg; ++c)
            for (int64_t kh = 0; kh < s.kernel_h; ++kh)
              for (int64_t kw = 0; kw < s.kernel_w; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_top + kh * s.dilation_h;
                const int64_t iw = ow * s.stride_w - s.pad_left + kw * s.dilation_w;
                if (ih < 0 || ih >= s.in_h || iw < 0 || iw >= s.in_w) continue;
                acc += static_cast<double>(x[((n * s.in_h + ih) * s.in_w + iw) * s.in_c + g * cpg + c]) *
                       w[((o * cpg + c) * s.kernel_h + kh) * s.kernel_w + kw];
              }
          y[((n * s.out_h + oh) * s.out_w + ow) * s.out_c + o] = static_cast<float>(acc);
        }
  return y;
}

int64_t Out(int64_t in, int64_t k, int64_t s, int64_t pad_total, int64_t d) {
  return (in + pad_total - ((k - 1) * d + 1)) / s + 1;
}

struct ConvCase {
  const char* name;
  int64_t batch, in_h, in_w, in_c, out_c, k, stride, pad, dilation, groups;
};

class ConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvTest, MatchesTheDefinition) {
  const ConvCase& c = GetParam();
  Conv2dShape s{.batch = c.batch,
                .in_h = c.in_h,
                .in_w = c.in_w,
                .in_c = c.in_c,
                .out_h = Out(c.in_h, c.k, c.stride, 2 * c.pad, c.dilation),
                .out_w = Out(c.in_w, c.k, c.stride, 2 * c.pad, c.dilation),
                .out_c = c.out_c,
                .kernel_h = c.k,
                .kernel_w = c.k,
                .stride_h = c.stride,
                .stride_w = c.stride,
                .pad_top = c.pad,
                .pad_left = c.pad,
                .dilation_h = c.dilation,
                .dilation_w = c.dilation,
                .groups = c.groups};
  const auto x = Random(static_cast<size_t>(s.batch * s.in_h * s.in_w * s.in_c), 1);
  const auto w = Random(static_cast<size_t>(s.out_c * (s.in_c / s.groups) * c.k * c.k), 2);
  const auto bias = Random(static_cast<size_t>(s.out_c), 3);
  const auto want = NaiveConv(x, s, w, bias);
  const std::vector<float> packed = PackConvWeights(w.data(), s);
  ThreadPool pool(2);
  for (Activation a : {Activation::kNone, Activation::kRelu, Activation::kHardSwish}) {
    std::vector<float> y(want.size(), NAN);
    ASSERT_TRUE(Conv2dNhwc(x.data(), s, packed.data(), bias.data(), {.kind = a}, y.data(), pool).ok());
    for (size_t i = 0; i < y.size(); ++i) {
      float e = want[i];
      if (a == Activation::kRelu) e = std::max(e, 0.0f);
      if (a == Activation::kHardSwish) e = e * std::min(std::max(e / 6 + 0.5f, 0.0f), 1.0f);
      ASSERT_NEAR(y[i], e, 1e-4f * (1 + std::abs(e))) << c.name << " at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvTest,
                         ::testing::Values(ConvCase{"pointwise", 2, 5, 7, 8, 12, 1, 1, 0, 1, 1},
                                           ConvCase{"stem_7x7_s2", 1, 17, 15, 3, 8, 7, 2, 3, 1, 1},
                                           ConvCase{"3x3_s1_p1", 2, 9, 9, 6, 10, 3, 1, 1, 1, 1},
                                           ConvCase{"pointwise_s2", 1, 8, 8, 6, 4, 1, 2, 0, 1, 1},
                                           ConvCase{"dilated", 1, 12, 11, 4, 5, 3, 1, 2, 2, 1},
                                           ConvCase{"grouped", 2, 6, 6, 8, 6, 3, 1, 1, 1, 2},
                                           ConvCase{"depthwise", 2, 9, 10, 16, 16, 3, 2, 1, 1, 16},
                                           ConvCase{"depthwise_5x5", 1, 7, 7, 8, 8, 5, 1, 2, 1, 8},
                                           ConvCase{"depthwise_mult2", 1, 6, 6, 4, 8, 3, 1, 1, 1, 4}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ConvShapeTest, ValidateNamesTheProblem) {
  Conv2dShape s{.in_h = 4, .in_w = 4, .in_c = 6, .out_h = 4, .out_w = 4, .out_c = 4, .groups = 4};
  Status st = s.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("group 4 does not divide in_c 6"), std::string::npos) << st.message();
}

TEST(PoolTest, MaxAndAverageWithPadding) {
  // One 4x4 channel holding 1..16; 3x3 windows, stride 2, padding 1: 2x2 outputs.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i + 1);
  Pool2dShape s{.batch = 1,
                .channels = 1,
                .in_h = 4,
                .in_w = 4,
                .out_h = 2,
                .out_w = 2,
                .kernel_h = 3,
                .kernel_w = 3,
                .stride_h = 2,
                .stride_w = 2,
                .pad_top = 1,
                .pad_left = 1,
                .pad_bottom = 1,
                .pad_right = 1};
  ThreadPool pool(1);
  std::vector<float> y(4);
  Pool2dNhwc(PoolKind::kMax, x.data(), s, y.data(), pool);
  EXPECT_EQ(y, (std::vector<float>{6, 8, 14, 16}));
  Pool2dNhwc(PoolKind::kAverage, x.data(), s, y.data(), pool);
  // Top-left window covers 1, 2, 5, 6 inside the image.
  EXPECT_FLOAT_EQ(y[0], (1 + 2 + 5 + 6) / 4.0f);
  s.count_include_pad = true;
  Pool2dNhwc(PoolKind::kAverage, x.data(), s, y.data(), pool);
  EXPECT_FLOAT_EQ(y[0], (1 + 2 + 5 + 6) / 9.0f);
}

TEST(PoolTest, GlobalAverage) {
  // [1, 2x1 pixels, 3 channels]
  const std::vector<float> x = {1, 2, 3, 5, 6, 7};
  std::vector<float> y(3);
  GlobalAveragePoolNhwc(x.data(), 1, 2, 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{3, 4, 5}));
}

}  // namespace
}  // namespace stoke::cpu
