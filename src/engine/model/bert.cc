#include "engine/model/bert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "base/half.h"
#include "base/logging.h"
#include "engine/loader/hf_folder.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace stoke {
namespace {

// Reads an integer key with a default; a present key of the wrong type or out of [lo, hi] is an error.
Status ReadInt(const nlohmann::json& j, const char* key, int lo, int hi, const std::string& source, int* v) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (!it->is_number_integer()) return InvalidArgumentError("{}: \"{}\" must be an integer", source, key);
  const int64_t x = it->get<int64_t>();
  if (x < lo || x > hi)
    return InvalidArgumentError("{}: \"{}\" = {} is outside [{}, {}]", source, key, x, lo, hi);
  *v = static_cast<int>(x);
  return OkStatus();
}

// Copies a 1-D (or any) tensor of `n` float-like values into fp32. Reads with memcpy: safetensors data
// need not be aligned.
StatusOr<std::vector<float>> ToFloats(const TensorRef& t, int64_t n) {
  if (t.numel() != n) {
    return InvalidArgumentError("tensor {} has shape {}, expected {} values", t.name, t.ShapeString(), n);
  }
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), t.data, n * sizeof(float));
      break;
    case DType::kF16:
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = t.dtype == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
      }
      break;
    default:
      return InvalidArgumentError("tensor {} has dtype {}; expected F32, F16 or BF16", t.name,
                                  DTypeName(t.dtype));
  }
  return out;
}

bool IsFloatLike(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Runs fn(begin, end) over row ranges of at least `grain` rows on `pool`: the element-wise ops are
// single-threaded, and at batch 32 x 128 tokens GELU alone is ~6 M erf calls per layer.
void ForRows(ThreadPool& pool, int64_t rows, int64_t dim, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, dim));
  pool.ParallelFor(rows, grain, fn);
}

ThreadPool& InlinePool() {
  static ThreadPool pool(1);  // no workers: ParallelFor runs inline, lock-free, safe from any thread
  return pool;
}

}  // namespace

std::string_view BertGemmInputName(BertGemmInput input) {
  switch (input) {
    case BertGemmInput::kQkv:
      return "qkv";
    case BertGemmInput::kAttnOut:
      return "attn_out";
    case BertGemmInput::kIntermediate:
      return "intermediate";
    case BertGemmInput::kOutput:
      return "output";
  }
  return "?";
}

std::string_view Int8ActivationsName(Int8Activations a) {
  return a == Int8Activations::kStatic ? "static" : "per-token";
}

StatusOr<Int8Activations> ParseInt8Activations(std::string_view s) {
  if (s == "per-token") return Int8Activations::kPerToken;
  if (s == "static") return Int8Activations::kStatic;
  return InvalidArgumentError("--int8-activations {}: expected per-token or static", s);
}

StatusOr<BertConfig> BertConfig::FromJson(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) return InvalidArgumentError("{}: expected a JSON object", source);
  BertConfig c;
  constexpr int kBig = 1 << 24;
  RETURN_IF_ERROR(ReadInt(j, "vocab_size", 1, 1 << 30, source, &c.vocab_size));
  RETURN_IF_ERROR(ReadInt(j, "hidden_size", 1, 1 << 16, source, &c.hidden_size));
  RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", 1, 1024, source, &c.num_hidden_layers));
  RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", 1, 4096, source, &c.num_attention_heads));
  RETURN_IF_ERROR(ReadInt(j, "intermediate_size", 1, kBig, source, &c.intermediate_size));
  RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", 2, kBig, source, &c.max_position_embeddings));
  RETURN_IF_ERROR(ReadInt(j, "type_vocab_size", 1, 1 << 16, source, &c.type_vocab_size));
  RETURN_IF_ERROR(ReadInt(j, "pad_token_id", 0, 1 << 30, source, &c.pad_token_id));
  if (auto it = j.find("layer_norm_eps"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) return InvalidArgumentError("{}: \"layer_norm_eps\" must be a number", source);
    c.layer_norm_eps = it->get<float>();
    if (!(c.layer_norm_eps >= 0.f))
      return InvalidArgumentError("{}: \"layer_norm_eps\" must be >= 0", source);
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return InvalidArgumentError("{}: \"hidden_act\" must be a string", source);
    c.hidden_act = it->get<std::string>();
  }
  // "gelu" in HF BERT is the exact erf GELU; tanh approximations would silently change the outputs.
  if (c.hidden_act != "gelu" && c.hidden_act != "gelu_python") {
    return UnimplementedError("{}: hidden_act \"{}\" is not supported (only exact erf \"gelu\")", source,
                              c.hidden_act);
  }
  if (auto it = j.find("position_embedding_type"); it != j.end() && it->is_string() && *it != "absolute") {
    return UnimplementedError("{}: position_embedding_type \"{}\" is not supported (only \"absolute\")",
                              source, it->get<std::string>());
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    return InvalidArgumentError("{}: hidden_size {} is not a multiple of num_attention_heads {}", source,
                                c.hidden_size, c.num_attention_heads);
  }
  return c;
}

BertEncoder::~BertEncoder() = default;

StatusOr<std::unique_ptr<BertEncoder>> BertEncoder::Load(const std::string& hf_dir) {
  std::unique_ptr<BertEncoder> enc(new BertEncoder());
  ASSIGN_OR_RETURN(enc->folder_, HfFolder::Open(hf_dir));
  const std::string config_path = enc->folder_->FilePath("config.json");
  const nlohmann::json& cfg = enc->folder_->config();
  if (auto it = cfg.find("model_type"); it != cfg.end() && it->is_string()) {
    const std::string mt = it->get<std::string>();
    if (mt != "bert")
      return UnimplementedError("{}: model_type \"{}\" is not a BERT encoder", config_path, mt);
  }
  ASSIGN_OR_RETURN(enc->config_, BertConfig::FromJson(cfg, config_path));
  enc->max_seq_length_ = enc->config_.max_position_embeddings;
  if (std::optional<int> n = enc->folder_->SentenceMaxSeqLength()) enc->set_max_seq_length(*n);
  RETURN_IF_ERROR(enc->LoadWeights().WithContext(hf_dir));
  LOG_INFO("bert: {} layers, hidden {}, heads {}, ffn {}, max_seq_length {}", enc->config_.num_hidden_layers,
           enc->config_.hidden_size, enc->config_.num_attention_heads, enc->config_.intermediate_size,
           enc->max_seq_length_);
  return enc;
}

void BertEncoder::set_max_seq_length(int n) {
  max_seq_length_ = std::clamp(n, 2, config_.max_position_embeddings);
}

Status BertEncoder::LoadWeights() {
  const BertConfig& c = config_;
  const int64_t h = c.hidden_size;
  auto find = [&](const std::string& name) -> StatusOr<const TensorRef*> {
    const TensorRef* t = folder_->FindTensor(name);
    if (t == nullptr) return NotFoundError("tensor {} not found", name);
    return t;
  };
  // A 2-D table or weight of shape [rows, cols] in a float-like dtype, with rows aligned for direct use.
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) -> StatusOr<const TensorRef*> {
    ASSIGN_OR_RETURN(const TensorRef* t, find(name));
    if (t->shape.size() != 2 || t->shape[0] != rows || t->shape[1] != cols) {
      return InvalidArgumentError("tensor {} has shape {}, expected [{}, {}]", name, t->ShapeString(), rows,
                                  cols);
    }
    if (!IsFloatLike(t->dtype)) {
      return InvalidArgumentError("tensor {} has dtype {}; expected F32, F16 or BF16", name,
                                  DTypeName(t->dtype));
    }
    return t;
  };
  auto vec = [&](const std::string& name, int64_t n) -> StatusOr<std::vector<float>> {
    ASSIGN_OR_RETURN(const TensorRef* t, find(name));
    return ToFloats(*t, n);
  };
  auto norm = [&](const std::string& prefix, Norm* out) -> Status {
    ASSIGN_OR_RETURN(out->gamma, vec(prefix + ".weight", h));
    ASSIGN_OR_RETURN(out->beta, vec(prefix + ".bias", h));
    return OkStatus();
  };
  auto linear = [&](const std::string& prefix, int64_t out_f, int64_t in_f, Linear* out) -> Status {
    ASSIGN_OR_RETURN(const TensorRef* w, matrix(prefix + ".weight", out_f, in_f));
    out->w = Aligned(*w);
    out->dtype = w->dtype;
    out->out = out_f;
    out->in = in_f;
    ASSIGN_OR_RETURN(out->bias, vec(prefix + ".bias", out_f));
    return OkStatus();
  };

  ASSIGN_OR_RETURN(const TensorRef* word, matrix("embeddings.word_embeddings.weight", c.vocab_size, h));
  word_emb_ = Aligned(*word);
  word_dtype_ = word->dtype;
  ASSIGN_OR_RETURN(const TensorRef* pos,
                   matrix("embeddings.position_embeddings.weight", c.max_position_embeddings, h));
  pos_emb_ = Aligned(*pos);
  pos_dtype_ = pos->dtype;
  ASSIGN_OR_RETURN(const TensorRef* type,
                   matrix("embeddings.token_type_embeddings.weight", c.type_vocab_size, h));
  TensorRef type0 = *type;  // row 0 only
  type0.shape = {h};
  type0.nbytes = type->nbytes / c.type_vocab_size;
  ASSIGN_OR_RETURN(type0_emb_, ToFloats(type0, h));
  RETURN_IF_ERROR(norm("embeddings.LayerNorm", &emb_norm_));

  layers_.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "encoder.layer." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    RETURN_IF_ERROR(linear(p + "attention.self.query", h, h, &l.query));
    RETURN_IF_ERROR(linear(p + "attention.self.key", h, h, &l.key));
    RETURN_IF_ERROR(linear(p + "attention.self.value", h, h, &l.value));
    RETURN_IF_ERROR(linear(p + "attention.output.dense", h, h, &l.attn_out));
    RETURN_IF_ERROR(norm(p + "attention.output.LayerNorm", &l.attn_norm));
    RETURN_IF_ERROR(linear(p + "intermediate.dense", c.intermediate_size, h, &l.intermediate));
    RETURN_IF_ERROR(linear(p + "output.dense", h, c.intermediate_size, &l.output));
    RETURN_IF_ERROR(norm(p + "output.LayerNorm", &l.out_norm));
  }
  return OkStatus();
}

const void* BertEncoder::Aligned(const TensorRef& t) {
  // safetensors writers other than PyTorch's need not align tensor data; the kernels read whole elements.
  const size_t elem = t.dtype == DType::kF32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(t.data) % elem == 0) return t.data;
  auto copy = std::make_unique<uint8_t[]>(t.nbytes);  // new[] is aligned for any scalar
  std::memcpy(copy.get(), t.data, t.nbytes);
  owned_.push_back(std::move(copy));
  return owned_.back().get();
}

Status BertEncoder::QuantizeWeightsFp8(const Fp8WeightOptions& options) {
  if (quantization_ != WeightQuantization::kNone) {
    return FailedPreconditionError("--quantization fp8: the encoder's weights are already quantised ({})",
                                   WeightQuantizationName(quantization_));
  }
  ThreadPool& pool = options.pool != nullptr ? *options.pool : ThreadPool::Default();
  // Into new buffers first: a failure leaves the encoder as it was.
  std::vector<std::unique_ptr<uint8_t[]>> bufs;
  std::vector<Linear*> all;
  for (Layer& l : layers_) {
    for (Linear* m : {&l.query, &l.key, &l.value, &l.attn_out, &l.intermediate, &l.output}) {
      auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(m->out * m->in) * sizeof(float));
      RETURN_IF_ERROR(RoundTripFp8Rows(m->dtype, m->w, m->out, m->in, options.testing_scale_multiplier, pool,
                                       reinterpret_cast<float*>(buf.get())));
      bufs.push_back(std::move(buf));
      all.push_back(m);
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    all[i]->w = bufs[i].get();
    all[i]->dtype = DType::kF32;
    owned_.push_back(std::move(bufs[i]));
  }
  quantization_ = WeightQuantization::kFp8;
  LOG_INFO(
      "bert: --quantization fp8: {} Linear weights rounded to E4M3 with a scale per output row, held as fp32",
      all.size());
  return OkStatus();
}

Status BertEncoder::QuantizeWeightsInt8(const BertActivationRanges& ranges,
                                        const Int8WeightOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Layer> quantized, QuantizedInt8Layers(ranges, options));
  layers_ = std::move(quantized);
  quantization_ = WeightQuantization::kInt8;
  LOG_INFO(
      "bert: --quantization int8: {} Linear weights as int8 with a scale per output row; activations "
      "{} ({} calibration samples, {} tokens, percentile {}, smoothing alpha {})",
      layers_.size() * 6,
      ranges.activations == Int8Activations::kPerToken ? "with a scale per token" : "with static scales",
      ranges.samples, ranges.tokens, ranges.percentile, ranges.smoothing_alpha);
  return OkStatus();
}

StatusOr<std::vector<BertEncoder::Layer>> BertEncoder::QuantizedInt8Layers(const BertActivationRanges& ranges,
                                                                           const Int8WeightOptions& options) const {
  if (quantization_ != WeightQuantization::kNone) {
    return FailedPreconditionError("--quantization int8: the encoder's weights are already quantised ({})",
                                   WeightQuantizationName(quantization_));
  }
  if (ranges.layers.size() != layers_.size()) {
    return InvalidArgumentError("--quantization int8: activation ranges for {} layers, the encoder has {}",
                                ranges.layers.size(), layers_.size());
  }
  const bool smoothed = !ranges.smooth.empty();
  if (smoothed && ranges.smooth.size() != layers_.size()) {
    return InvalidArgumentError("--quantization int8: smoothing factors for {} layers, the encoder has {}",
                                ranges.smooth.size(), layers_.size());
  }
  for (size_t i = 0; i < ranges.layers.size(); ++i) {
    for (int j = 0; j < kBertGemmInputs; ++j) {
      const int64_t width =
          j == static_cast<int>(BertGemmInput::kOutput) ? config_.intermediate_size : config_.hidden_size;
      if (smoothed) {
        const std::vector<float>& s = ranges.smooth[i][j];
        const bool ok = static_cast<int64_t>(s.size()) == width &&
                        std::all_of(s.begin(), s.end(), [](float v) { return v > 0.f && std::isfinite(v); });
        if (!ok) {
          return InvalidArgumentError(
              "--quantization int8: layer {} {} input: expected {} finite smoothing "
              "factors > 0",
              i, BertGemmInputName(static_cast<BertGemmInput>(j)), width);
        }
      }
      const float r = ranges.layers[i][j];
      if (!(r >= 0.f) || !std::isfinite(r)) {
        return InvalidArgumentError(
            "--quantization int8: layer {} {} input range {} is not a finite value >= 0", i,
            BertGemmInputName(static_cast<BertGemmInput>(j)), r);
      }
    }
  }
  ThreadPool& pool = options.pool != nullptr ? *options.pool : ThreadPool::Default();
  const bool per_token = ranges.activations == Int8Activations::kPerToken;
  std::vector<Layer> quantized = layers_;
  for (size_t i = 0; i < quantized.size(); ++i) {
    Layer& l = quantized[i];
    const auto& r = ranges.layers[i];
    const std::pair<Linear*, BertGemmInput> all[] = {{&l.query, BertGemmInput::kQkv},
                                                     {&l.key, BertGemmInput::kQkv},
                                                     {&l.value, BertGemmInput::kQkv},
                                                     {&l.attn_out, BertGemmInput::kAttnOut},
                                                     {&l.intermediate, BertGemmInput::kIntermediate},
                                                     {&l.output, BertGemmInput::kOutput}};
    for (const auto& [linear, input] : all) {
      Linear* m = linear;  // a plain variable: lambdas may not capture structured bindings (clang, C++20)
      m->w_int8.resize(static_cast<size_t>(m->out * m->in));
      m->w_scale.resize(static_cast<size_t>(m->out));
      // Per-token: the GELU output (FFN2's input) is quantised centred and unsmoothed, the others symmetric
      // and smoothed: what passes the gate on all-MiniLM-L6-v2 (docs/precision.md).
      const bool gelu_out = input == BertGemmInput::kOutput;
      const float* s =
          smoothed && !(per_token && gelu_out) ? ranges.smooth[i][static_cast<int>(input)].data() : nullptr;
      if (per_token) {
        m->x_per_token = true;
        m->x_centred = gelu_out;
        m->x_scale = 0.f;
        m->w_sum.resize(static_cast<size_t>(m->out));
        m->x_scale_mul = options.testing_activation_scale_multiplier;
        if (s != nullptr) {
          m->x_inv.resize(m->in);
          for (int64_t j = 0; j < m->in; ++j) m->x_inv[j] = 1.0f / s[j];
        }
      } else {
        m->x_scale = r[static_cast<int>(input)] / 127.0f * options.testing_activation_scale_multiplier;
        if (s != nullptr) {
          m->x_inv.resize(m->in);
          for (int64_t j = 0; j < m->in; ++j)
            m->x_inv[j] = m->x_scale > 0.f ? 1.0f / (m->x_scale * s[j]) : 0.f;
        }
      }
      // Widen each row to fp32 (the same values the fp32 path multiplies), smooth it, then quantise it.
      const size_t elem = m->dtype == DType::kF32 ? 4 : 2;
      pool.ParallelFor(m->out, 16, [&](int64_t r0, int64_t r1) {
        std::vector<float> row(m->in);
        for (int64_t o = r0; o < r1; ++o) {
          TensorRef t{.name = "w",
                      .dtype = m->dtype,
                      .shape = {m->in},
                      .data = static_cast<const uint8_t*>(m->w) + o * m->in * elem,
                      .nbytes = static_cast<size_t>(m->in) * elem};
          auto f = ToFloats(t, m->in);
          if (!f.ok()) continue;  // cannot happen: LoadWeights accepted only float-like dtypes
          if (s != nullptr) {
            for (int64_t j = 0; j < m->in; ++j) (*f)[j] *= s[j];
          }
          const int8_t* q = m->w_int8.data() + o * m->in;
          m->w_scale[o] = cpu::QuantizeInt8Row(f->data(), m->in, m->w_int8.data() + o * m->in);
          if (per_token) {
            int32_t sum = 0;
            for (int64_t j = 0; j < m->in; ++j) sum += q[j];
            m->w_sum[o] = m->w_scale[o] * static_cast<float>(sum);
          }
        }
      });
    }
  }
  return quantized;
}

Status BertEncoder::Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out) const {
  return Forward(batch_ids, out, ThreadPool::Default(), nullptr);
}

Status BertEncoder::Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                          ThreadPool& pool) const {
  return Forward(batch_ids, out, pool, nullptr);
}

Status BertEncoder::Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                          ThreadPool& pool, const BertActivationObserver& observer) const {
  return Forward(batch_ids, out, pool, &observer);
}

Status BertEncoder::Forward(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                            ThreadPool& pool, const BertActivationObserver* observer) const {
  const BertConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  const int heads = c.num_attention_heads;
  const int hd = c.head_dim();
  const int64_t n_seq = static_cast<int64_t>(batch_ids.size());

  // Flatten: every sequence's (possibly truncated) tokens back to back; offsets[s] = its first row.
  std::vector<int64_t> offsets(n_seq + 1, 0);
  for (int64_t s = 0; s < n_seq; ++s) {
    const auto& ids = batch_ids[s];
    if (ids.empty()) return InvalidArgumentError("sequence {} of the batch is empty", s);
    offsets[s + 1] = offsets[s] + std::min<int64_t>(static_cast<int64_t>(ids.size()), max_seq_length_);
  }
  const int64_t t = offsets[n_seq];
  std::vector<int32_t> ids(t), positions(t);
  for (int64_t s = 0; s < n_seq; ++s) {
    const auto& src = batch_ids[s];
    const int64_t len = offsets[s + 1] - offsets[s];
    // Truncation keeps the first len - 1 ids and the last one ([SEP]), like the tokenizer's max_length.
    std::copy(src.begin(), src.begin() + (len - 1), ids.begin() + offsets[s]);
    ids[offsets[s + 1] - 1] = src.back();
    for (int64_t i = 0; i < len; ++i) {
      const int32_t id = ids[offsets[s] + i];
      if (id < 0 || id >= c.vocab_size) {
        return InvalidArgumentError("sequence {} token {}: id {} is outside [0, {})", s, i, id, c.vocab_size);
      }
      positions[offsets[s] + i] = static_cast<int32_t>(i);
    }
  }
  out->assign(n_seq * h, 0.f);
  if (n_seq == 0) return OkStatus();

  // Activations, rows = tokens of all sequences: x, q, k, v, ctx, tmp = [t, h]; ffn = [t, inter].
  std::vector<float> x(t * h), q(t * h), k(t * h), v(t * h), ctx(t * h), tmp(t * h), ffn(t * inter);
  const float eps = c.layer_norm_eps;

  // Embeddings: LN(word + token_type[0] + position).
  RETURN_IF_ERROR(cpu::EmbeddingLookup(word_emb_, word_dtype_, c.vocab_size, h, ids.data(), t, x.data()));
  RETURN_IF_ERROR(cpu::EmbeddingLookup(pos_emb_, pos_dtype_, c.max_position_embeddings, h, positions.data(),
                                       t, tmp.data()));
  ForRows(pool, t, h, [&](int64_t r0, int64_t r1) {
    float* xr = x.data() + r0 * h;
    cpu::AddBias(xr, type0_emb_.data(), r1 - r0, h);
    cpu::Add(xr, tmp.data() + r0 * h, (r1 - r0) * h, xr);
    cpu::LayerNorm(xr, emb_norm_.gamma.data(), emb_norm_.beta.data(), r1 - r0, h, eps, xr);
  });

  // int8: the quantised input [t, in] and the int32 products [t, out] (kernels/cpu/int8_gemm.h).
  const bool int8 = quantization_ == WeightQuantization::kInt8;
  std::vector<int8_t> xq(int8 ? t * std::max(h, inter) : 0);
  std::vector<int32_t> acc32(int8 ? t * std::max(h, inter) : 0);
  std::vector<float> row_scale(int8 ? t : 0), row_mid(int8 ? t : 0);  // per-token: each row's scale, centre
  int layer_index = 0;
  auto observe = [&](BertGemmInput input, const float* in, int64_t cols) {
    if (observer != nullptr) (*observer)(layer_index, input, in, t, cols);
  };
  auto linear = [&](const Linear& l, const float* in, float* y) -> Status {
    if (!l.w_int8.empty() && l.x_per_token) {
      ForRows(pool, t, l.in, [&](int64_t r0, int64_t r1) {
        cpu::QuantizeInt8PerToken(in + r0 * l.in, r1 - r0, l.in, l.x_inv.empty() ? nullptr : l.x_inv.data(),
                                  l.x_scale_mul, l.x_centred, xq.data() + r0 * l.in, row_scale.data() + r0,
                                  row_mid.data() + r0);
      });
      RETURN_IF_ERROR(cpu::MatMulInt8(xq.data(), t, l.in, l.w_int8.data(), l.out, acc32.data(), pool));
      ForRows(pool, t, l.out, [&](int64_t r0, int64_t r1) {
        cpu::DequantizeInt8GemmPerToken(acc32.data() + r0 * l.out, r1 - r0, l.out, row_scale.data() + r0,
                                        row_mid.data() + r0, l.w_scale.data(), l.w_sum.data(), l.bias.data(),
                                        y + r0 * l.out);
      });
      return OkStatus();
    }
    if (!l.w_int8.empty()) {
      const float inv = l.x_scale > 0.f ? 1.0f / l.x_scale : 0.f;
      ForRows(pool, t, l.in, [&](int64_t r0, int64_t r1) {
        if (l.x_inv.empty()) {
          cpu::QuantizeInt8Static(in + r0 * l.in, (r1 - r0) * l.in, inv, xq.data() + r0 * l.in);
        } else {
          cpu::QuantizeInt8Columns(in + r0 * l.in, r1 - r0, l.in, l.x_inv.data(), xq.data() + r0 * l.in);
        }
      });
      RETURN_IF_ERROR(cpu::MatMulInt8(xq.data(), t, l.in, l.w_int8.data(), l.out, acc32.data(), pool));
      ForRows(pool, t, l.out, [&](int64_t r0, int64_t r1) {
        cpu::DequantizeInt8Gemm(acc32.data() + r0 * l.out, r1 - r0, l.out, l.x_scale, l.w_scale.data(),
                                l.bias.data(), y + r0 * l.out);
      });
      return OkStatus();
    }
    RETURN_IF_ERROR(cpu::MatMul(in, t, l.in, l.w, l.dtype, l.out, y, pool));
    ForRows(pool, t, l.out,
            [&](int64_t r0, int64_t r1) { cpu::AddBias(y + r0 * l.out, l.bias.data(), r1 - r0, l.out); });
    return OkStatus();
  };
  // x = LN(x + y), row-wise.
  auto residual_norm = [&](const float* y, const Norm& n) {
    ForRows(pool, t, h, [&](int64_t r0, int64_t r1) {
      float* xr = x.data() + r0 * h;
      cpu::Add(xr, y + r0 * h, (r1 - r0) * h, xr);
      cpu::LayerNorm(xr, n.gamma.data(), n.beta.data(), r1 - r0, h, eps, xr);
    });
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto attend = [&](int64_t s, ThreadPool& p) {
    const int64_t o = offsets[s] * h;
    cpu::EncoderAttention(q.data() + o, k.data() + o, v.data() + o, offsets[s + 1] - offsets[s], heads, hd,
                          scale, ctx.data() + o, p);
  };

  for (const Layer& l : layers_) {
    observe(BertGemmInput::kQkv, x.data(), h);
    RETURN_IF_ERROR(linear(l.query, x.data(), q.data()));
    RETURN_IF_ERROR(linear(l.key, x.data(), k.data()));
    RETURN_IF_ERROR(linear(l.value, x.data(), v.data()));
    // Attention per sequence over its own length. Many sequences: one per task (inline inside); few: let the
    // kernel split one sequence's heads and queries over the pool.
    if (n_seq >= pool.num_threads()) {
      pool.ParallelFor(n_seq, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) attend(s, InlinePool());
      });
    } else {
      for (int64_t s = 0; s < n_seq; ++s) attend(s, pool);
    }
    observe(BertGemmInput::kAttnOut, ctx.data(), h);
    RETURN_IF_ERROR(linear(l.attn_out, ctx.data(), tmp.data()));
    residual_norm(tmp.data(), l.attn_norm);
    observe(BertGemmInput::kIntermediate, x.data(), h);
    RETURN_IF_ERROR(linear(l.intermediate, x.data(), ffn.data()));
    ForRows(pool, t, inter,
            [&](int64_t r0, int64_t r1) { cpu::GeluErf(ffn.data() + r0 * inter, (r1 - r0) * inter); });
    observe(BertGemmInput::kOutput, ffn.data(), inter);
    RETURN_IF_ERROR(linear(l.output, ffn.data(), tmp.data()));
    residual_norm(tmp.data(), l.out_norm);
    ++layer_index;
  }

  // Mean over each sequence's tokens (all real: nothing is padded), then L2 normalisation (eps 1e-12 as
  // torch.nn.functional.normalize). Accumulated in double.
  std::vector<double> acc(h);
  for (int64_t s = 0; s < n_seq; ++s) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = offsets[s]; r < offsets[s + 1]; ++r) {
      const float* xr = x.data() + r * h;
      for (int64_t j = 0; j < h; ++j) acc[j] += xr[j];
    }
    const double inv_len = 1.0 / static_cast<double>(offsets[s + 1] - offsets[s]);
    double sq = 0;
    for (int64_t j = 0; j < h; ++j) {
      acc[j] *= inv_len;
      sq += acc[j] * acc[j];
    }
    const double inv_norm = 1.0 / std::max(std::sqrt(sq), 1e-12);
    float* o = out->data() + s * h;
    for (int64_t j = 0; j < h; ++j) o[j] = static_cast<float>(acc[j] * inv_norm);
  }
  return OkStatus();
}

}  // namespace stoke
