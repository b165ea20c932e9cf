#include "engine/cuda/cuda_bert.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/half.h"
#include "base/logging.h"
#include "engine/device/device_resources.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int8.h"
#include "kernels/cuda/quant.h"

namespace stoke {
namespace {

using bf16 = __nv_bfloat16;

// n values of a mapped tensor (F32, F16 or BF16; possibly unaligned) as bf16 bits, appended to `out`.
Status AppendBf16(const void* src, DType dtype, int64_t n, std::vector<uint16_t>* out) {
  const auto* p = static_cast<const uint8_t*>(src);
  const size_t at = out->size();
  out->resize(at + n);
  uint16_t* o = out->data() + at;
  switch (dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        o[i] = Fp32ToBf16(f);
      }
      return OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        o[i] = Fp32ToBf16(Fp16ToFp32(h));
      }
      return OkStatus();
    case DType::kBF16:
      std::memcpy(o, p, n * 2);
      return OkStatus();
    default:
      return InvalidArgumentError("cuda bert: weight dtype {} is not F32, F16 or BF16", DTypeName(dtype));
  }
}

size_t Aligned(size_t bytes) {
  return (bytes + device::DeviceArena::kAlignment - 1) / device::DeviceArena::kAlignment *
         device::DeviceArena::kAlignment;
}

// A Linear on the device: bf16 weights `w`, or (--quantization fp8) fp8 E4M3 bytes `q` with one fp32 scale
// per output row (w null), or (--quantization int8) int8 weights `q8` with their scale per row, and the fp32
// bias.
struct DevLinear {
  const bf16* w = nullptr;
  const uint8_t* q = nullptr;
  const float* scale = nullptr;
  // int8: the CPU reference's quantisation (BertEncoder::QuantizedInt8Layers), bit for bit. `scale` is
  // w_scale; w_sum (per-token) the centre's term; x_inv the input's per-column inverse scale (smoothing;
  // null = none); x_scale the static scale (static activations).
  const int8_t* q8 = nullptr;
  const float* w_sum = nullptr;
  const float* x_inv = nullptr;
  float x_scale = 0.f, x_scale_mul = 1.f;
  bool per_token = false, centred = false;
  const float* b = nullptr;
  const bf16* b16 = nullptr;  // the bias in bf16 for cuBLASLt's epilogue (fused epilogues only)
  int64_t out = 0, in = 0;
};
struct DevNorm {
  const float* g = nullptr;
  const float* b = nullptr;
};
struct DevLayer {
  DevLinear qkv, attn_out, inter, output;
  DevNorm attn_norm, out_norm;
};

class CudaBertModelImpl;

class CudaBertRunner final : public BertRunner {
 public:
  static StatusOr<std::unique_ptr<BertRunner>> Create(std::shared_ptr<const CudaBertModelImpl> model);
  ~CudaBertRunner() override;
  Status Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
               EmbedTimes* times) override;
  int64_t graph_launches() const override { return graph_launches_; }

 private:
  // (tokens, sequences, longest sequence): what fixes every kernel's grid and every arena address of a pass.
  using GraphKey = std::tuple<int64_t, int64_t, int>;
  static constexpr size_t kMaxGraphs = 64;
  explicit CudaBertRunner(std::shared_ptr<const CudaBertModelImpl> model) : model_(std::move(model)) {}
  size_t ScratchBytes(int64_t tokens, int64_t seqs) const;
  Status EnsureScratch(int64_t tokens, int64_t seqs);
  // Captures Forward for `key` into a graph (the arena laid out as Embed lays it out: d_in, pooled, then
  // Forward's buffers), after an eager pass of the same shape chose its GEMM algorithms.
  Status CaptureForward(const GraphKey& key, int64_t in_count);
  void DropGraphs();
  Status Forward(const int32_t* d_in, int64_t tokens, int64_t seqs, int max_len, float* pooled);
  // y[t, lin.out] = x[t, lin.in] · W^T: the bf16 GEMM, or with fp8 weights x quantised per token into
  // act_q_ / act_scale_ and the FP8 GEMM (per-token x per-channel scales, fp32 accumulation).
  Status Linear(const bf16* x, const DevLinear& lin, void* y, DType out, int64_t t);
  // The layers with fused epilogues (BertDeviceOptions::epilogues fused / fused-tanh): bf16 residual stream
  // xb, biases in the GEMMs, residual + LayerNorm one kernel.
  Status FusedLayers(bf16* xb, bf16* qkv, bf16* ctx, bf16* tmp, bf16* ffn, const int32_t* cu, int64_t t,
                     int64_t n_seq, int max_len);

  std::shared_ptr<const CudaBertModelImpl> model_;
  device::Stream stream_;
  device::Event ev_[4];
  std::unique_ptr<cuda::BlasLtGemm> gemm_;
  std::unique_ptr<device::DeviceArena> arena_;
  std::vector<int32_t> lens_;
  uint8_t* act_q_ = nullptr;    // fp8 / int8 weights: the activations of one GEMM, [tokens, max(hidden, inter)]
  float* act_scale_ = nullptr;  // and their per-token scales
  float* act_mid_ = nullptr;    // int8: the per-token centres
  int32_t* acc_ = nullptr;      // int8: the GEMM's int32 products, [tokens, max(3 hidden, inter)]
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::map<GraphKey, bool> graph_seen_;  // shapes run eagerly: false = once so far, true = capture tried
  int64_t graph_launches_ = 0;
};

class CudaBertModelImpl final : public BertDeviceModel,
                                public std::enable_shared_from_this<CudaBertModelImpl> {
 public:
  static StatusOr<std::shared_ptr<CudaBertModelImpl>> Create(std::shared_ptr<const BertEncoder> encoder,
                                                             const BertDeviceOptions& options);

  std::string device_name() const override { return name_; }
  StatusOr<std::unique_ptr<BertRunner>> CreateRunner() override {
    return CudaBertRunner::Create(shared_from_this());
  }

  const BertEncoder& encoder() const { return *encoder_; }
  bool fp8() const { return options_.quantization == WeightQuantization::kFp8; }
  bool int8() const { return options_.quantization == WeightQuantization::kInt8; }
  cuda::EncoderAttentionImpl attention_impl() const { return attention_impl_; }
  // Fused GEMM epilogues in use (requested, bf16 weights, a hidden size the fused LayerNorm takes).
  bool fused() const { return !fp8() && !int8() && options_.epilogues != "separate" &&
                              cuda::ResidualLayerNormBf16Supports(encoder_->config().hidden_size); }
  const BertDeviceOptions& options() const { return options_; }
  device::PinnedHostPool& pinned() const { return pinned_; }

  const bf16* word = nullptr;
  const bf16* pos = nullptr;
  const float* type0 = nullptr;
  DevNorm emb_norm;
  std::vector<DevLayer> layers;

 private:
  Status Upload();
  Status ChooseAttention();

  std::shared_ptr<const BertEncoder> encoder_;
  BertDeviceOptions options_;
  std::string name_;
  std::unique_ptr<device::DeviceArena> weights_;
  mutable device::PinnedHostPool pinned_;
  cuda::EncoderAttentionImpl attention_impl_ = cuda::EncoderAttentionImpl::kSimple;
};

StatusOr<std::shared_ptr<CudaBertModelImpl>> CudaBertModelImpl::Create(
    std::shared_ptr<const BertEncoder> encoder, const BertDeviceOptions& options) {
  const BertConfig& c = encoder->config();
  if (cuda::DeviceCount() <= options.gpu_index) {
    return FailedPreconditionError("cuda bert: GPU {} is not visible ({} CUDA devices)", options.gpu_index,
                                   cuda::DeviceCount());
  }
  if (!cuda::EncoderAttentionSupports(c.head_dim())) {
    return UnimplementedError("cuda bert: head_dim {} is not supported on the GPU (32, 64, 96 or 128)",
                              c.head_dim());
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return UnimplementedError("cuda bert: hidden_size {} and intermediate_size {} must be multiples of 8",
                              c.hidden_size, c.intermediate_size);
  }
  if (options.max_batch_tokens < 1) return InvalidArgumentError("cuda bert: max_batch_tokens must be >= 1");
  RETURN_IF_ERROR(ValidateBertDeviceOptions(options));
  if (options.quantization == WeightQuantization::kInt8 && options.int8_ranges == nullptr) {
    return InvalidArgumentError("cuda bert: --quantization int8 needs the calibration's activation ranges");
  }
  if (options.quantization != WeightQuantization::kNone &&
      (c.hidden_size % 16 != 0 || c.intermediate_size % 16 != 0)) {
    // The FP8 GEMM's k % 16 (the int8 GEMM's k and n % 4 follow).
    return UnimplementedError(
        "cuda bert: --quantization {} needs hidden_size {} and intermediate_size {} to be multiples of 16",
        WeightQuantizationName(options.quantization), c.hidden_size, c.intermediate_size);
  }
  std::shared_ptr<CudaBertModelImpl> m(new CudaBertModelImpl());
  m->encoder_ = std::move(encoder);
  m->options_ = options;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.gpu_index));
  ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(options.gpu_index));
  m->name_ = fmt::format("cuda:{} ({})", options.gpu_index, info.name);
  RETURN_IF_ERROR(m->Upload());
  RETURN_IF_ERROR(m->ChooseAttention());
  return m;
}

// Runs the attention kernels once on random inputs of this model's shape (3 sequences, 5..130 tokens) and
// keeps the fastest kind that agrees with the simple kernel: tensor cores (head_dim 32/64/128), else the
// vectorised CUDA-core kernel, else the simple one. A safety net for kernels first written without a GPU at
// hand; the outcome is logged, and cuda_bert_gpu_test / encoder_gpu_test check every kind against the CPU.
Status CudaBertModelImpl::ChooseAttention() {
  const BertConfig& c = encoder_->config();
  const int heads = c.num_attention_heads, hd = c.head_dim();
  const std::vector<int32_t> cu = {0, 70, 75, 205};
  const int64_t t = cu.back(), hidden = int64_t{heads} * hd;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<uint16_t> qkv(t * 3 * hidden);
  for (uint16_t& x : qkv) x = Fp32ToBf16(dist(rng));
  const size_t bytes = Aligned(qkv.size() * 2) + Aligned(cu.size() * 4) + 2 * Aligned(t * hidden * 2);
  ASSIGN_OR_RETURN(std::unique_ptr<device::DeviceArena> a, device::DeviceArena::Create(bytes));
  ASSIGN_OR_RETURN(bf16 * dqkv, a->AllocateArray<bf16>(qkv.size()));
  ASSIGN_OR_RETURN(int32_t * dcu, a->AllocateArray<int32_t>(cu.size()));
  ASSIGN_OR_RETURN(bf16 * o1, a->AllocateArray<bf16>(t * hidden));
  ASSIGN_OR_RETURN(bf16 * o2, a->AllocateArray<bf16>(t * hidden));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dqkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  RETURN_IF_ERROR(cuda::EncoderAttention(dqkv, dcu, 3, 130, heads, hd, scale, o2, nullptr,
                                         cuda::EncoderAttentionImpl::kSimple));
  std::vector<uint16_t> h1(t * hidden), h2(t * hidden);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(h2.data(), o2, h2.size() * 2, cudaMemcpyDeviceToHost));
  attention_impl_ = cuda::EncoderAttentionImpl::kSimple;
  // options_.attention = tensor32|tensor|vectorized|simple limits the choice (A/B benchmarks; tensor32 falls
  // back to tensor past head_dim 64); "auto": the first of tensor-core (32 or 16 query rows per warp by the
  // call's size: kTensorCoreAuto), vectorized that agrees.
  const std::string want = options_.attention == "auto" ? "" : options_.attention;
  std::vector<std::pair<cuda::EncoderAttentionImpl, const char*>> candidates;
  if (cuda::EncoderAttentionTiledSupports(hd) && want.empty()) {
    candidates.emplace_back(cuda::EncoderAttentionImpl::kTensorCoreAuto,
                            "tensor-core (32 rows per warp at large batches, else 16)");
  }
  if (cuda::EncoderAttentionTiledSupports(hd) && hd <= 64 && want == "tensor32") {
    candidates.emplace_back(cuda::EncoderAttentionImpl::kTensorCoreWide, "tensor-core (32 rows per warp)");
  }
  if (cuda::EncoderAttentionTiledSupports(hd) && (want == "tensor" || want == "tensor32")) {
    candidates.emplace_back(cuda::EncoderAttentionImpl::kTensorCore, "tensor-core");
  }
  if (want.empty() || want == "vectorized") {
    candidates.emplace_back(cuda::EncoderAttentionImpl::kVectorized, "vectorized");
  }
  for (const auto& [impl, name] : candidates) {
    RETURN_IF_ERROR(cuda::EncoderAttention(dqkv, dcu, 3, 130, heads, hd, scale, o1, nullptr, impl));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(h1.data(), o1, h1.size() * 2, cudaMemcpyDeviceToHost));
    double max_diff = 0;
    bool finite = true;
    for (size_t i = 0; i < h1.size(); ++i) {
      const float x = Bf16ToFp32(h1[i]), y = Bf16ToFp32(h2[i]);
      finite = finite && std::isfinite(x) && std::isfinite(y);
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(x - y)));
    }
    // Outputs are softmax-weighted means of values in [-2, 2]: the kernels differ in summation order (and the
    // tensor-core one rounds P to bf16), so they agree to a few bf16 ulps.
    if (finite && max_diff <= 0.05) {
      attention_impl_ = impl;
      LOG_INFO("cuda bert: {} attention (head_dim {}) agrees with the simple kernel (max |diff| {:.2e})",
               name, hd, max_diff);
      return OkStatus();
    }
    LOG_WARN(
        "cuda bert: {} attention (head_dim {}) disagrees with the simple kernel (max |diff| {:.3g}, finite "
        "{}); not used",
        name, hd, max_diff, finite);
  }
  LOG_WARN("cuda bert: using the simple attention kernel (head_dim {})", hd);
  return OkStatus();
}

Status CudaBertModelImpl::Upload() {
  const BertEncoder& e = *encoder_;
  const BertConfig& c = e.config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t norm_bytes = 2 * Aligned(h * 4);
  // A linear's bytes: bf16 weights, or fp8 bytes + a scale per row; then the bias.
  auto lin_bytes = [&](int64_t out, int64_t in) {
    const int64_t w = fp8()    ? Aligned(out * in) + Aligned(out * 4)
                      : int8() ? Aligned(out * in) + 2 * Aligned(out * 4) + Aligned(in * 4)
                               : Aligned(out * in * 2);
    return w + Aligned(out * 4) + (fused() ? Aligned(out * 2) : 0);
  };
  const int64_t per_layer = lin_bytes(3 * h, h) + lin_bytes(h, h) + lin_bytes(inter, h) + lin_bytes(h, inter) +
                            2 * norm_bytes;
  const int64_t total = Aligned(int64_t{c.vocab_size} * h * 2) +
                        Aligned(int64_t{c.max_position_embeddings} * h * 2) + Aligned(h * 4) + norm_bytes +
                        per_layer * c.num_hidden_layers;
  ASSIGN_OR_RETURN(weights_, device::DeviceArena::Create(total));

  auto put_bf16 = [&](const std::vector<uint16_t>& host) -> StatusOr<const bf16*> {
    ASSIGN_OR_RETURN(bf16 * d, weights_->AllocateArray<bf16>(host.size()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(d, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return static_cast<const bf16*>(d);
  };
  auto put_f32 = [&](const std::vector<float>& host) -> StatusOr<const float*> {
    ASSIGN_OR_RETURN(float* d, weights_->AllocateArray<float>(host.size()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    return static_cast<const float*>(d);
  };
  auto put_norm = [&](const BertEncoder::Norm& n, DevNorm* out) -> Status {
    ASSIGN_OR_RETURN(out->g, put_f32(n.gamma));
    ASSIGN_OR_RETURN(out->b, put_f32(n.beta));
    return OkStatus();
  };
  std::vector<uint16_t> buf;
  // --quantization int8: the CPU reference's quantised layers (weights, scales, smoothing), uploaded as they
  // are, so the device multiplies the very integers the CPU does.
  std::vector<BertEncoder::Layer> int8_layers;
  if (int8()) {
    Int8WeightOptions o;
    o.testing_activation_scale_multiplier = options_.int8_activation_scale_multiplier;
    ASSIGN_OR_RETURN(int8_layers, e.QuantizedInt8Layers(*options_.int8_ranges, o));
  }
  auto put_int8 = [&](std::initializer_list<const BertEncoder::Linear*> parts, DevLinear* out) -> Status {
    const BertEncoder::Linear& first = **parts.begin();
    std::vector<int8_t> q;
    std::vector<float> w_scale, w_sum, bias;
    out->out = 0;
    out->in = first.in;
    for (const BertEncoder::Linear* l : parts) {
      // The parts of a fused Linear read one input: the same activation quantisation.
      if (l->x_per_token != first.x_per_token || l->x_centred != first.x_centred ||
          l->x_scale != first.x_scale || l->x_inv != first.x_inv || l->in != first.in) {
        return InternalError("cuda bert: the fused parts of an int8 Linear quantise their input differently");
      }
      q.insert(q.end(), l->w_int8.begin(), l->w_int8.end());
      w_scale.insert(w_scale.end(), l->w_scale.begin(), l->w_scale.end());
      w_sum.insert(w_sum.end(), l->w_sum.begin(), l->w_sum.end());
      bias.insert(bias.end(), l->bias.begin(), l->bias.end());
      out->out += l->out;
    }
    ASSIGN_OR_RETURN(int8_t * dq, weights_->AllocateArray<int8_t>(q.size()));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice));
    out->q8 = dq;
    ASSIGN_OR_RETURN(out->scale, put_f32(w_scale));
    if (first.x_per_token) {
      ASSIGN_OR_RETURN(out->w_sum, put_f32(w_sum));
    }
    if (!first.x_inv.empty()) {
      ASSIGN_OR_RETURN(out->x_inv, put_f32(first.x_inv));
    }
    out->x_scale = first.x_scale;
    out->x_scale_mul = first.x_scale_mul;
    out->per_token = first.x_per_token;
    out->centred = first.x_centred;
    ASSIGN_OR_RETURN(out->b, put_f32(bias));
    return OkStatus();
  };
  auto put_linear = [&](std::initializer_list<const BertEncoder::Linear*> parts, DevLinear* out) -> Status {
    buf.clear();
    std::vector<float> bias;
    out->out = 0;
    out->in = (*parts.begin())->in;
    for (const BertEncoder::Linear* l : parts) {
      RETURN_IF_ERROR(AppendBf16(l->w, l->dtype, l->out * l->in, &buf));
      bias.insert(bias.end(), l->bias.begin(), l->bias.end());
      out->out += l->out;
    }
    if (fp8()) {
      // The bf16 rows go to a temporary buffer, are quantised on the device (bit-exact with the CPU's
      // quantiser, kernels/cuda/quant.h) into the arena, and the temporary is freed.
      void* tmp = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMalloc(&tmp, buf.size() * 2));
      const std::unique_ptr<void, cudaError_t (*)(void*)> tmp_owner(tmp, &cudaFree);
      ASSIGN_OR_RETURN(uint8_t * q, weights_->AllocateArray<uint8_t>(out->out * out->in));
      ASSIGN_OR_RETURN(float* sc, weights_->AllocateArray<float>(out->out));
      CUDA_RETURN_IF_ERROR(cudaMemcpy(tmp, buf.data(), buf.size() * 2, cudaMemcpyHostToDevice));
      RETURN_IF_ERROR(cuda::QuantizeRowsFp8(static_cast<const bf16*>(tmp), out->out, out->in, out->in, q, sc,
                                            options_.fp8_scale_multiplier, nullptr));
      CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      out->q = q;
      out->scale = sc;
    } else {
      ASSIGN_OR_RETURN(out->w, put_bf16(buf));
    }
    ASSIGN_OR_RETURN(out->b, put_f32(bias));
    if (fused()) {
      std::vector<uint16_t> b16(bias.size());
      for (size_t i = 0; i < bias.size(); ++i) b16[i] = Fp32ToBf16(bias[i]);
      ASSIGN_OR_RETURN(out->b16, put_bf16(b16));
    }
    return OkStatus();
  };

  buf.clear();
  RETURN_IF_ERROR(AppendBf16(e.word_embeddings(), e.word_dtype(), int64_t{c.vocab_size} * h, &buf));
  ASSIGN_OR_RETURN(word, put_bf16(buf));
  buf.clear();
  RETURN_IF_ERROR(
      AppendBf16(e.position_embeddings(), e.position_dtype(), int64_t{c.max_position_embeddings} * h, &buf));
  ASSIGN_OR_RETURN(pos, put_bf16(buf));
  ASSIGN_OR_RETURN(type0, put_f32(e.token_type0_embedding()));
  RETURN_IF_ERROR(put_norm(e.embedding_norm(), &emb_norm));
  layers.resize(e.layers().size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const BertEncoder::Layer& l = int8() ? int8_layers[i] : e.layers()[i];
    DevLayer& d = layers[i];
    auto put = [&](std::initializer_list<const BertEncoder::Linear*> parts, DevLinear* out) {
      return int8() ? put_int8(parts, out) : put_linear(parts, out);
    };
    RETURN_IF_ERROR(put({&l.query, &l.key, &l.value}, &d.qkv));
    RETURN_IF_ERROR(put({&l.attn_out}, &d.attn_out));
    RETURN_IF_ERROR(put({&l.intermediate}, &d.inter));
    RETURN_IF_ERROR(put({&l.output}, &d.output));
    RETURN_IF_ERROR(put_norm(l.attn_norm, &d.attn_norm));
    RETURN_IF_ERROR(put_norm(l.out_norm, &d.out_norm));
  }
  LOG_INFO("cuda bert: {:.1f} MiB of weights on {} ({} linears, bf16 tables, fp32 norms and biases; {} "
           "epilogues)",
           weights_->used() / 1048576.0, name_, fp8() ? "fp8 E4M3" : int8() ? "int8" : "bf16",
           fused() ? options_.epilogues : std::string("separate"));
  return OkStatus();
}

StatusOr<std::unique_ptr<BertRunner>> CudaBertRunner::Create(std::shared_ptr<const CudaBertModelImpl> model) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(model->options().gpu_index));
  std::unique_ptr<CudaBertRunner> r(new CudaBertRunner(model));
  ASSIGN_OR_RETURN(r->stream_, device::Stream::Create());
  for (device::Event& e : r->ev_) {
    ASSIGN_OR_RETURN(e, device::Event::Create(true));
  }
  cuda::GemmOptions go;
  go.candidates = std::max(1, model->options().gemm_candidates);
  ASSIGN_OR_RETURN(r->gemm_, cuda::BlasLtGemm::Create(go));
  return std::unique_ptr<BertRunner>(std::move(r));
}

CudaBertRunner::~CudaBertRunner() {
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  DropGraphs();
}

void CudaBertRunner::DropGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  graph_seen_.clear();
}

Status CudaBertRunner::CaptureForward(const GraphKey& key, int64_t in_count) {
  // Plain variables: lambdas may not capture structured bindings (clang before C++20's P1091).
  const int64_t t = std::get<0>(key), n_seq = std::get<1>(key);
  const int max_len = std::get<2>(key);
  const int64_t h = model_->encoder().config().hidden_size;
  arena_->Reset();
  ASSIGN_OR_RETURN(int32_t * d_in, arena_->AllocateArray<int32_t>(in_count));
  ASSIGN_OR_RETURN(float* pooled, arena_->AllocateArray<float>(n_seq * h));
  ASSIGN_OR_RETURN(cudaGraphExec_t exec, cuda::CaptureGraph(stream_.get(), [&] {
                     return Forward(d_in, t, n_seq, max_len, pooled);
                   }));
  graphs_[key] = exec;
  return OkStatus();
}

size_t CudaBertRunner::ScratchBytes(int64_t tokens, int64_t seqs) const {
  const BertConfig& c = model_->encoder().config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  return Aligned((2 * tokens + seqs + 1) * 4)  // ids | positions | cu_seqlens
         + Aligned(tokens * h * 4)             // x (fp32 residual stream)
         + Aligned(tokens * h * 2)             // x as bf16
         + Aligned(tokens * 3 * h * 2)         // qkv
         + Aligned(tokens * h * 2)             // attention context
         + Aligned(tokens * h * 4)             // fp32 GEMM output before the residual norm
         + Aligned(tokens * inter * 2)         // FFN activation
         + Aligned(seqs * h * 4)               // pooled
         + (model_->fused() ? Aligned(tokens * h * 2) : 0)  // bf16 GEMM output before the residual norm
         + (model_->fp8() ? Aligned(tokens * std::max(h, inter)) + Aligned(tokens * 4) : 0)  // fp8 activations
         // int8: activations, per-token scales and centres, int32 products
         + (model_->int8() ? Aligned(tokens * std::max(h, inter)) + 2 * Aligned(tokens * 4) +
                                 Aligned(tokens * std::max(3 * h, inter) * 4)
                           : 0);
}

Status CudaBertRunner::EnsureScratch(int64_t tokens, int64_t seqs) {
  const size_t need = ScratchBytes(tokens, seqs);
  if (arena_ != nullptr && arena_->capacity() >= need) return OkStatus();
  // Grown (rarely): the stream is idle here (the previous Embed waited for its copy). The graphs point into
  // the old arena.
  const size_t cap = need + need / 4;
  DropGraphs();
  arena_.reset();
  auto a = device::DeviceArena::Create(cap);
  if (!a.ok()) {
    return a.status().WithContext(
        fmt::format("cuda bert: activations for {} tokens in {} sequences", tokens, seqs));
  }
  arena_ = std::move(a).value();
  return OkStatus();
}

Status CudaBertRunner::Forward(const int32_t* d_in, int64_t t, int64_t n_seq, int max_len, float* pooled) {
  const CudaBertModelImpl& m = *model_;
  const BertConfig& c = m.encoder().config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const float eps = c.layer_norm_eps;
  const cudaStream_t s = stream_.get();
  const int32_t* ids = d_in;
  const int32_t* positions = d_in + t;
  const int32_t* cu = d_in + 2 * t;
  device::DeviceArena& a = *arena_;
  ASSIGN_OR_RETURN(float* x, a.AllocateArray<float>(t * h));
  ASSIGN_OR_RETURN(bf16 * xb, a.AllocateArray<bf16>(t * h));
  ASSIGN_OR_RETURN(bf16 * qkv, a.AllocateArray<bf16>(t * 3 * h));
  ASSIGN_OR_RETURN(bf16 * ctx, a.AllocateArray<bf16>(t * h));
  ASSIGN_OR_RETURN(float* tmp, a.AllocateArray<float>(t * h));
  ASSIGN_OR_RETURN(bf16 * ffn, a.AllocateArray<bf16>(t * inter));
  if (m.fp8() || m.int8()) {
    ASSIGN_OR_RETURN(act_q_, a.AllocateArray<uint8_t>(t * std::max(h, inter)));
    ASSIGN_OR_RETURN(act_scale_, a.AllocateArray<float>(t));
  }
  if (m.int8()) {
    ASSIGN_OR_RETURN(act_mid_, a.AllocateArray<float>(t));
    ASSIGN_OR_RETURN(acc_, a.AllocateArray<int32_t>(t * std::max(3 * h, inter)));
  }

  RETURN_IF_ERROR(cuda::EmbeddingLayerNorm(m.word, c.vocab_size, m.pos, c.max_position_embeddings, m.type0,
                                           m.emb_norm.g, m.emb_norm.b, ids, positions, t, h, eps, x, xb, s));
  if (m.fused()) {
    ASSIGN_OR_RETURN(bf16 * tmpb, a.AllocateArray<bf16>(t * h));
    RETURN_IF_ERROR(FusedLayers(xb, qkv, ctx, tmpb, ffn, cu, t, n_seq, max_len));
    return cuda::MeanPoolNormalize(xb, cu, static_cast<int>(n_seq), h, pooled, s);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim()));
  for (const DevLayer& l : m.layers) {
    RETURN_IF_ERROR(Linear(xb, l.qkv, qkv, DType::kBF16, t));
    RETURN_IF_ERROR(cuda::AddBias(qkv, l.qkv.b, t, l.qkv.out, s));
    RETURN_IF_ERROR(cuda::EncoderAttention(qkv, cu, static_cast<int>(n_seq), max_len, c.num_attention_heads,
                                           c.head_dim(), scale, ctx, s, m.attention_impl()));
    RETURN_IF_ERROR(Linear(ctx, l.attn_out, tmp, DType::kF32, t));
    RETURN_IF_ERROR(
        cuda::BiasResidualLayerNorm(tmp, l.attn_out.b, x, l.attn_norm.g, l.attn_norm.b, t, h, eps, xb, s));
    RETURN_IF_ERROR(Linear(xb, l.inter, ffn, DType::kBF16, t));
    RETURN_IF_ERROR(cuda::GeluBias(ffn, l.inter.b, t, inter, s));
    RETURN_IF_ERROR(Linear(ffn, l.output, tmp, DType::kF32, t));
    RETURN_IF_ERROR(
        cuda::BiasResidualLayerNorm(tmp, l.output.b, x, l.out_norm.g, l.out_norm.b, t, h, eps, xb, s));
  }
  return cuda::MeanPoolNormalize(x, cu, static_cast<int>(n_seq), h, pooled, s);
}

Status CudaBertRunner::FusedLayers(bf16* xb, bf16* qkv, bf16* ctx, bf16* tmp, bf16* ffn, const int32_t* cu,
                                   int64_t t, int64_t n_seq, int max_len) {
  const CudaBertModelImpl& m = *model_;
  const BertConfig& c = m.encoder().config();
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const float eps = c.layer_norm_eps;
  const cudaStream_t s = stream_.get();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim()));
  const bool tanh_gelu = m.options().epilogues == "fused-tanh";
  using cuda::GemmEpilogue;
  for (const DevLayer& l : m.layers) {
    RETURN_IF_ERROR(gemm_->Run(xb, l.qkv.w, qkv, DType::kBF16, t, l.qkv.out, h, s, GemmEpilogue::kBias,
                               l.qkv.b16));
    RETURN_IF_ERROR(cuda::EncoderAttention(qkv, cu, static_cast<int>(n_seq), max_len, c.num_attention_heads,
                                           c.head_dim(), scale, ctx, s, m.attention_impl()));
    RETURN_IF_ERROR(gemm_->Run(ctx, l.attn_out.w, tmp, DType::kBF16, t, h, h, s, GemmEpilogue::kBias,
                               l.attn_out.b16));
    RETURN_IF_ERROR(cuda::ResidualLayerNormBf16(tmp, xb, l.attn_norm.g, l.attn_norm.b, t, h, eps, s));
    RETURN_IF_ERROR(gemm_->Run(xb, l.inter.w, ffn, DType::kBF16, t, inter, h, s,
                               tanh_gelu ? GemmEpilogue::kGeluBias : GemmEpilogue::kBias, l.inter.b16));
    if (!tanh_gelu) RETURN_IF_ERROR(cuda::GeluBias(ffn, nullptr, t, inter, s));
    RETURN_IF_ERROR(gemm_->Run(ffn, l.output.w, tmp, DType::kBF16, t, h, inter, s, GemmEpilogue::kBias,
                               l.output.b16));
    RETURN_IF_ERROR(cuda::ResidualLayerNormBf16(tmp, xb, l.out_norm.g, l.out_norm.b, t, h, eps, s));
  }
  return OkStatus();
}

Status CudaBertRunner::Linear(const bf16* x, const DevLinear& lin, void* y, DType out, int64_t t) {
  const cudaStream_t s = stream_.get();
  if (lin.q8 != nullptr) {
    // int8: the input quantised as the CPU reference does (per token, or static), the exact int32 GEMM, then
    // the scales (the bias follows in the encoder's bias kernels).
    int8_t* xq = reinterpret_cast<int8_t*>(act_q_);
    if (lin.per_token) {
      RETURN_IF_ERROR(cuda::QuantizeInt8PerToken(x, t, lin.in, lin.x_inv, lin.x_scale_mul, lin.centred, xq,
                                                 act_scale_, act_mid_, s));
    } else {
      RETURN_IF_ERROR(cuda::QuantizeInt8Static(x, t, lin.in, lin.x_scale > 0.f ? 1.0f / lin.x_scale : 0.f,
                                               lin.x_inv, xq, s));
    }
    RETURN_IF_ERROR(gemm_->RunInt8(xq, lin.q8, acc_, t, lin.out, lin.in, s));
    return lin.per_token ? cuda::DequantizeInt8Gemm(acc_, t, lin.out, act_scale_, act_mid_, 0.f, lin.scale,
                                                    lin.w_sum, y, out, s)
                         : cuda::DequantizeInt8Gemm(acc_, t, lin.out, nullptr, nullptr, lin.x_scale, lin.scale,
                                                    nullptr, y, out, s);
  }
  if (lin.q == nullptr) return gemm_->Run(x, lin.w, y, out, t, lin.out, lin.in, s);
  RETURN_IF_ERROR(cuda::QuantizeRowsFp8(x, t, lin.in, lin.in, act_q_, act_scale_, 1.f, s));
  return gemm_->RunFp8(act_q_, act_scale_, lin.q, lin.scale, y, out, t, lin.out, lin.in, s);
}

// Pinned buffers go back to the pool only once the stream no longer reads or writes them (an error return may
// leave copies in flight).
struct PinnedLease {
  device::PinnedHostPool* pool;
  cudaStream_t stream;
  device::PinnedHostPool::Buffer in{}, out{};
  ~PinnedLease() {
    cudaStreamSynchronize(stream);
    pool->Release(in);
    pool->Release(out);
  }
};

Status CudaBertRunner::Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                             EmbedTimes* times) {
  const Nanos t0 = MonotonicNanos();
  const BertEncoder& enc = model_->encoder();
  const BertConfig& c = enc.config();
  const int64_t h = c.hidden_size;
  const int64_t n_seq = static_cast<int64_t>(batch_ids.size());
  out->assign(n_seq * h, 0.f);
  if (n_seq == 0) return OkStatus();
  if (n_seq > 65535)
    return InvalidArgumentError("cuda bert: {} sequences in one batch (at most 65535)", n_seq);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(model_->options().gpu_index));

  // Lengths after truncation (first max_seq_length - 1 ids + the last, as BertEncoder::Embed).
  const int max_seq = enc.max_seq_length();
  lens_.resize(n_seq);
  int64_t t = 0;
  int max_len = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    if (batch_ids[s].empty()) return InvalidArgumentError("sequence {} of the batch is empty", s);
    lens_[s] = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(batch_ids[s].size()), max_seq));
    t += lens_[s];
    max_len = std::max(max_len, lens_[s]);
  }
  if (t > model_->options().max_batch_tokens) {
    return InvalidArgumentError("cuda bert: a batch of {} tokens exceeds the limit of {} tokens per batch", t,
                                model_->options().max_batch_tokens);
  }

  // Stage ids | positions | cu_seqlens in pinned memory.
  const int64_t in_count = 2 * t + n_seq + 1;
  PinnedLease lease{&model_->pinned(), stream_.get()};
  ASSIGN_OR_RETURN(lease.in, model_->pinned().Acquire(in_count * 4));
  ASSIGN_OR_RETURN(lease.out, model_->pinned().Acquire(n_seq * h * 4));
  int32_t* ids = static_cast<int32_t*>(lease.in.data);
  int32_t* positions = ids + t;
  int32_t* cu = ids + 2 * t;
  cu[0] = 0;
  for (int64_t s = 0; s < n_seq; ++s) {
    const auto& src = batch_ids[s];
    const int32_t len = lens_[s];
    const int32_t o = cu[s];
    for (int32_t i = 0; i < len; ++i) {
      const int32_t id = i == len - 1 ? src.back() : src[i];
      if (id < 0 || id >= c.vocab_size) {
        return InvalidArgumentError("sequence {} token {}: id {} is outside [0, {})", s, i, id, c.vocab_size);
      }
      ids[o + i] = id;
      positions[o + i] = i;
    }
    cu[s + 1] = o + len;
  }
  RETURN_IF_ERROR(EnsureScratch(t, n_seq));
  arena_->Reset();
  ASSIGN_OR_RETURN(int32_t * d_in, arena_->AllocateArray<int32_t>(in_count));
  ASSIGN_OR_RETURN(float* pooled, arena_->AllocateArray<float>(n_seq * h));

  const cudaStream_t s = stream_.get();
  const Nanos t1 = MonotonicNanos();
  RETURN_IF_ERROR(ev_[0].Record(s));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_in, lease.in.data, in_count * 4, cudaMemcpyHostToDevice, s));
  RETURN_IF_ERROR(ev_[1].Record(s));
  const GraphKey key{t, n_seq, max_len};
  const auto graph = graphs_.find(key);
  if (graph != graphs_.end()) {
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graph->second, s));
    ++graph_launches_;
  } else {
    RETURN_IF_ERROR(Forward(d_in, t, n_seq, max_len, pooled));
  }
  RETURN_IF_ERROR(ev_[2].Record(s));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lease.out.data, pooled, n_seq * h * 4, cudaMemcpyDeviceToHost, s));
  RETURN_IF_ERROR(ev_[3].Record(s));
  RETURN_IF_ERROR(ev_[3].Synchronize());
  const Nanos t2 = MonotonicNanos();
  std::memcpy(out->data(), lease.out.data, n_seq * h * 4);
  if (times != nullptr) {
    ASSIGN_OR_RETURN(float h2d, device::Event::ElapsedMs(ev_[0], ev_[1]));
    ASSIGN_OR_RETURN(float compute, device::Event::ElapsedMs(ev_[1], ev_[2]));
    ASSIGN_OR_RETURN(float d2h, device::Event::ElapsedMs(ev_[2], ev_[3]));
    times->prepare_ns = t1 - t0;
    times->h2d_ns = static_cast<int64_t>(h2d * 1e6);
    times->compute_ns = static_cast<int64_t>(compute * 1e6);
    times->d2h_ns = static_cast<int64_t>(d2h * 1e6);
    times->finish_ns = MonotonicNanos() - t2;
  }
  // A shape's second eager pass (the first chose its GEMM algorithms) is captured for the ones after it.
  if (model_->options().cuda_graphs && graph == graphs_.end() && graphs_.size() < kMaxGraphs) {
    const auto seen = graph_seen_.find(key);
    if (seen == graph_seen_.end()) {
      graph_seen_[key] = false;  // seen once
    } else if (!seen->second) {
      Status st = CaptureForward(key, in_count);
      seen->second = true;  // captured, or failed: either way not tried again
      if (!st.ok()) {
        LOG_WARN("cuda bert: capturing the forward pass of {} tokens in {} sequences failed; it runs eagerly: {}",
                 t, n_seq, st.message());
      }
    }
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<BertDeviceModel>> Create(std::shared_ptr<const BertEncoder> encoder,
                                                  const BertDeviceOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<CudaBertModelImpl> m,
                   CudaBertModelImpl::Create(std::move(encoder), options));
  return std::shared_ptr<BertDeviceModel>(std::move(m));
}

bool Available() {
  return cuda::DeviceCount() > 0;
}

}  // namespace

StatusOr<std::shared_ptr<BertDeviceModel>> CreateCudaBert(std::shared_ptr<const BertEncoder> encoder,
                                                          const BertDeviceOptions& options) {
  return Create(std::move(encoder), options);
}

BertBackend CudaBertBackend() {
  return {.create = &Create, .available = &Available};
}

}  // namespace stoke
