#include "engine/cnn/cnn_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace stoke::cnn {
namespace {

using onnx::OnnxAttribute;
using onnx::OnnxModel;
using onnx::OnnxNode;
using onnx::OnnxTensor;

OnnxTensor Floats(std::string name, std::vector<int64_t> dims, std::vector<float> v) {
  return {.name = std::move(name),
          .type = onnx::DataType::kFloat,
          .dims = std::move(dims),
          .floats = std::move(v)};
}

OnnxTensor Ints(std::string name, std::vector<int64_t> dims, std::vector<int64_t> v) {
  return {
      .name = std::move(name), .type = onnx::DataType::kInt64, .dims = std::move(dims), .ints = std::move(v)};
}

OnnxNode Node(std::string op, std::vector<std::string> in, std::string out,
              std::vector<OnnxAttribute> attrs = {}) {
  return {.name = out,
          .op_type = std::move(op),
          .inputs = std::move(in),
          .outputs = {std::move(out)},
          .attributes = std::move(attrs)};
}

OnnxAttribute IntAttr(std::string name, int64_t v) {
  return {.name = std::move(name), .kind = OnnxAttribute::Kind::kInt, .i = v};
}

OnnxModel Model(std::vector<int64_t> in_dims, std::string out, int64_t opset = 13) {
  OnnxModel m;
  m.opset = opset;
  m.inputs = {{.name = "x", .dims = std::move(in_dims), .has_shape = true}};
  m.outputs = {{.name = std::move(out)}};
  return m;
}

void Add(OnnxModel* m, OnnxTensor t) {
  std::string name = t.name;
  m->initializers.emplace(std::move(name), std::move(t));
}

int LiveNodes(const CnnModel& m) {
  int n = 0;
  for (const CnnNode& node : m.graph().nodes) n += !node.dead;
  return n;
}

std::vector<float> RunModel(const OnnxModel& om, const std::vector<float>& x,
                            const std::vector<int64_t>& dims, std::vector<int64_t>* out_dims = nullptr) {
  auto m = CnnModel::FromOnnx(om, "test");
  EXPECT_TRUE(m.ok()) << m.status().message();
  CnnRunner r(*m);
  std::vector<float> out;
  std::vector<int64_t> od;
  ThreadPool pool(1);
  Status st = r.Run(x.data(), dims, &out, &od, pool);
  EXPECT_TRUE(st.ok()) << st.message();
  if (out_dims) *out_dims = od;
  return out;
}

// 1x1 conv (2 -> 2 channels) -> BatchNormalization -> Relu: folded into one conv with a Relu epilogue.
TEST(CnnGraphTest, ConvBatchNormReluFoldIntoOneConv) {
  OnnxModel m = Model({1, 2, 1, 2}, "r");
  Add(&m, Floats("w", {2, 2, 1, 1}, {1, 2, -1, 1}));
  Add(&m, Floats("scale", {2}, {2, 0.5f}));
  Add(&m, Floats("bias", {2}, {1, -1}));
  Add(&m, Floats("mean", {2}, {0.5f, 0}));
  Add(&m, Floats("var", {2}, {3, 0.25f}));
  m.nodes = {Node("Conv", {"x", "w"}, "c"),
             Node("BatchNormalization", {"c", "scale", "bias", "mean", "var"}, "bn"),
             Node("Relu", {"bn"}, "r")};
  auto model = CnnModel::FromOnnx(m, "test");
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(LiveNodes(**model), 1);
  // x: channel 0 = [1, 2], channel 1 = [3, -4] (NCHW).
  const std::vector<float> x = {1, 2, 3, -4};
  const std::vector<float> y = RunModel(m, x, {1, 2, 1, 2});
  ASSERT_EQ(y.size(), 4u);
  const float eps = 1e-5f;
  for (int p = 0; p < 2; ++p) {
    const float c0 = 1 * x[p] + 2 * x[2 + p], c1 = -1 * x[p] + 1 * x[2 + p];
    const float b0 = (c0 - 0.5f) / std::sqrt(3 + eps) * 2 + 1,
                b1 = (c1 - 0) / std::sqrt(0.25f + eps) * 0.5f - 1;
    EXPECT_NEAR(y[p], std::max(b0, 0.0f), 1e-5f);
    EXPECT_NEAR(y[2 + p], std::max(b1, 0.0f), 1e-5f);
  }
}

// PaddlePaddle's hardswish: x * Clip(x + 3, 0, 6) / 6 after a conv becomes the conv's epilogue.
TEST(CnnGraphTest, HardSwishChainBecomesOneEpilogue) {
  OnnxModel m = Model({1, 1, 1, 4}, "hs");
  Add(&m, Floats("w", {1, 1, 1, 1}, {1}));
  Add(&m, Floats("three", {}, {3}));
  Add(&m, Floats("zero", {}, {0}));
  Add(&m, Floats("six", {}, {6}));
  m.nodes = {Node("Conv", {"x", "w"}, "c"), Node("Add", {"c", "three"}, "a"),
             Node("Clip", {"a", "zero", "six"}, "cl"), Node("Mul", {"c", "cl"}, "mu"),
             Node("Div", {"mu", "six"}, "hs")};
  auto model = CnnModel::FromOnnx(m, "test");
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(LiveNodes(**model), 1);
  const std::vector<float> x = {-4, -1, 2, 5};
  const std::vector<float> y = RunModel(m, x, {1, 1, 1, 4});
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y[i], x[i] * std::min(std::max(x[i] + 3, 0.0f), 6.0f) / 6, 1e-6f) << i;
  }
}

// The older torchvision flatten: Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape, resolved when
// planning.
TEST(CnnGraphTest, ShapeArithmeticIsResolvedPerInputShape) {
  OnnxModel m = Model({-1, 2, 2, 2}, "sm");
  Add(&m, Ints("zero", {}, {0}));
  Add(&m, Ints("minus1", {1}, {-1}));
  Add(&m, Ints("axes", {1}, {0}));
  m.nodes = {Node("Shape", {"x"}, "s"),
             Node("Gather", {"s", "zero"}, "n", {IntAttr("axis", 0)}),
             Node("Unsqueeze", {"n", "axes"}, "n1"),
             Node("Concat", {"n1", "minus1"}, "shape", {IntAttr("axis", 0)}),
             Node("Reshape", {"x", "shape"}, "flat"),
             Node("Softmax", {"flat"}, "sm", {IntAttr("axis", -1)})};
  std::vector<float> x(24);
  for (int i = 0; i < 24; ++i) x[i] = 0.1f * i;
  std::vector<int64_t> od;
  const std::vector<float> y = RunModel(m, x, {3, 2, 2, 2}, &od);
  EXPECT_EQ(od, (std::vector<int64_t>{3, 8}));
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int k = 0; k < 8; ++k) sum += std::exp(x[r * 8 + k] - x[r * 8 + 7]);
    EXPECT_NEAR(y[r * 8 + 7], 1.0 / sum, 1e-6) << r;
  }
}

// A per-channel Mul broadcast over an NHWC activation (squeeze-excitation) keeps NCHW semantics.
TEST(CnnGraphTest, ChannelBroadcastAgainstAnImage) {
  OnnxModel m = Model({1, 2, 2, 2}, "y");
  Add(&m, Floats("w", {2, 2, 1, 1}, {1, 0, 0, 1}));  // identity conv: the activation goes NHWC
  Add(&m, Floats("s", {1, 2, 1, 1}, {10, 100}));
  m.nodes = {Node("Conv", {"x", "w"}, "c"), Node("Mul", {"c", "s"}, "y")};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> y = RunModel(m, x, {1, 2, 2, 2});
  EXPECT_EQ(y, (std::vector<float>{10, 20, 30, 40, 500, 600, 700, 800}));
}

TEST(CnnGraphTest, UnsupportedOpNamesTheNode) {
  OnnxModel m = Model({1, 3, 4, 4}, "y");
  m.nodes = {Node("LSTM", {"x"}, "y")};
  auto model = CnnModel::FromOnnx(m, "rnn.onnx");
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("rnn.onnx: node 'y' (LSTM): op type 'LSTM' is not supported"),
            std::string::npos)
      << model.status().message();
}

TEST(CnnGraphTest, ComputedWeightsAreRefused) {
  OnnxModel m = Model({1, 3, 4, 4}, "y");
  m.nodes = {Node("Conv", {"x", "x"}, "y")};
  auto model = CnnModel::FromOnnx(m, "t.onnx");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("node 'y' (Conv): the weights 'x' must be a float initializer"),
            std::string::npos)
      << model.status().message();
}

TEST(CnnGraphTest, ChannelMismatchIsAPlanError) {
  OnnxModel m = Model({1, 3, 4, 4}, "y");
  Add(&m, Floats("w", {1, 4, 1, 1}, {1, 1, 1, 1}));
  m.nodes = {Node("Conv", {"x", "w"}, "y")};
  auto model = CnnModel::FromOnnx(m, "t.onnx");
  ASSERT_TRUE(model.ok());
  CnnRunner r(*model);
  std::vector<float> x(48), out;
  std::vector<int64_t> od;
  ThreadPool pool(1);
  Status st = r.Run(x.data(), {1, 3, 4, 4}, &out, &od, pool);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("input has 3 channels, the weights expect 4"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace stoke::cnn
