// The CUDA CNN executor against the CPU one (engine/cnn/) on the same graph and inputs: a small network built
// in memory that uses every step kind the GPU runs (conv general / 1x1 / grouped / depthwise with each fused
// activation, BN folding, pools, add + ReLU fusion, broadcast multiply, concat, global pool, flatten, gemm,
// softmax), at several batch sizes, in fp16 and bf16; decoded images through the GPU resize (RunImages)
// against the CPU Preprocess + Run; bad input refused. Each comparison runs with both conv backends
// (CnnDeviceOptions::conv_backend im2col and cudnn; cudnn skips in a build without cuDNN). `--onnx
// a.onnx[,b.onnx]` (after any --gtest_* flags) adds real models (bench/gpu/images.sh passes ResNet-50 and
// MobileNetV2) at batch 1, 8, 32 and 64, printing per backend "NAME fp16 BACKEND batch N: max |gpu - cpu| X
// (range R), compute T us" (T: the fastest of a few runs). Label gpu: skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "engine/cnn_cuda/cuda_cnn.h"
#include "engine/image/preprocess.h"
#include "kernels/cuda/gpu_test_util.h"

namespace stoke::cnn::cuda {
namespace {

using onnx::OnnxAttribute;
using onnx::OnnxModel;
using onnx::OnnxNode;
using onnx::OnnxTensor;

class Net {
 public:
  explicit Net(uint32_t seed) : rng_(seed) {}

  std::string Weights(std::vector<int64_t> dims, float scale, float offset = 0.0f) {
    const std::string name = "w" + std::to_string(m_.initializers.size());
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = offset + scale * u(rng_);
    m_.initializers[name] = {
        .name = name, .type = onnx::DataType::kFloat, .dims = std::move(dims), .floats = std::move(v)};
    return name;
  }
  std::string Node(std::string op, std::vector<std::string> in, std::vector<OnnxAttribute> attrs = {}) {
    const std::string out = op + std::to_string(m_.nodes.size());
    m_.nodes.push_back({.name = out,
                        .op_type = std::move(op),
                        .inputs = std::move(in),
                        .outputs = {out},
                        .attributes = std::move(attrs)});
    return out;
  }
  static OnnxAttribute Ints(std::string name, std::vector<int64_t> v) {
    return {.name = std::move(name), .kind = OnnxAttribute::Kind::kInts, .ints = std::move(v)};
  }
  static OnnxAttribute Int(std::string name, int64_t v) {
    return {.name = std::move(name), .kind = OnnxAttribute::Kind::kInt, .i = v};
  }
  static OnnxAttribute Float(std::string name, float v) {
    return {.name = std::move(name), .kind = OnnxAttribute::Kind::kFloat, .f = v};
  }
  // Conv (+ BatchNormalization, folded on load) + activation.
  std::string ConvBn(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride,
                     int64_t groups, const std::string& act) {
    const float scale = std::sqrt(3.0f / static_cast<float>(k * k * cin / groups));
    std::string y = Node("Conv", {x, Weights({cout, cin / groups, k, k}, scale)},
                         {Ints("kernel_shape", {k, k}), Ints("strides", {stride, stride}),
                          Ints("pads", {k / 2, k / 2, k / 2, k / 2}), Int("group", groups)});
    y = Node("BatchNormalization", {y, Weights({cout}, 0.2f, 1.0f), Weights({cout}, 0.1f),
                                    Weights({cout}, 0.1f), Weights({cout}, 0.2f, 1.0f)});
    if (act == "relu") return Node("Relu", {y});
    if (act == "relu6") return Node("Clip", {y, Weights({}, 0.0f), Weights({}, 0.0f, 6.0f)});
    if (act == "hardswish") return Node("HardSwish", {y});
    if (act == "hardsigmoid") return Node("HardSigmoid", {y}, {Float("alpha", 0.2f), Float("beta", 0.5f)});
    return y;
  }
  // A plain Conv with bias (pads keep the size at stride 1) and an optional activation.
  std::string Conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t groups,
                   int64_t dilation, const std::string& act) {
    const int64_t pad = dilation * (k / 2);
    std::string y = Node(
        "Conv", {x, Weights({cout, cin / groups, k, k}, 0.3f), Weights({cout}, 0.2f)},
        {Ints("kernel_shape", {k, k}), Ints("strides", {stride, stride}),
         Ints("dilations", {dilation, dilation}), Ints("pads", {pad, pad, pad, pad}), Int("group", groups)});
    if (act == "relu") return Node("Relu", {y});
    if (act == "hardswish") return Node("HardSwish", {y});
    if (act == "sigmoid") return Node("Sigmoid", {y});
    return y;
  }
  OnnxModel Finish(const std::string& out, int64_t size) {
    m_.opset = 13;
    m_.inputs = {{.name = "x", .dims = {-1, 3, size, size}, .has_shape = true}};
    m_.outputs = {{.name = out}};
    return m_;
  }

 private:
  std::mt19937 rng_;
  OnnxModel m_;
};

// Stem conv s2 -> maxpool -> [depthwise relu6 -> grouped hardswish] + residual add + relu -> SE-like
// broadcast multiply -> two branches (1x1 hardsigmoid | avgpool... ) concatenated -> 1x1 -> global pool ->
// flatten -> gemm (-> softmax).
OnnxModel SmallNet(int64_t classes, int64_t size, bool softmax) {
  Net n(11);
  std::string x = n.ConvBn("x", 3, 16, 3, 2, 1, "relu");
  x = n.Node(
      "MaxPool", {x},
      {Net::Ints("kernel_shape", {3, 3}), Net::Ints("strides", {2, 2}), Net::Ints("pads", {1, 1, 1, 1})});
  std::string b = n.ConvBn(x, 16, 16, 3, 1, 16, "relu6");
  b = n.ConvBn(b, 16, 16, 3, 1, 4, "hardswish");
  x = n.Node("Relu", {n.Node("Add", {x, b})});
  x = n.Node("Mul", {x, n.Weights({1, 16, 1, 1}, 0.5f, 1.0f)});
  std::string p = n.ConvBn(x, 16, 24, 1, 1, 1, "hardsigmoid");
  std::string q = n.Node("AveragePool", {x},
                         {Net::Ints("kernel_shape", {3, 3}), Net::Ints("strides", {1, 1}),
                          Net::Ints("pads", {1, 1, 1, 1}), Net::Int("count_include_pad", 1)});
  x = n.Node("Concat", {p, q}, {Net::Int("axis", 1)});
  x = n.ConvBn(x, 40, 32, 1, 1, 1, "");
  x = n.ConvBn(x, 32, 32, 3, 2, 1, "relu");  // stride 2, not 1x1: im2col
  x = n.Node("Flatten", {n.Node("GlobalAveragePool", {x})});
  x = n.Node("Gemm", {x, n.Weights({classes, 32}, 0.4f), n.Weights({classes}, 0.1f)},
             {Net::Int("transB", 1)});
  if (softmax) x = n.Node("Softmax", {x}, {Net::Int("axis", 1)});
  return n.Finish(x, size);
}

struct Compared {
  float max_abs = 0, range = 0, tol = 0;
  int top1_mismatch = 0;  // rows whose top-1 differs although the CPU's margin exceeds twice the tolerance
};

// Rows of `classes` scores: the worst |gpu - cpu|, the CPU's spread and the tolerance `rel` of it; top-1
// compared where the CPU's best beats its second by more than twice the tolerance (a near tie may flip).
Compared Compare(const std::vector<float>& cpu, const std::vector<float>& gpu, int64_t classes, float rel) {
  Compared c;
  const auto [lo, hi] = std::minmax_element(cpu.begin(), cpu.end());
  c.range = *hi - *lo;
  c.tol = rel * std::max(c.range, 1e-3f);
  for (size_t i = 0; i < cpu.size(); ++i) c.max_abs = std::max(c.max_abs, std::abs(cpu[i] - gpu[i]));
  for (size_t r = 0; r < cpu.size() / classes; ++r) {
    const float* a = cpu.data() + r * classes;
    const float* g = gpu.data() + r * classes;
    const int64_t ta = std::max_element(a, a + classes) - a, tg = std::max_element(g, g + classes) - g;
    float second = -INFINITY;
    for (int64_t k = 0; k < classes; ++k)
      if (k != ta) second = std::max(second, a[k]);
    if (ta != tg && a[ta] - second > 2 * c.tol) ++c.top1_mismatch;
  }
  return c;
}

std::shared_ptr<const CnnModel> Build(const OnnxModel& m) {
  auto model = CnnModel::FromOnnx(m, "small");
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? *model : nullptr;
}

// The CPU's scores for `x` ([dims] NCHW), the reference every backend is compared with.
struct CpuScores {
  std::vector<float> x, want;
  std::vector<int64_t> in_dims, dims;  // the input's, the scores'
};
CpuScores RunCpu(std::shared_ptr<const CnnModel> model, std::vector<int64_t> dims) {
  CpuScores r;
  r.in_dims = dims;
  r.x = stoke::cuda::testing::RandomFloats(static_cast<size_t>(NumElements(dims)), 5, -2, 2);
  CnnRunner cpu(model);
  ThreadPool pool(static_cast<int>(std::max(2u, std::thread::hardware_concurrency())));
  const Status st = cpu.Run(r.x.data(), dims, &r.want, &r.dims, pool);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return r;
}

// The GPU (conv backend `backend`) against the CPU's scores; relative tolerance `rel` of their range.
// `reps` runs (the second on reuses the plan and buffers); the fastest compute is printed.
void ExpectAgreesWith(std::shared_ptr<const CnnModel> model, const CpuScores& cpu,
                      const std::string& precision, const std::string& backend, float rel,
                      const std::string& what, int reps = 2) {
  ASSERT_FALSE(cpu.want.empty()) << what << ": the CPU run failed";
  auto dev = CreateCudaCnnModel(model, {.device = "cuda", .precision = precision, .conv_backend = backend});
  STATUS_ASSERT(dev.status());
  auto runner = (*dev)->CreateRunner();
  STATUS_ASSERT(runner.status());
  CnnDeviceTimes t;
  int64_t best_ns = INT64_MAX;
  std::vector<float> got;
  std::vector<int64_t> gd;
  for (int rep = 0; rep < reps; ++rep) {
    STATUS_ASSERT((*runner)->Run(cpu.x.data(), cpu.in_dims, &got, &gd, &t));
    ASSERT_EQ(gd, cpu.dims) << what;
    ASSERT_EQ(got.size(), cpu.want.size()) << what;
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what << ": a non-finite score";
    EXPECT_GT(t.compute_ns, 0) << what;
    best_ns = std::min(best_ns, t.compute_ns);
  }
  const Compared c = Compare(cpu.want, got, cpu.dims.back(), rel);
  EXPECT_LE(c.max_abs, c.tol) << what << " " << precision << " " << backend << ": max |gpu - cpu| "
                              << c.max_abs << " over a range of " << c.range;
  EXPECT_EQ(c.top1_mismatch, 0) << what << " " << precision << " " << backend;
  std::cout << what << " " << precision << " " << backend << " batch " << cpu.in_dims[0]
            << ": max |gpu - cpu| " << c.max_abs << " (range " << c.range << "), compute " << best_ns / 1000
            << " us\n";
}

// Both conv backends run every comparison; cudnn skips in a build without cuDNN.
class CudaCnnBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (GetParam() == "cudnn" && !CudnnInBuild()) GTEST_SKIP() << "this build has no cuDNN";
  }
  // CPU and GPU on the same random input.
  void ExpectAgrees(std::shared_ptr<const CnnModel> model, std::vector<int64_t> dims,
                    const std::string& precision, float rel, const std::string& what) {
    ExpectAgreesWith(model, RunCpu(model, std::move(dims)), precision, GetParam(), rel, what);
  }
};

TEST_P(CudaCnnBackendTest, SmallNetMatchesTheCpu) {
  auto model = Build(SmallNet(10, 32, false));
  ASSERT_NE(model, nullptr);
  for (int64_t batch : {1, 3, 8}) {
    ExpectAgrees(model, {batch, 3, 32, 32}, "fp16", 1e-2f, "small net");
    ExpectAgrees(model, {batch, 3, 32, 32}, "bf16", 4e-2f, "small net");
  }
  ExpectAgrees(model, {2, 3, 45, 37}, "fp16", 1e-2f, "small net, odd size");
}

// One step kind per graph, so a failure names the kernel: [N, 3, 20, 20] -> a 3->8 stem conv -> the op.
TEST_P(CudaCnnBackendTest, EachStepKindAloneMatchesTheCpu) {
  struct OneOp {
    const char* name;
    std::function<std::string(Net&, const std::string&)> op;  // x: [N, 8, 20, 20]
  };
  const std::vector<OneOp> ops = {
      {"conv 3x3", [](Net& n, const std::string& x) { return n.Conv(x, 8, 12, 3, 1, 1, 1, ""); }},
      {"conv 3x3 stride 2 relu",
       [](Net& n, const std::string& x) { return n.Conv(x, 8, 12, 3, 2, 1, 1, "relu"); }},
      {"conv 3x3 dilation 2", [](Net& n, const std::string& x) { return n.Conv(x, 8, 8, 3, 1, 1, 2, ""); }},
      {"conv 5x5 grouped 4",
       [](Net& n, const std::string& x) { return n.Conv(x, 8, 16, 5, 1, 4, 1, "hardswish"); }},
      {"conv depthwise", [](Net& n, const std::string& x) { return n.Conv(x, 8, 8, 3, 1, 8, 1, "relu"); }},
      {"conv depthwise x2 stride 2",
       [](Net& n, const std::string& x) { return n.Conv(x, 8, 16, 3, 2, 8, 1, ""); }},
      {"conv 1x1", [](Net& n, const std::string& x) { return n.Conv(x, 8, 20, 1, 1, 1, 1, "sigmoid"); }},
      {"conv 1x1 stride 2", [](Net& n, const std::string& x) { return n.Conv(x, 8, 20, 1, 2, 1, 1, ""); }},
      {"maxpool 3x3 s2",
       [](Net& n, const std::string& x) {
         return n.Node("MaxPool", {x},
                       {Net::Ints("kernel_shape", {3, 3}), Net::Ints("strides", {2, 2}),
                        Net::Ints("pads", {1, 1, 1, 1})});
       }},
      {"avgpool 2x2",
       [](Net& n, const std::string& x) {
         return n.Node("AveragePool", {x}, {Net::Ints("kernel_shape", {2, 2}), Net::Ints("strides", {2, 2})});
       }},
      {"add + relu",
       [](Net& n, const std::string& x) {
         return n.Node("Relu", {n.Node("Add", {x, n.Conv(x, 8, 8, 1, 1, 1, 1, "")})});
       }},
      {"sub broadcast",
       [](Net& n, const std::string& x) {
         return n.Node("Sub", {x, n.Weights({1, 8, 1, 1}, 1.0f)});
       }},
      {"relu alone", [](Net& n, const std::string& x) { return n.Node("Relu", {x}); }},
      {"concat",
       [](Net& n, const std::string& x) {
         return n.Node("Concat", {x, n.Conv(x, 8, 4, 1, 1, 1, 1, "")}, {Net::Int("axis", 1)});
       }},
      {"global pool + gemm",
       [](Net& n, const std::string& x) {
         const std::string f = n.Node("Flatten", {n.Node("GlobalAveragePool", {x})});
         return n.Node("Gemm", {f, n.Weights({6, 8}, 0.5f), n.Weights({6}, 0.1f)}, {Net::Int("transB", 1)});
       }},
  };
  for (const OneOp& o : ops) {
    Net n(static_cast<uint32_t>(std::hash<std::string>{}(o.name)));
    const std::string stem = n.Conv("x", 3, 8, 3, 1, 1, 1, "");
    const OnnxModel m = n.Finish(o.op(n, stem), 20);
    auto model = CnnModel::FromOnnx(m, o.name);
    ASSERT_TRUE(model.ok()) << o.name << ": " << model.status().message();
    ExpectAgrees(*model, {2, 3, 20, 20}, "fp16", 1e-2f, o.name);
  }
}

TEST_P(CudaCnnBackendTest, SoftmaxHeadMatchesTheCpu) {
  auto model = Build(SmallNet(7, 24, true));
  ASSERT_NE(model, nullptr);
  ExpectAgrees(model, {4, 3, 24, 24}, "fp16", 1e-2f, "softmax head");
}

// RunImages: RGB8 images resized and normalised on the device, against the CPU Preprocess + CnnRunner.
TEST_P(CudaCnnBackendTest, RunImagesMatchesCpuPreprocessAndRun) {
  auto model = Build(SmallNet(10, 32, false));
  ASSERT_NE(model, nullptr);
  image::PreprocessConfig cfg;
  cfg.height = 32;
  cfg.width = 32;
  cfg.resize_shorter = 36;
  std::vector<image::RgbImage> imgs;
  std::mt19937 rng(3);
  for (auto [w, h] : {std::pair{50, 40}, {33, 61}, {32, 32}}) {
    image::RgbImage im{.width = w, .height = h};
    im.pixels.resize(static_cast<size_t>(w * h * 3));
    for (uint8_t& p : im.pixels) p = static_cast<uint8_t>(rng() & 0xFF);
    imgs.push_back(std::move(im));
  }
  const int64_t per = 3 * cfg.height * cfg.width;
  std::vector<float> x(imgs.size() * per);
  std::vector<RgbView> views;
  for (size_t i = 0; i < imgs.size(); ++i) {
    image::Preprocess(imgs[i], cfg, x.data() + i * per);
    views.push_back({.pixels = imgs[i].pixels.data(), .width = imgs[i].width, .height = imgs[i].height});
  }
  CnnRunner cpu(model);
  ThreadPool pool(static_cast<int>(std::max(2u, std::thread::hardware_concurrency())));
  std::vector<float> want, got;
  std::vector<int64_t> wd, gd;
  STATUS_ASSERT(cpu.Run(x.data(), {static_cast<int64_t>(imgs.size()), 3, 32, 32}, &want, &wd, pool));
  auto dev = CreateCudaCnnModel(model, {.conv_backend = GetParam()});
  STATUS_ASSERT(dev.status());
  auto runner = (*dev)->CreateRunner();
  STATUS_ASSERT(runner.status());
  CnnDeviceTimes t;
  STATUS_ASSERT((*runner)->RunImages(views, cfg, &got, &gd, &t));
  ASSERT_EQ(gd, wd);
  const Compared c = Compare(want, got, wd.back(), 1e-2f);
  EXPECT_LE(c.max_abs, c.tol) << "range " << c.range;
  EXPECT_EQ(c.top1_mismatch, 0);
  EXPECT_GT(t.h2d_ns, 0);
  EXPECT_GT(t.preprocess_ns, 0);
}

TEST(CudaCnnTest, BadInputIsAnErrorNotACrash) {
  SKIP_WITHOUT_GPU();
  auto model = Build(SmallNet(10, 32, false));
  ASSERT_NE(model, nullptr);
  auto dev = CreateCudaCnnModel(model, {});
  STATUS_ASSERT(dev.status());
  auto runner = (*dev)->CreateRunner();
  STATUS_ASSERT(runner.status());
  std::vector<float> x(4 * 32 * 32, 0.5f), out;
  std::vector<int64_t> od;
  // 4 channels where the stem's weights take 3.
  Status st = (*runner)->Run(x.data(), {1, 4, 32, 32}, &out, &od, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("channels"), std::string::npos) << st.message();
  EXPECT_FALSE((*runner)->Run(x.data(), {1, 3, 32}, &out, &od, nullptr).ok());
  EXPECT_FALSE((*runner)->Run(x.data(), {0, 3, 32, 32}, &out, &od, nullptr).ok());
  image::PreprocessConfig cfg;
  const RgbView empty{};
  EXPECT_FALSE((*runner)->RunImages(std::span(&empty, 1), cfg, &out, &od, nullptr).ok());
  // The runner still works after the errors.
  x.resize(3 * 32 * 32);
  STATUS_ASSERT((*runner)->Run(x.data(), {1, 3, 32, 32}, &out, &od, nullptr));
  EXPECT_EQ(out.size(), 10u);
  EXPECT_EQ(CreateCudaCnnModel(model, {.precision = "fp8"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCnnModel(model, {.conv_backend = "winograd"}).status().code(),
            StatusCode::kInvalidArgument);
  if (!CudnnInBuild()) {
    EXPECT_EQ(CreateCudaCnnModel(model, {.conv_backend = "cudnn"}).status().code(),
              StatusCode::kFailedPrecondition);
  }
}

INSTANTIATE_TEST_SUITE_P(ConvBackends, CudaCnnBackendTest, ::testing::Values("im2col", "cudnn", "auto"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// Real models from files, `--onnx resnet50.onnx,mobilenet_v2.onnx` (main, below) (fixed or dynamic
// [N, 3, H, W]; dynamic H, W run at 224). Batch 1, 8, 32 and 64 (a fixed batch: that one), fp16, each conv
// backend against one CPU run; 5 runs each, the fastest compute printed (the bench hook: throughput per
// backend = batch / compute).
std::string g_onnx_files;  // set by main before the tests run

TEST(CudaCnnTest, OnnxFilesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  if (g_onnx_files.empty()) GTEST_SKIP() << "no --onnx files given";
  std::stringstream ss(g_onnx_files);
  std::string path;
  while (std::getline(ss, path, ',')) {
    auto model = CnnModel::Load(path);
    ASSERT_TRUE(model.ok()) << path << ": " << model.status().message();
    std::vector<int64_t> d = (*model)->input_dims();
    ASSERT_EQ(d.size(), 4u) << path;
    const std::string name = path.substr(path.find_last_of('/') + 1);
    for (int64_t batch : {1, 8, 32, 64}) {
      if (d[0] > 0 && batch != d[0]) continue;
      const CpuScores cpu = RunCpu(*model, {batch, 3, d[2] > 0 ? d[2] : 224, d[3] > 0 ? d[3] : 224});
      for (const char* backend : {"im2col", "cudnn"}) {
        if (std::string(backend) == "cudnn" && !CudnnInBuild()) continue;
        ExpectAgreesWith(*model, cpu, "fp16", backend, 2e-2f, name, 5);
      }
    }
  }
}

}  // namespace
}  // namespace stoke::cnn::cuda

// gtest's own flags first (InitGoogleTest removes them), then ours: --onnx FILES or --onnx=FILES.
int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--onnx" && i + 1 < argc) {
      stoke::cnn::cuda::g_onnx_files = argv[++i];
    } else if (a.starts_with("--onnx=")) {
      stoke::cnn::cuda::g_onnx_files = a.substr(7);
    } else {
      std::fprintf(stderr, "stoke_cnn_cuda_test: unknown argument '%s' (expected --onnx FILE[,FILE...])\n",
                   a.c_str());
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
