// The image classic model over a tiny CNN built in memory (no file, no server): the encoded form decodes PNG
// rows, both forms agree, a batch of requests gives each its own result, top-k is ordered and labelled, and
// a non-image is refused in Prepare naming its row.
#include "serve/batcher/image_classic_model.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cstring>

#include "base/thread_pool.h"
#include "engine/image/preprocess.h"

namespace stoke {
namespace {

// Conv 1x1 (3 -> 3 channels, identity) -> GlobalAveragePool -> Flatten: the scores are the mean of each
// normalised channel, so they are easy to predict.
std::shared_ptr<const cnn::CnnModel> MeanModel() {
  onnx::OnnxModel m;
  m.opset = 13;
  m.inputs = {{.name = "x", .dims = {-1, 3, 4, 6}, .has_shape = true}};
  m.outputs = {{.name = "y"}};
  m.initializers["w"] = {.name = "w",
                         .type = onnx::DataType::kFloat,
                         .dims = {3, 3, 1, 1},
                         .floats = {1, 0, 0, 0, 1, 0, 0, 0, 1}};
  m.nodes = {{.name = "c", .op_type = "Conv", .inputs = {"x", "w"}, .outputs = {"c"}},
             {.name = "g", .op_type = "GlobalAveragePool", .inputs = {"c"}, .outputs = {"g"}},
             {.name = "y", .op_type = "Flatten", .inputs = {"g"}, .outputs = {"y"}}};
  auto model = cnn::CnnModel::FromOnnx(m, "mean");
  EXPECT_TRUE(model.ok()) << model.status().message();
  return *model;
}

image::ImageModelConfig Config() {
  image::ImageModelConfig c;
  c.preprocess.height = 4;
  c.preprocess.width = 6;
  c.preprocess.resize = "stretch";
  c.preprocess.mean = {0, 0, 0};
  c.preprocess.std = {1, 1, 1};
  c.preprocess.scale = 1;
  c.labels = {"red", "green", "blue"};
  c.top_k = 2;
  return c;
}

// A flat 6x4 PNG of one colour.
std::string Png(uint8_t r, uint8_t g, uint8_t b) {
  std::vector<uint8_t> px;
  for (int i = 0; i < 24; ++i) px.insert(px.end(), {r, g, b});
  png_image p;
  std::memset(&p, 0, sizeof(p));
  p.version = PNG_IMAGE_VERSION;
  p.width = 6;
  p.height = 4;
  p.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&p, nullptr, &size, 0, px.data(), 0, nullptr));
  std::string out(size, '\0');
  EXPECT_TRUE(png_image_write_to_memory(&p, out.data(), &size, 0, px.data(), 0, nullptr));
  out.resize(size);
  return out;
}

InferTensor Images(const std::vector<std::string>& images) {
  InferTensor t{
      .name = "image", .type = TensorType::kBytes, .shape = {static_cast<int64_t>(images.size()), 1}};
  for (const std::string& i : images) AppendBytesElement(i, &t.data);
  return t;
}

std::vector<float> Floats(const InferTensor& t) {
  std::vector<float> v(t.data.size() / sizeof(float));
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

TEST(ImageClassicModelTest, EncodedBatchesGiveEachRequestItsOwnTopK) {
  auto model = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 2);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->num_classes(), 3);
  EXPECT_EQ((*model)->signature().inputs[0].name, "image");
  int64_t tokens = -1;
  auto a = (*model)->Prepare({Images({Png(200, 10, 50)})}, 1, &tokens);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = (*model)->Prepare({Images({Png(0, 0, 255), Png(5, 90, 20)})}, 2, &tokens);
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto inst = (*model)->CreateInstance(0, 1);
  ASSERT_TRUE(inst.ok());
  const PreparedInput* inputs[] = {a->get(), b->get()};
  const int64_t rows[] = {1, 2};
  std::vector<std::vector<InferTensor>> out(2);
  ExecTimes times;
  ASSERT_TRUE((*inst)->Execute(inputs, rows, &out, &times).ok());
  ASSERT_EQ(out[0].size(), 4u);
  EXPECT_EQ(out[0][0].name, "scores");
  EXPECT_EQ(out[0][0].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(Floats(out[0][0]), (std::vector<float>{200, 10, 50}));
  EXPECT_EQ(Floats(out[1][0]), (std::vector<float>{0, 0, 255, 5, 90, 20}));
  // top-k: indices best first, labels, probabilities of a softmax over the scores.
  std::vector<int64_t> idx(4);
  std::memcpy(idx.data(), out[1][1].data.data(), 4 * sizeof(int64_t));
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 0, 1, 2}));
  const auto labels = SplitBytesElements(out[1][3].data);
  ASSERT_EQ(labels.size(), 4u);
  EXPECT_EQ(labels[0], "blue");
  EXPECT_EQ(labels[2], "green");
  const std::vector<float> p = Floats(out[0][2]);
  EXPECT_NEAR(p[0], 1.0f, 1e-6f);  // exp(200) dominates
}

TEST(ImageClassicModelTest, TensorFormAgreesWithTheEncodedForm) {
  auto enc = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1);
  auto ten = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kTensor, 1);
  ASSERT_TRUE(enc.ok() && ten.ok());
  EXPECT_EQ((*ten)->signature().inputs[0].dims, (std::vector<int64_t>{3, 4, 6}));
  InferTensor t{.name = "input", .type = TensorType::kFp32, .shape = {1, 3, 4, 6}};
  std::vector<float> x(72);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 24; ++i) x[c * 24 + i] = c == 0 ? 7 : (c == 1 ? 8 : 9);
  t.data.assign(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  int64_t tokens = 0;
  auto pt = (*ten)->Prepare({t}, 1, &tokens);
  auto pe = (*enc)->Prepare({Images({Png(7, 8, 9)})}, 1, &tokens);
  ASSERT_TRUE(pt.ok() && pe.ok());
  std::vector<std::vector<InferTensor>> ot(1), oe(1);
  ExecTimes times;
  const int64_t rows[] = {1};
  const PreparedInput* it[] = {pt->get()};
  const PreparedInput* ie[] = {pe->get()};
  ASSERT_TRUE((*(*ten)->CreateInstance(0, 1))->Execute(it, rows, &ot, &times).ok());
  ASSERT_TRUE((*(*enc)->CreateInstance(0, 1))->Execute(ie, rows, &oe, &times).ok());
  EXPECT_EQ(Floats(ot[0][0]), Floats(oe[0][0]));
  EXPECT_EQ(Floats(ot[0][0]), (std::vector<float>{7, 8, 9}));
}

TEST(ImageClassicModelTest, PrepareRefusesANonImageNamingTheRow) {
  auto model = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1);
  ASSERT_TRUE(model.ok());
  int64_t tokens = 0;
  auto p = (*model)->Prepare({Images({Png(1, 2, 3), "GIF89a not a png"})}, 2, &tokens);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("input 'image' row 1: not a JPEG or PNG image"), std::string::npos)
      << p.status().message();
}

TEST(ImageClassicModelTest, LabelsMustMatchTheClasses) {
  image::ImageModelConfig c = Config();
  c.labels = {"only", "two"};
  auto model = ImageClassicModel::Create(MeanModel(), c, ImageInputForm::kEncoded, 1);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("2 labels for 3 classes"), std::string::npos);
}

// A device that computes on the CPU (CnnRunner) and reports fixed device times: checks the wiring of a GPU
// instance (which call, which ledger stages) without a GPU.
struct FakeCalls {
  int run = 0, run_images = 0, run_encoded = 0;
};

class FakeRunner final : public CnnDeviceRunner {
 public:
  FakeRunner(std::shared_ptr<const cnn::CnnModel> m, FakeCalls* calls) : cpu_(std::move(m)), calls_(calls) {}
  Status Run(const float* x, const std::vector<int64_t>& dims, std::vector<float>* out,
             std::vector<int64_t>* out_dims, CnnDeviceTimes* t) override {
    ++calls_->run;
    *t = {.preprocess_ns = 0, .h2d_ns = 1000, .compute_ns = 2000, .d2h_ns = 300, .host_ns = 50};
    return cpu_.Run(x, dims, out, out_dims, pool_);
  }
  Status RunImages(std::span<const RgbView> images, const image::PreprocessConfig& cfg,
                   std::vector<float>* out, std::vector<int64_t>* out_dims, CnnDeviceTimes* t) override {
    ++calls_->run_images;
    const int64_t per = 3 * cfg.height * cfg.width;
    std::vector<float> x(images.size() * per);
    for (size_t i = 0; i < images.size(); ++i) {
      image::RgbImage im{.width = images[i].width, .height = images[i].height};
      im.pixels.assign(images[i].pixels, images[i].pixels + im.width * im.height * 3);
      image::Preprocess(im, cfg, x.data() + i * per);
    }
    *t = {.preprocess_ns = 400, .h2d_ns = 1000, .compute_ns = 2000, .d2h_ns = 300, .host_ns = 50};
    return cpu_.Run(x.data(), {static_cast<int64_t>(images.size()), 3, cfg.height, cfg.width}, out, out_dims,
                    pool_);
  }
  // Decodes on the host, then as RunImages (whose count it undoes): stands in for nvJPEG.
  Status RunEncoded(std::span<const std::string_view> images, const image::PreprocessConfig& cfg,
                    std::vector<float>* out, std::vector<int64_t>* out_dims, CnnDeviceTimes* t) override {
    ++calls_->run_encoded;
    std::vector<image::RgbImage> decoded(images.size());
    std::vector<RgbView> views;
    for (size_t i = 0; i < images.size(); ++i) {
      RETURN_IF_ERROR(image::DecodeImage(images[i], &decoded[i]));
      views.push_back(
          {.pixels = decoded[i].pixels.data(), .width = decoded[i].width, .height = decoded[i].height});
    }
    RETURN_IF_ERROR(RunImages(views, cfg, out, out_dims, t));
    --calls_->run_images;
    t->h2d_ns = 0;  // the bitstreams go up inside the decoder
    return OkStatus();
  }

 private:
  cnn::CnnRunner cpu_;
  ThreadPool pool_{1};
  FakeCalls* calls_;
};

class FakeDevice final : public CnnDeviceModel {
 public:
  explicit FakeDevice(FakeCalls* calls, bool decodes_jpeg = false) : calls_(calls), jpeg_(decodes_jpeg) {}
  std::string device_name() const override { return "fake:0"; }
  bool decodes_jpeg() const override { return jpeg_; }
  StatusOr<std::unique_ptr<CnnDeviceRunner>> CreateRunner() override {
    return std::unique_ptr<CnnDeviceRunner>(new FakeRunner(MeanModel(), calls_));
  }

 private:
  FakeCalls* calls_;
  bool jpeg_;
};

// Two PNGs (pixels 7,8,9 and 1,2,3) through `m` as one batch on a new instance: the outputs, `times` filled.
void ExecuteTwoPngs(ImageClassicModel& m, std::vector<std::vector<InferTensor>>* out, ExecTimes* times) {
  int64_t tokens = 0;
  auto pe = m.Prepare({Images({Png(7, 8, 9), Png(1, 2, 3)})}, 2, &tokens);
  ASSERT_TRUE(pe.ok());
  auto inst = m.CreateInstance(0, 1);
  ASSERT_TRUE(inst.ok()) << inst.status().message();
  out->assign(1, {});
  const int64_t rows[] = {2};
  const PreparedInput* in[] = {pe->get()};
  ASSERT_TRUE((*inst)->Execute(in, rows, out, times).ok());
}

TEST(ImageClassicModelTest, OnADeviceWithGpuPreprocessing) {
  FakeCalls calls;
  auto dev = std::make_shared<FakeDevice>(&calls);
  auto enc = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1,
                                       {.model = dev, .gpu_preprocess = true});
  auto ten = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kTensor, 1,
                                       {.model = dev, .gpu_preprocess = true});
  ASSERT_TRUE(enc.ok() && ten.ok()) << enc.status().message() << ten.status().message();
  EXPECT_EQ((*enc)->device_name(), "fake:0, gpu preprocessing");
  EXPECT_EQ((*ten)->device_name(), "fake:0");  // the tensor form has nothing to preprocess
  std::vector<std::vector<InferTensor>> out;
  ExecTimes times;
  ASSERT_NO_FATAL_FAILURE(ExecuteTwoPngs(**enc, &out, &times));
  EXPECT_EQ(calls.run_images, 1);
  EXPECT_EQ(calls.run, 0);
  EXPECT_EQ(Floats(out[0][0]), (std::vector<float>{7, 8, 9, 1, 2, 3}));
  // The device's stages go to the ledger; its resize time and host waiting count as preprocess.
  EXPECT_EQ(times.h2d, 1000);
  EXPECT_EQ(times.compute, 2000);
  EXPECT_EQ(times.d2h, 300);
  EXPECT_GE(times.preprocess, 450);

  InferTensor t{.name = "input", .type = TensorType::kFp32, .shape = {1, 3, 4, 6}};
  std::vector<float> x(72, 4.0f);
  t.data.assign(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
  int64_t tokens = 0;
  auto pt = (*ten)->Prepare({t}, 1, &tokens);
  ASSERT_TRUE(pt.ok());
  const int64_t one[] = {1};
  const PreparedInput* it[] = {pt->get()};
  ASSERT_TRUE((*(*ten)->CreateInstance(0, 1))->Execute(it, one, &out, &times).ok());
  EXPECT_EQ(calls.run, 1);
  EXPECT_EQ(Floats(out[0][0]), (std::vector<float>{4, 4, 4}));
}

TEST(ImageClassicModelTest, GpuPreprocessingNeedsTheModelOnTheGpu) {
  auto m =
      ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1, {.gpu_preprocess = true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("--device cuda"), std::string::npos) << m.status().message();
}

// --preprocess nvjpeg: the encoded bytes go to the device (RunEncoded), nothing is decoded on the pool, and
// the device's decode + resize time is the ledger's preprocess (no h2d).
TEST(ImageClassicModelTest, NvjpegHandsTheBytesToTheDevice) {
  FakeCalls calls;
  auto dev = std::make_shared<FakeDevice>(&calls, /*decodes_jpeg=*/true);
  auto enc = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1,
                                       {.model = dev, .gpu_preprocess = true, .gpu_decode = true});
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  EXPECT_EQ((*enc)->device_name(), "fake:0, nvjpeg decoding + gpu preprocessing");
  std::vector<std::vector<InferTensor>> out;
  ExecTimes times;
  ASSERT_NO_FATAL_FAILURE(ExecuteTwoPngs(**enc, &out, &times));
  EXPECT_EQ(calls.run_encoded, 1);
  EXPECT_EQ(calls.run_images, 0);
  EXPECT_EQ(calls.run, 0);
  EXPECT_EQ(Floats(out[0][0]), (std::vector<float>{7, 8, 9, 1, 2, 3}));
  EXPECT_EQ(times.h2d, 0);
  EXPECT_EQ(times.compute, 2000);
  EXPECT_GE(times.preprocess, 450);
}

TEST(ImageClassicModelTest, NvjpegNeedsADeviceThatDecodesJpeg) {
  FakeCalls calls;
  auto dev = std::make_shared<FakeDevice>(&calls, /*decodes_jpeg=*/false);
  auto m = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1,
                                     {.model = dev, .gpu_preprocess = true, .gpu_decode = true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("this build has no nvJPEG"), std::string::npos) << m.status().message();
  m = ImageClassicModel::Create(MeanModel(), Config(), ImageInputForm::kEncoded, 1,
                                {.gpu_preprocess = true, .gpu_decode = true});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--preprocess nvjpeg: the model runs on the CPU"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace stoke
