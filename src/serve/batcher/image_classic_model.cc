#include "serve/batcher/image_classic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/logging.h"
#include "base/thread_pool.h"
#include "engine/image/image_decode.h"

namespace stoke {
namespace {

struct ImageRows : PreparedInput {
  std::string encoded;        // encoded form: the BYTES tensor's data (length-prefixed elements)
  std::vector<float> pixels;  // tensor form: [rows, 3, H, W]
};

Nanos Now() {
  return MonotonicNanos();
}

class ImageInstance final : public ModelInstance {
 public:
  ImageInstance(std::shared_ptr<const cnn::CnnModel> model, const ImageClassicModel* owner,
                ImageInputForm form, int threads, std::unique_ptr<CnnDeviceRunner> device,
                bool gpu_preprocess, bool gpu_decode)
      : owner_(owner),
        form_(form),
        runner_(std::move(model)),
        pool_(threads),
        device_(std::move(device)),
        gpu_preprocess_(gpu_preprocess && form == ImageInputForm::kEncoded),
        gpu_decode_(gpu_decode && gpu_preprocess_) {}

  Status Execute(std::span<const PreparedInput* const> inputs, std::span<const int64_t> rows,
                 std::vector<std::vector<InferTensor>>* outputs, ExecTimes* times) override {
    const Nanos t0 = Now();
    const image::PreprocessConfig& pc = owner_->config().preprocess;
    const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    const int64_t per_row = 3 * pc.height * pc.width;
    if (!gpu_preprocess_) batch_.resize(static_cast<size_t>(total * per_row));
    if (form_ == ImageInputForm::kTensor) {
      int64_t at = 0;
      for (const PreparedInput* in : inputs) {
        const auto& px = static_cast<const ImageRows*>(in)->pixels;
        std::memcpy(batch_.data() + at, px.data(), px.size() * sizeof(float));
        at += static_cast<int64_t>(px.size());
      }
    } else {
      RETURN_IF_ERROR(SplitRows(inputs, total));
      if (!gpu_decode_) RETURN_IF_ERROR(DecodeBatch(pc, per_row, total));
    }
    const Nanos t1 = Now();
    std::vector<int64_t> od;
    const std::vector<int64_t> dims = {total, 3, pc.height, pc.width};
    CnnDeviceTimes dt;
    if (gpu_decode_) {
      RETURN_IF_ERROR(device_->RunEncoded(elements_, pc, &scores_, &od, &dt));
    } else if (gpu_preprocess_) {
      views_.clear();
      for (const image::RgbImage& im : decoded_) {
        views_.push_back({.pixels = im.pixels.data(), .width = im.width, .height = im.height});
      }
      RETURN_IF_ERROR(device_->RunImages(views_, pc, &scores_, &od, &dt));
    } else if (device_ != nullptr) {
      RETURN_IF_ERROR(device_->Run(batch_.data(), dims, &scores_, &od, &dt));
    } else {
      RETURN_IF_ERROR(runner_.Run(batch_.data(), dims, &scores_, &od, pool_));
    }
    const Nanos t2 = Now();
    const int64_t classes = owner_->num_classes();
    if (static_cast<int64_t>(scores_.size()) != total * classes) {
      return InternalError("the model returned {} values for {} rows of {} classes", scores_.size(), total,
                           classes);
    }
    int64_t row = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      (*outputs)[i] = Outputs(scores_.data() + row * classes, rows[i], classes);
      row += rows[i];
    }
    if (device_ != nullptr) {
      // Staging into pinned memory and waiting for the device count as assembling the batch.
      times->preprocess = (t1 - t0) + dt.preprocess_ns + dt.host_ns;
      times->h2d = dt.h2d_ns;
      times->compute = dt.compute_ns;
      times->d2h = dt.d2h_ns;
    } else {
      times->preprocess = t1 - t0;
      times->compute = t2 - t1;
    }
    times->postprocess = Now() - t2;
    return OkStatus();
  }

 private:
  // The batch's images, one per row, and the request each came from.
  Status SplitRows(std::span<const PreparedInput* const> inputs, int64_t total) {
    elements_.clear();
    owners_.clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (std::string_view e : SplitBytesElements(static_cast<const ImageRows*>(inputs[i])->encoded)) {
        elements_.push_back(e);
        owners_.push_back(i);
      }
    }
    if (static_cast<int64_t>(elements_.size()) != total) {
      return InternalError("{} images for {} rows", elements_.size(), total);
    }
    return OkStatus();
  }

  // Decode + preprocess every row, one image per task on the pool.
  Status DecodeBatch(const image::PreprocessConfig& pc, int64_t per_row, int64_t total) {
    std::vector<Status> status(elements_.size());
    if (gpu_preprocess_) decoded_.resize(elements_.size());
    pool_.ParallelFor(total, 1, [&](int64_t a, int64_t b) {
      image::RgbImage img;
      for (int64_t r = a; r < b; ++r) {
        if (gpu_preprocess_) {  // decode only: resize + normalise run on the device
          status[r] = image::DecodeImage(elements_[r], &decoded_[r]);
          continue;
        }
        status[r] = image::DecodeImage(elements_[r], &img);
        if (status[r].ok()) image::Preprocess(img, pc, batch_.data() + r * per_row);
      }
    });
    for (size_t r = 0; r < status.size(); ++r) {
      if (!status[r].ok()) {
        return status[r].WithContext(fmt::format("image of request {} in the batch", owners_[r]));
      }
    }
    return OkStatus();
  }

  std::vector<InferTensor> Outputs(const float* scores, int64_t rows, int64_t classes) const {
    const image::ImageModelConfig& cfg = owner_->config();
    const int64_t k = std::min<int64_t>(cfg.top_k, classes);
    InferTensor s{.name = "scores", .type = TensorType::kFp32, .shape = {rows, classes}};
    s.data.assign(reinterpret_cast<const char*>(scores), static_cast<size_t>(rows * classes) * sizeof(float));
    InferTensor idx{.name = "top_k_index", .type = TensorType::kInt64, .shape = {rows, k}};
    InferTensor sc{.name = "top_k_score", .type = TensorType::kFp32, .shape = {rows, k}};
    InferTensor lab{.name = "top_k_label", .type = TensorType::kBytes, .shape = {rows, k}};
    std::vector<int64_t> order(static_cast<size_t>(classes));
    std::vector<float> prob(static_cast<size_t>(classes));
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = scores + r * classes;
      if (owner_->graph_ends_with_softmax()) {
        std::copy(x, x + classes, prob.begin());
      } else {
        const float m = *std::max_element(x, x + classes);
        double sum = 0;
        for (int64_t c = 0; c < classes; ++c) sum += prob[c] = std::exp(x[c] - m);
        for (int64_t c = 0; c < classes; ++c) prob[c] = static_cast<float>(prob[c] / sum);
      }
      std::iota(order.begin(), order.end(), 0);
      // Ties keep the lower index first.
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = order[j];
        idx.data.append(reinterpret_cast<const char*>(&c), sizeof(c));
        sc.data.append(reinterpret_cast<const char*>(&prob[c]), sizeof(float));
        AppendBytesElement(c < static_cast<int64_t>(cfg.labels.size()) ? cfg.labels[c] : std::to_string(c),
                           &lab.data);
      }
    }
    std::vector<InferTensor> out;
    out.push_back(std::move(s));
    out.push_back(std::move(idx));
    out.push_back(std::move(sc));
    out.push_back(std::move(lab));
    return out;
  }

  const ImageClassicModel* owner_;
  const ImageInputForm form_;
  cnn::CnnRunner runner_;
  ThreadPool pool_;
  std::unique_ptr<CnnDeviceRunner> device_;  // null: the CPU (runner_)
  const bool gpu_preprocess_;
  const bool gpu_decode_;                 // the encoded bytes go to device_->RunEncoded (nvJPEG)
  std::vector<image::RgbImage> decoded_;  // gpu_preprocess_: the batch's images, decoded
  std::vector<RgbView> views_;
  std::vector<float> batch_;   // [rows, 3, H, W]
  std::vector<float> scores_;  // [rows, classes]
  std::vector<std::string_view> elements_;
  std::vector<size_t> owners_;
};

}  // namespace

StatusOr<std::shared_ptr<ImageClassicModel>> ImageClassicModel::Create(
    std::shared_ptr<const cnn::CnnModel> model, image::ImageModelConfig config, ImageInputForm form,
    int threads, ImageDevice device) {
  RETURN_IF_ERROR(config.preprocess.Validate());
  if (device.gpu_preprocess && device.model == nullptr) {
    return FailedPreconditionError(
        "--preprocess {}: the model runs on the CPU; GPU preprocessing needs the model on the GPU too "
        "(--device cuda)",
        device.gpu_decode ? "nvjpeg" : "gpu");
  }
  if (device.gpu_decode && (device.model == nullptr || !device.model->decodes_jpeg())) {
    return FailedPreconditionError(
        "--preprocess nvjpeg: this build has no nvJPEG (the GPU JPEG decoder; scripts/setup.sh installs the "
        "nvidia-nvjpeg wheel, then rebuild); --preprocess gpu decodes on the CPU and resizes on the GPU");
  }
  auto m = std::shared_ptr<ImageClassicModel>(new ImageClassicModel());
  m->model_ = std::move(model);
  m->config_ = std::move(config);
  m->form_ = form;
  m->device_ = std::move(device);
  m->threads_ = threads > 0 ? threads : ThreadPool::Default().num_threads();
  const image::PreprocessConfig& pc = m->config_.preprocess;
  const std::vector<int64_t>& fd = m->model_->input_dims();
  if (fd.size() == 4) {
    if (fd[1] > 0 && fd[1] != 3) {
      return InvalidArgumentError("input '{}' has {} channels; image models take 3", m->model_->input_name(),
                                  fd[1]);
    }
    if ((fd[2] > 0 && fd[2] != pc.height) || (fd[3] > 0 && fd[3] != pc.width)) {
      return InvalidArgumentError("the preprocessing makes {}x{} images but input '{}' is {}x{}", pc.height,
                                  pc.width, m->model_->input_name(), fd[2], fd[3]);
    }
  }
  // One dry run at batch 1 learns the output size and proves the graph runs at this input size.
  cnn::CnnRunner runner(m->model_);
  ThreadPool pool(1);
  std::vector<float> x(static_cast<size_t>(3 * pc.height * pc.width), 0.0f), y;
  std::vector<int64_t> od;
  RETURN_IF_ERROR(runner.Run(x.data(), {1, 3, pc.height, pc.width}, &y, &od, pool));
  if (od.empty() || od[0] != 1) {
    return InvalidArgumentError("output '{}' is {}, not [batch, classes]", m->model_->output_name(),
                                cnn::DimsString(od));
  }
  m->classes_ = static_cast<int64_t>(y.size());
  if (!m->config_.labels.empty() && static_cast<int64_t>(m->config_.labels.size()) != m->classes_) {
    return InvalidArgumentError("{} labels for {} classes", m->config_.labels.size(), m->classes_);
  }
  if (form == ImageInputForm::kEncoded) {
    m->signature_.inputs = {{"image", TensorType::kBytes, {1}}};
  } else {
    m->signature_.inputs = {{"input", TensorType::kFp32, {3, pc.height, pc.width}}};
  }
  const int64_t k = std::min<int64_t>(m->config_.top_k, m->classes_);
  m->signature_.outputs = {{"scores", TensorType::kFp32, {m->classes_}},
                           {"top_k_index", TensorType::kInt64, {k}},
                           {"top_k_score", TensorType::kFp32, {k}},
                           {"top_k_label", TensorType::kBytes, {k}}};
  return m;
}

StatusOr<std::unique_ptr<PreparedInput>> ImageClassicModel::Prepare(std::vector<InferTensor> inputs,
                                                                    int64_t rows, int64_t* tokens) const {
  auto in = std::make_unique<ImageRows>();
  *tokens = 0;
  if (form_ == ImageInputForm::kTensor) {
    in->pixels.resize(static_cast<size_t>(inputs[0].NumElements()));
    std::memcpy(in->pixels.data(), inputs[0].data.data(), in->pixels.size() * sizeof(float));
    return std::unique_ptr<PreparedInput>(std::move(in));
  }
  int64_t k = 0;
  for (std::string_view e : SplitBytesElements(inputs[0].data)) {
    int64_t w = 0, h = 0;
    RETURN_IF_ERROR(image::ProbeImage(e, &w, &h).WithContext(fmt::format("input 'image' row {}", k)));
    ++k;
  }
  in->encoded = std::move(inputs[0].data);
  return std::unique_ptr<PreparedInput>(std::move(in));
}

StatusOr<std::unique_ptr<ModelInstance>> ImageClassicModel::CreateInstance(int index, int count) {
  const int threads = std::max(1, threads_ / std::max(1, count));
  std::unique_ptr<CnnDeviceRunner> runner;
  if (device_.model != nullptr) {
    ASSIGN_OR_RETURN(runner, device_.model->CreateRunner());
  }
  LOG_INFO("image model: instance {} of {} on {} with {} CPU thread(s)", index, count, device_name(),
           threads);
  return std::unique_ptr<ModelInstance>(new ImageInstance(model_, this, form_, threads, std::move(runner),
                                                          device_.gpu_preprocess, device_.gpu_decode));
}

std::string ImageClassicModel::device_name() const {
  if (device_.model == nullptr) return "cpu";
  if (!device_.gpu_preprocess || form_ != ImageInputForm::kEncoded) return device_.model->device_name();
  return device_.model->device_name() +
         (device_.gpu_decode ? ", nvjpeg decoding + gpu preprocessing" : ", gpu preprocessing");
}

}  // namespace stoke
