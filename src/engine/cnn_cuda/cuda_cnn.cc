#include "engine/cnn_cuda/cuda_cnn.h"

#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <vector>

#include "base/clock.h"
#include "base/half.h"
#include "engine/cnn_cuda/cnn_kernels.h"
#include "engine/cnn_cuda/cudnn_conv.h"
#include "engine/cnn_cuda/device_memory.h"
#include "engine/image/preprocess.h"
#include "engine/image_cuda/jpeg_decode_gpu.h"
#include "engine/image_cuda/resize_normalize.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/device.h"

namespace stoke::cnn::cuda {
namespace {

constexpr size_t kElem = 2;  // bytes of one fp16 / bf16 activation or weight

int64_t RoundUp8(int64_t v) {
  return (v + 7) / 8 * 8;
}

ActParams ToAct(const cpu::ActivationParams& a) {
  return {.kind = static_cast<int>(a.kind), .lo = a.lo, .hi = a.hi, .alpha = a.alpha, .beta = a.beta};
}

// The sliding-window fields a CPU shape (Conv2dShape, Pool2dShape) and a kernel geometry (ConvGeom,
// PoolGeom) share, copied in one place; each caller sets the rest.
template <typename Geom, typename Shape>
Geom WindowGeom(const Shape& s) {
  Geom g;
  g.batch = s.batch, g.in_h = s.in_h, g.in_w = s.in_w, g.out_h = s.out_h, g.out_w = s.out_w;
  g.kernel_h = s.kernel_h, g.kernel_w = s.kernel_w, g.stride_h = s.stride_h, g.stride_w = s.stride_w;
  g.pad_top = s.pad_top, g.pad_left = s.pad_left, g.dilation_h = s.dilation_h, g.dilation_w = s.dilation_w;
  return g;
}

// A conv's packed weights on the device. General: [out_c, group_ld] (a row per output channel: its group's
// [kernel_h, kernel_w, in_c / groups] taps, then zeros up to a multiple of 8 for aligned GEMM rows);
// depthwise: [kernel_h, kernel_w, out_c] as packed for the CPU.
struct NodeWeights {
  DeviceMemory w;
  DeviceMemory w_krsc;  // cuDNN: [out_c, kernel_h, kernel_w, in_c / groups] unpadded, when w has padding
  DeviceMemory bias16;  // cuDNN: the bias in the 16-bit type (zeros when the conv has none)
  DeviceMemory bias;    // fp32 [out_c] / [n]; empty = none
  DeviceMemory scale;   // kChannelAffine: fp32 [channels]
  DeviceMemory shift;
  int64_t group_ld = 0;
  bool depthwise = false;
};

class CudaCnnModel final : public CnnDeviceModel, public std::enable_shared_from_this<CudaCnnModel> {
 public:
  CudaCnnModel(std::shared_ptr<const CnnModel> model, CnnDeviceOptions options, std::string name)
      : model_(std::move(model)), options_(std::move(options)), name_(std::move(name)) {
    elem_ = options_.precision == "bf16" ? ElemType::kBF16 : ElemType::kF16;
    cudnn_ = options_.conv_backend != "im2col" && CudnnInBuild();
  }

  std::string device_name() const override {
    return name_;
  }
  bool decodes_jpeg() const override {
    return image::cuda::NvjpegInBuild();
  }
  StatusOr<std::unique_ptr<CnnDeviceRunner>> CreateRunner() override;

  Status Upload() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
    for (const CnnNode& n : model_->graph().nodes) {
      if (n.dead) continue;
      if (n.kind == OpKind::kConv) RETURN_IF_ERROR(UploadConv(n).WithContext(n.src.Describe()));
      if (n.kind == OpKind::kGemm) {
        NodeWeights& nw = weights_[&n];
        RETURN_IF_ERROR(UploadElems(n.gemm.weights, &nw.w));
        RETURN_IF_ERROR(UploadFloats(n.gemm.bias, &nw.bias));
      }
      if (n.kind == OpKind::kChannelAffine) {
        NodeWeights& nw = weights_[&n];
        RETURN_IF_ERROR(UploadFloats(n.scale, &nw.scale));
        RETURN_IF_ERROR(UploadFloats(n.shift, &nw.shift));
      }
    }
    return OkStatus();
  }

  // Host fp32 -> the device's 16-bit type, in `elem_`.
  std::vector<uint16_t> ToElems(const float* x, size_t n) const {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = elem_ == ElemType::kBF16 ? Fp32ToBf16(x[i]) : Fp32ToFp16(x[i]);
    return h;
  }

  const NodeWeights* Weights(const CnnNode* n) const {
    auto it = weights_.find(n);
    return it == weights_.end() ? nullptr : &it->second;
  }
  const CnnModel& model() const {
    return *model_;
  }
  ElemType elem() const {
    return elem_;
  }
  int gpu_index() const {
    return options_.gpu_index;
  }
  // Whether a plan for `batch` images runs its (non-depthwise) convs through cuDNN. `auto` takes cuDNN from
  // kAutoCudnnMinBatch images: measured on the H200 (bench/results/gpu_images_cudnn_h200_2026-12-04.json), im2col
  // is 3.4x faster at batch 1 on ResNet-50 and still ahead at batch 8, cuDNN 1.8x faster at 32 and 2.9x at 64
  // (MobileNetV2: im2col ahead up to 32, cuDNN 10 % ahead at 64).
  static constexpr int64_t kAutoCudnnMinBatch = 32;
  bool cudnn_compiled_in() const {
    return cudnn_;
  }
  bool cudnn(int64_t batch) const {
    return cudnn_ && (options_.conv_backend == "cudnn" || batch >= kAutoCudnnMinBatch);
  }

 private:
  Status UploadConv(const CnnNode& n) {
    const ConvParams& c = n.conv;
    if (!c.packed) return InternalError("conv weights are not packed");
    NodeWeights& nw = weights_[&n];
    const int64_t in_c = c.in_c_per_group * c.groups;
    nw.depthwise = c.groups > 1 && c.groups == in_c && c.out_c % in_c == 0;
    RETURN_IF_ERROR(UploadFloats(c.bias, &nw.bias));
    if (nw.depthwise) return UploadElems(c.weights, &nw.w);
    const int64_t k = c.kernel_h * c.kernel_w * c.in_c_per_group;
    nw.group_ld = RoundUp8(k);
    if (cudnn_) {
      if (nw.group_ld != k) RETURN_IF_ERROR(UploadElems(c.weights, &nw.w_krsc));
      std::vector<float> b = c.bias;
      b.resize(static_cast<size_t>(c.out_c), 0.0f);
      RETURN_IF_ERROR(UploadElems(b, &nw.bias16));
    }
    std::vector<float> padded(static_cast<size_t>(c.out_c * nw.group_ld), 0.0f);
    for (int64_t o = 0; o < c.out_c; ++o)
      std::copy_n(c.weights.data() + o * k, k, padded.data() + o * nw.group_ld);
    return UploadElems(padded, &nw.w);
  }

  Status UploadElems(const std::vector<float>& v, DeviceMemory* m) const {
    const std::vector<uint16_t> h = ToElems(v.data(), v.size());
    RETURN_IF_ERROR(m->Reserve(std::max<size_t>(1, h.size()) * kElem));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(m->get(), h.data(), h.size() * kElem, cudaMemcpyHostToDevice));
    return OkStatus();
  }
  static Status UploadFloats(const std::vector<float>& v, DeviceMemory* m) {
    if (v.empty()) return OkStatus();
    RETURN_IF_ERROR(m->Reserve(v.size() * sizeof(float)));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(m->get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return OkStatus();
  }

  std::shared_ptr<const CnnModel> model_;
  CnnDeviceOptions options_;
  std::string name_;
  ElemType elem_ = ElemType::kF16;
  bool cudnn_ = false;  // non-depthwise convs through cuDNN (options_.conv_backend)
  std::map<const CnnNode*, NodeWeights> weights_;
};

// One input shape's plan, with what the GPU adds: constant operands on the device, and which activation
// steps are fused into the binary step before them.
struct GpuPlan {
  std::unique_ptr<CnnPlan> plan;
  std::map<int, DeviceMemory> consts;  // value id -> its 16-bit copy
  std::vector<bool> fused;             // per step: an activation folded into the step before it
  int64_t im2col_elems = 0;            // the largest im2col matrix of any conv step
  std::vector<CudnnConvStepPtr> cudnn;  // per step: the conv's cuDNN setup; null: not through cuDNN
};

class CudaCnnRunner final : public CnnDeviceRunner {
 public:
  explicit CudaCnnRunner(std::shared_ptr<const CudaCnnModel> model) : model_(std::move(model)) {}
  ~CudaCnnRunner() override {
    for (cudaEvent_t e : ev_)
      if (e != nullptr) cudaEventDestroy(e);
    if (blas_ != nullptr) cublasDestroy(blas_);
    plans_.clear();  // their cuDNN descriptors before the handle
    dnn_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init() {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(model_->gpu_index()));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : ev_) CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    CUBLAS_RETURN_IF_ERROR(cublasCreate(&blas_));
    CUBLAS_RETURN_IF_ERROR(cublasSetStream(blas_, stream_));
    if (model_->cudnn_compiled_in()) {
      ASSIGN_OR_RETURN(dnn_, CudnnConvs::Create(stream_));
    }
    return OkStatus();
  }

  Status Run(const float* x, const std::vector<int64_t>& dims, std::vector<float>* out,
             std::vector<int64_t>* out_dims, CnnDeviceTimes* times) override {
    const Nanos t0 = MonotonicNanos();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(model_->gpu_index()));
    ASSIGN_OR_RETURN(GpuPlan * p, GetPlan(dims));
    const int64_t n = NumElements(dims);
    RETURN_IF_ERROR(ReserveInput(n));
    RETURN_IF_ERROR(host_in_.Reserve(static_cast<size_t>(n) * sizeof(float)));
    std::memcpy(host_in_.as<float>(), x, static_cast<size_t>(n) * sizeof(float));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[0], stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(in_f32_.get(), host_in_.as<float>(),
                                         static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice,
                                         stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[1], stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[2], stream_));  // no device preprocessing
    return Finish(*p, t0, out, out_dims, times);
  }

  Status RunImages(std::span<const RgbView> images, const image::PreprocessConfig& cfg,
                   std::vector<float>* out, std::vector<int64_t>* out_dims, CnnDeviceTimes* times) override {
    const Nanos t0 = MonotonicNanos();
    if (images.empty()) return InvalidArgumentError("no images");
    RETURN_IF_ERROR(cfg.Validate());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(model_->gpu_index()));
    size_t bytes = 0;
    for (const RgbView& im : images) {
      if (im.pixels == nullptr || im.width < 1 || im.height < 1) {
        return InvalidArgumentError("empty image ({}x{})", im.width, im.height);
      }
      bytes += static_cast<size_t>(im.width * im.height * 3);
    }
    const std::vector<int64_t> dims = {static_cast<int64_t>(images.size()), 3, cfg.height, cfg.width};
    ASSIGN_OR_RETURN(GpuPlan * p, GetPlan(dims));
    RETURN_IF_ERROR(ReserveInput(NumElements(dims)));
    RETURN_IF_ERROR(host_in_.Reserve(bytes));
    RETURN_IF_ERROR(rgb_.Reserve(bytes));
    size_t at = 0;
    for (const RgbView& im : images) {
      const size_t b = static_cast<size_t>(im.width * im.height * 3);
      std::memcpy(host_in_.as<uint8_t>() + at, im.pixels, b);
      at += b;
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[0], stream_));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(rgb_.get(), host_in_.as<uint8_t>(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[1], stream_));
    const int64_t per = 3 * cfg.height * cfg.width;
    at = 0;
    for (size_t i = 0; i < images.size(); ++i) {
      RETURN_IF_ERROR(
          image::cuda::ResizeNormalizeNchw(rgb_.as<uint8_t>() + at, images[i].width, images[i].height, cfg,
                                           in_f32_.as<float>() + static_cast<int64_t>(i) * per, stream_));
      at += static_cast<size_t>(images[i].width * images[i].height * 3);
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[2], stream_));
    return Finish(*p, t0, out, out_dims, times);
  }

  Status RunEncoded(std::span<const std::string_view> images, const image::PreprocessConfig& cfg,
                    std::vector<float>* out, std::vector<int64_t>* out_dims, CnnDeviceTimes* times) override {
    const Nanos t0 = MonotonicNanos();
    if (images.empty()) return InvalidArgumentError("no images");
    RETURN_IF_ERROR(cfg.Validate());
    CUDA_RETURN_IF_ERROR(cudaSetDevice(model_->gpu_index()));
    if (jpeg_ == nullptr) {
      ASSIGN_OR_RETURN(jpeg_, image::cuda::GpuJpegDecoder::Create({.stream = stream_}));
    }
    const std::vector<int64_t> dims = {static_cast<int64_t>(images.size()), 3, cfg.height, cfg.width};
    ASSIGN_OR_RETURN(GpuPlan * p, GetPlan(dims));
    RETURN_IF_ERROR(ReserveInput(NumElements(dims)));
    // No separate input copy: the bitstreams go up inside nvJPEG, so decoding and resizing are one span.
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[0], stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[1], stream_));
    RETURN_IF_ERROR(jpeg_->Decode(images, &decoded_, nullptr));
    const int64_t per = 3 * cfg.height * cfg.width;
    for (size_t i = 0; i < decoded_.size(); ++i) {
      const image::cuda::DeviceRgb& im = decoded_[i];
      RETURN_IF_ERROR(image::cuda::ResizeNormalizeNchw(
          im.pixels, im.width, im.height, cfg, in_f32_.as<float>() + static_cast<int64_t>(i) * per, stream_));
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[2], stream_));
    return Finish(*p, t0, out, out_dims, times);
  }

 private:
  Status ReserveInput(int64_t n) {
    RETURN_IF_ERROR(in_f32_.Reserve(static_cast<size_t>(n) * sizeof(float)));
    return input_.Reserve(static_cast<size_t>(n) * kElem);
  }

  StatusOr<GpuPlan*> GetPlan(const std::vector<int64_t>& dims) {
    if (dims.size() != 4 || dims[0] < 1 || dims[1] < 1 || dims[2] < 1 || dims[3] < 1) {
      return InvalidArgumentError("the CNN engine takes a 4-D NCHW input, got {}", DimsString(dims));
    }
    if (dims[0] > 65535)
      return InvalidArgumentError("a batch of {} images is over the 65535 the GPU takes", dims[0]);
    auto it = plans_.find(dims);
    if (it != plans_.end()) return it->second.get();
    if (plans_.size() >= CnnRunner::kMaxPlans) plans_.clear();
    auto gp = std::make_unique<GpuPlan>();
    ASSIGN_OR_RETURN(gp->plan, CnnPlan::Create(model_->model().graph(), dims));
    RETURN_IF_ERROR(Prepare(gp.get()));
    return plans_.emplace(dims, std::move(gp)).first->second.get();
  }

  // Constants to the device, the fusions, scratch sizes; grows the buffers.
  Status Prepare(GpuPlan* gp) {
    const CnnPlan& p = *gp->plan;
    const std::vector<Step>& steps = p.steps();
    gp->fused.assign(steps.size(), false);
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      for (int v : s.in) {
        const RtValue& val = p.values()[v];
        if (val.konst == nullptr || gp->consts.count(v)) continue;
        const std::vector<uint16_t> h =
            model_->ToElems(val.konst, static_cast<size_t>(NumElements(val.dims)));
        DeviceMemory& m = gp->consts[v];
        RETURN_IF_ERROR(m.Reserve(std::max<size_t>(1, h.size()) * kElem));
        CUDA_RETURN_IF_ERROR(cudaMemcpy(m.get(), h.data(), h.size() * kElem, cudaMemcpyHostToDevice));
      }
      if (s.kind == StepKind::kConv) {
        const NodeWeights* w = model_->Weights(s.node);
        if (w == nullptr) return InternalError("{}: no device weights", s.node->src.Describe());
        bool im2col = !w->depthwise;
        if (!w->depthwise && model_->cudnn(s.conv.batch)) {
          gp->cudnn.resize(steps.size());
          auto cc = dnn_->Prepare(s.conv, s.node->act.kind == cpu::Activation::kRelu, model_->elem());
          if (!cc.ok()) return cc.status().WithContext(s.node->src.Describe());
          gp->cudnn[i] = std::move(cc).value();
          if (gp->cudnn[i] != nullptr) im2col = false;
        }
        if (im2col) {
          gp->im2col_elems = std::max(
              gp->im2col_elems, s.conv.batch * s.conv.out_h * s.conv.out_w * s.conv.groups * w->group_ld);
        }
      }
      if (s.kind == StepKind::kBinary) {
        if (s.bdims.size() > static_cast<size_t>(BinaryGeom::kMaxRank)) {
          return UnimplementedError("{}: broadcasting over {} dimensions (the GPU takes {})",
                                    s.node->src.Describe(), s.bdims.size(), BinaryGeom::kMaxRank);
        }
        if (i + 1 < steps.size() && CanFuseActivation(p, i)) gp->fused[i + 1] = true;
      }
    }
    const std::vector<int64_t>& sizes = p.buffer_sizes();
    if (bufs_.size() < sizes.size()) bufs_.resize(sizes.size());
    for (size_t b = 0; b < sizes.size(); ++b)
      RETURN_IF_ERROR(bufs_[b].Reserve(static_cast<size_t>(std::max<int64_t>(1, sizes[b])) * kElem));
    RETURN_IF_ERROR(cols_.Reserve(static_cast<size_t>(std::max<int64_t>(1, gp->im2col_elems)) * kElem));
    const int64_t out_n = NumElements(p.values()[p.output_value()].dims);
    RETURN_IF_ERROR(out_f32_.Reserve(static_cast<size_t>(out_n) * sizeof(float)));
    return host_out_.Reserve(static_cast<size_t>(out_n) * sizeof(float));
  }

  // Step i (binary) can apply step i + 1's activation when that reads only i's output, nothing later reads
  // i's output, and i is a plain elementwise op (no broadcasting: writing into a buffer an input had is
  // safe).
  static bool CanFuseActivation(const CnnPlan& p, size_t i) {
    const std::vector<Step>& steps = p.steps();
    const Step& s = steps[i];
    const Step& a = steps[i + 1];
    if (a.kind != StepKind::kActivation || a.in.size() != 1 || a.in[0] != s.out) return false;
    if (!Contiguous(s)) return false;
    const int root = p.values()[s.out].root;
    if (p.values()[p.output_value()].root == root) return false;
    for (size_t j = i + 2; j < steps.size(); ++j)
      for (int v : steps[j].in)
        if (p.values()[v].root == root) return false;
    return true;
  }

  static bool Contiguous(const Step& s) {
    int64_t stride = 1;
    for (size_t d = s.bdims.size(); d-- > 0;) {
      if (s.bstride[0][d] != stride || s.bstride[1][d] != stride) {
        if (s.bdims[d] != 1) return false;
      }
      stride *= s.bdims[d];
    }
    return true;
  }

  void* Ptr(const GpuPlan& gp, int v) {
    const CnnPlan& p = *gp.plan;
    const RtValue& val = p.values()[v];
    if (val.konst != nullptr) return gp.consts.at(v).get();
    if (val.root == p.input_value()) return input_.get();
    return bufs_[p.buffer_of(val.root)].get();
  }

  // After the input is on the device (fp32 in in_f32_, events 0..2 recorded): to 16 bits, the steps, the
  // output back; waits for it.
  Status Finish(const GpuPlan& gp, Nanos t0, std::vector<float>* out, std::vector<int64_t>* out_dims,
                CnnDeviceTimes* times) {
    const CnnPlan& p = *gp.plan;
    const ElemType t = model_->elem();
    CUDA_RETURN_IF_ERROR(LaunchToElem(t, in_f32_.as<float>(), NumElements(p.values()[p.input_value()].dims),
                                      input_.get(), stream_));
    const std::vector<Step>& steps = p.steps();
    for (size_t i = 0; i < steps.size(); ++i) {
      if (gp.fused[i]) continue;
      const Step* next = i + 1 < steps.size() && gp.fused[i + 1] ? &steps[i + 1] : nullptr;
      Status st = RunStep(gp, steps[i], next);
      if (!st.ok()) return steps[i].node != nullptr ? st.WithContext(steps[i].node->src.Describe()) : st;
    }
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[3], stream_));
    const RtValue& ov = p.values()[p.output_value()];
    const int64_t n = NumElements(ov.dims);
    CUDA_RETURN_IF_ERROR(LaunchToFloat(t, Ptr(gp, p.output_value()), n, out_f32_.as<float>(), stream_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_out_.as<float>(), out_f32_.get(),
                                         static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost,
                                         stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(ev_[4], stream_));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev_[4]));
    out->assign(host_out_.as<float>(), host_out_.as<float>() + n);
    *out_dims = ov.dims;
    if (times != nullptr) {
      float ms[4] = {};
      for (int k = 0; k < 4; ++k) CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms[k], ev_[k], ev_[k + 1]));
      times->h2d_ns = static_cast<int64_t>(ms[0] * 1e6);
      times->preprocess_ns = static_cast<int64_t>(ms[1] * 1e6);
      times->compute_ns = static_cast<int64_t>(ms[2] * 1e6);
      times->d2h_ns = static_cast<int64_t>(ms[3] * 1e6);
      const int64_t wall = MonotonicNanos() - t0;
      times->host_ns = std::max<int64_t>(
          0, wall - times->h2d_ns - times->preprocess_ns - times->compute_ns - times->d2h_ns);
    }
    return OkStatus();
  }

  // y[M, n] = x[M, k] . w[n, k]^T per group (row-major, leading dims given), fp32 accumulation.
  Status Gemm(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int64_t m,
              int64_t n, int64_t k, int64_t groups, int64_t x_group, int64_t w_group, int64_t y_group) {
    const cudaDataType_t dt = model_->elem() == ElemType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha = 1.0f, beta = 0.0f;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || ldx > INT32_MAX) {
      return InvalidArgumentError("GEMM of {}x{}x{} is over cuBLAS's 32-bit sizes", m, n, k);
    }
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    if (groups == 1) {
      CUBLAS_RETURN_IF_ERROR(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &alpha, w, dt,
                                          static_cast<int>(ldw), x, dt, static_cast<int>(ldx), &beta, y, dt,
                                          static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return OkStatus();
    }
    CUBLAS_RETURN_IF_ERROR(
        cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, ni, mi, ki, &alpha, w, dt,
                                   static_cast<int>(ldw), w_group, x, dt, static_cast<int>(ldx), x_group,
                                   &beta, y, dt, static_cast<int>(ldy), y_group, static_cast<int>(groups),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return OkStatus();
  }

  Status RunConv(const GpuPlan& gp, const Step& s) {
    const NodeWeights& w = *model_->Weights(s.node);
    const cpu::Conv2dShape& c = s.conv;
    ConvGeom g = WindowGeom<ConvGeom>(c);
    g.in_c = c.in_c, g.out_c = c.out_c, g.groups = c.groups;
    const void* x = Ptr(gp, s.in[0]);
    void* y = Ptr(gp, s.out);
    const float* bias = s.node->conv.bias.empty() ? nullptr : w.bias.as<float>();
    const ActParams act = ToAct(s.node->act);
    const ElemType t = model_->elem();
    if (w.depthwise) {
      CUDA_RETURN_IF_ERROR(LaunchDepthwise(t, x, g, w.w.get(), bias, act, y, stream_));
      return OkStatus();
    }
    const int64_t m = c.batch * c.out_h * c.out_w, cg = c.in_c / c.groups, ocg = c.out_c / c.groups;
    if (const size_t i = static_cast<size_t>(&s - gp.plan->steps().data());
        i < gp.cudnn.size() && gp.cudnn[i] != nullptr) {
      const void* wk = w.w_krsc.get() != nullptr ? w.w_krsc.get() : w.w.get();
      ASSIGN_OR_RETURN(const CudnnConvDone done, dnn_->Run(*gp.cudnn[i], x, wk, w.bias16.get(), y));
      if (!done.bias) {
        CUDA_RETURN_IF_ERROR(LaunchBiasActivation(t, y, bias, act, m, c.out_c, stream_));
      } else if (!done.relu && act.kind != 0) {  // ReLU6, hardswish, ...: ours after cuDNN's conv + bias
        CUDA_RETURN_IF_ERROR(LaunchBiasActivation(t, y, nullptr, act, m, c.out_c, stream_));
      }
      return OkStatus();
    }
    const int64_t k = c.kernel_h * c.kernel_w * cg;
    const bool direct = c.groups == 1 && c.kernel_h == 1 && c.kernel_w == 1 && c.stride_h == 1 &&
                        c.stride_w == 1 && c.pad_top == 0 && c.pad_left == 0 && c.out_h == c.in_h &&
                        c.out_w == c.in_w;
    const void* a = x;
    int64_t lda = c.in_c;
    if (!direct) {
      lda = c.groups * w.group_ld;
      CUDA_RETURN_IF_ERROR(LaunchIm2col(t, x, g, w.group_ld, lda, cols_.get(), stream_));
      a = cols_.get();
    }
    RETURN_IF_ERROR(Gemm(a, lda, w.w.get(), w.group_ld, y, c.out_c, m, ocg, k, c.groups, w.group_ld,
                         ocg * w.group_ld, ocg));
    CUDA_RETURN_IF_ERROR(LaunchBiasActivation(t, y, bias, act, m, c.out_c, stream_));
    return OkStatus();
  }

  // `fused_act`: the activation step folded into this one (binary steps only), else null.
  Status RunStep(const GpuPlan& gp, const Step& s, const Step* fused_act) {
    const ElemType t = model_->elem();
    const std::vector<RtValue>& vals = gp.plan->values();
    switch (s.kind) {
      case StepKind::kConv:
        return RunConv(gp, s);
      case StepKind::kPool: {
        const cpu::Pool2dShape& q = s.pool;
        PoolGeom g = WindowGeom<PoolGeom>(q);
        g.channels = q.channels, g.pad_bottom = q.pad_bottom, g.pad_right = q.pad_right;
        g.count_include_pad = q.count_include_pad, g.max = s.pool_kind == cpu::PoolKind::kMax;
        CUDA_RETURN_IF_ERROR(LaunchPool(t, Ptr(gp, s.in[0]), g, Ptr(gp, s.out), stream_));
        return OkStatus();
      }
      case StepKind::kGlobalAveragePool: {
        const std::vector<int64_t>& d = vals[s.in[0]].dims;
        CUDA_RETURN_IF_ERROR(
            LaunchGlobalAvgPool(t, Ptr(gp, s.in[0]), d[0], d[2] * d[3], d[1], Ptr(gp, s.out), stream_));
        return OkStatus();
      }
      case StepKind::kBinary: {
        BinaryGeom g;
        g.rank = static_cast<int>(s.bdims.size());
        for (int d = 0; d < g.rank; ++d)
          g.dims[d] = s.bdims[d], g.sa[d] = s.bstride[0][d], g.sb[d] = s.bstride[1][d];
        g.op = s.op;
        g.contiguous = Contiguous(s);
        const ActParams act = fused_act != nullptr ? ToAct(fused_act->node->act) : ActParams{};
        void* y = Ptr(gp, fused_act != nullptr ? fused_act->out : s.out);
        CUDA_RETURN_IF_ERROR(LaunchBinary(t, g, Ptr(gp, s.in[0]), Ptr(gp, s.in[1]), act, y, stream_));
        return OkStatus();
      }
      case StepKind::kActivation: {
        const int64_t n = NumElements(vals[s.out].dims);
        void* y = Ptr(gp, s.out);
        CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, Ptr(gp, s.in[0]), static_cast<size_t>(n) * kElem,
                                             cudaMemcpyDeviceToDevice, stream_));
        CUDA_RETURN_IF_ERROR(LaunchBiasActivation(t, y, nullptr, ToAct(s.node->act), 1, n, stream_));
        return OkStatus();
      }
      case StepKind::kChannelAffine: {
        const NodeWeights& w = *model_->Weights(s.node);
        CUDA_RETURN_IF_ERROR(LaunchChannelAffine(t, Ptr(gp, s.in[0]), w.scale.as<float>(),
                                                 w.shift.as<float>(), s.outer, s.len, s.inner, Ptr(gp, s.out),
                                                 stream_));
        return OkStatus();
      }
      case StepKind::kGemm: {
        const GemmParams& gm = s.node->gemm;
        const NodeWeights& w = *model_->Weights(s.node);
        void* y = Ptr(gp, s.out);
        RETURN_IF_ERROR(
            Gemm(Ptr(gp, s.in[0]), gm.k, w.w.get(), gm.k, y, gm.n, s.outer, gm.n, gm.k, 1, 0, 0, 0));
        CUDA_RETURN_IF_ERROR(LaunchBiasActivation(t, y, gm.bias.empty() ? nullptr : w.bias.as<float>(),
                                                  ToAct(s.node->act), s.outer, gm.n, stream_));
        return OkStatus();
      }
      case StepKind::kSoftmax:
        CUDA_RETURN_IF_ERROR(
            LaunchSoftmax(t, Ptr(gp, s.in[0]), s.outer, s.len, s.inner, Ptr(gp, s.out), stream_));
        return OkStatus();
      case StepKind::kConcat: {
        int64_t width = 0;
        for (int64_t part : s.parts) width += part;
        auto* y = static_cast<char*>(Ptr(gp, s.out));
        int64_t off = 0;
        for (size_t k = 0; k < s.in.size(); ++k) {
          const size_t part = static_cast<size_t>(s.parts[k]) * kElem;
          CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(y + off * kElem, static_cast<size_t>(width) * kElem,
                                                 Ptr(gp, s.in[k]), part, part, static_cast<size_t>(s.outer),
                                                 cudaMemcpyDeviceToDevice, stream_));
          off += s.parts[k];
        }
        return OkStatus();
      }
      case StepKind::kToNhwc:
        CUDA_RETURN_IF_ERROR(
            LaunchTranspose(t, Ptr(gp, s.in[0]), s.outer, s.len, s.inner, Ptr(gp, s.out), stream_));
        return OkStatus();
      case StepKind::kToNchw:
        CUDA_RETURN_IF_ERROR(
            LaunchTranspose(t, Ptr(gp, s.in[0]), s.outer, s.inner, s.len, Ptr(gp, s.out), stream_));
        return OkStatus();
    }
    return InternalError("unknown step");
  }

  std::shared_ptr<const CudaCnnModel> model_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<CudnnConvs> dnn_;  // the cuDNN conv path, when the build has it and the options want it
  // 0 before the input copy, 1 after it, 2 after device preprocessing, 3 after the model, 4 after the output
  // copy.
  cudaEvent_t ev_[5] = {};
  std::map<std::vector<int64_t>, std::unique_ptr<GpuPlan>> plans_;
  std::vector<DeviceMemory> bufs_;  // the plan's buffers (CnnPlan::buffer_sizes), 16-bit
  DeviceMemory input_;              // the graph input, 16-bit NCHW
  DeviceMemory in_f32_;             // the input as it arrives (fp32 NCHW)
  DeviceMemory rgb_;                // RunImages: the decoded images, RGB8, one after another
  DeviceMemory cols_;               // im2col
  DeviceMemory out_f32_;
  PinnedMemory host_in_, host_out_;
  std::unique_ptr<image::cuda::GpuJpegDecoder> jpeg_;  // RunEncoded, created on first use
  std::vector<image::cuda::DeviceRgb> decoded_;
};

StatusOr<std::unique_ptr<CnnDeviceRunner>> CudaCnnModel::CreateRunner() {
  auto r = std::make_unique<CudaCnnRunner>(shared_from_this());
  RETURN_IF_ERROR(r->Init());
  return std::unique_ptr<CnnDeviceRunner>(std::move(r));
}

bool CudaAvailable() {
  return stoke::cuda::DeviceCount() > 0;
}

}  // namespace

StatusOr<std::shared_ptr<CnnDeviceModel>> CreateCudaCnnModel(std::shared_ptr<const CnnModel> model,
                                                             const CnnDeviceOptions& options) {
  if (model == nullptr) return InvalidArgumentError("CreateCudaCnnModel: no model");
  if (options.precision != "fp16" && options.precision != "bf16") {
    return InvalidArgumentError("image model precision '{}': expected fp16 or bf16", options.precision);
  }
  if (options.conv_backend != "auto" && options.conv_backend != "cudnn" && options.conv_backend != "im2col") {
    return InvalidArgumentError("--conv-backend '{}': expected auto, cudnn or im2col", options.conv_backend);
  }
  if (options.conv_backend == "cudnn" && !CudnnInBuild()) {
    return FailedPreconditionError(
        "--conv-backend cudnn: this stoke was built without cuDNN (CMake looks for cudnn.h and libcudnn "
        "beside "
        "the CUDA toolkit, or in STOKE_CUDNN_ROOT); --conv-backend im2col runs the convolutions as im2col + "
        "cuBLAS");
  }
  const int count = stoke::cuda::DeviceCount();
  if (count == 0) return FailedPreconditionError("no CUDA GPU is visible");
  if (options.gpu_index < 0 || options.gpu_index >= count) {
    return InvalidArgumentError("gpu index {} (this host has {} GPU(s))", options.gpu_index, count);
  }
  ASSIGN_OR_RETURN(stoke::cuda::DeviceInfo info, stoke::cuda::GetDeviceInfo(options.gpu_index));
  auto m = std::make_shared<CudaCnnModel>(
      std::move(model), options,
      fmt::format("cuda:{} ({}), {}, {} convs", options.gpu_index, info.name, options.precision,
                  options.conv_backend == "im2col" || !CudnnInBuild() ? "im2col"
                  : options.conv_backend == "cudnn"                   ? "cudnn"
                                                                      : "im2col below batch 32, cudnn"));
  RETURN_IF_ERROR(m->Upload());
  return std::shared_ptr<CnnDeviceModel>(std::move(m));
}

CnnBackend CudaCnnBackend() {
  return {.create = &CreateCudaCnnModel, .available = &CudaAvailable};
}

}  // namespace stoke::cnn::cuda
