#include "engine/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ggml_numerics.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace stoke {

namespace {

Status CheckMatrix(const LinearWeight& w, int64_t rows, int64_t cols, const char* what) {
  if (w.empty() || w.rows != rows || w.cols != cols) {
    return InvalidArgumentError("llama weights: {} is [{}, {}], expected [{}, {}]", what, w.rows, w.cols,
                                rows, cols);
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<CpuLlama>> CpuLlama::Create(LlamaWeights weights, ThreadPool* pool,
                                                     bool ggml_numerics, KvCacheOptions kv) {
  const LlamaConfig& c = weights.config;
  RETURN_IF_ERROR(c.Validate());
  // A pre-quantised FP8 checkpoint's projections arrive as codes with row scales: multiplied as fp32 here.
  RETURN_IF_ERROR(WidenFp8Matrices(&weights, pool != nullptr ? *pool : ThreadPool::Default()));
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  RETURN_IF_ERROR(CheckMatrix(weights.embedding, c.vocab_size, hidden, "embedding"));
  RETURN_IF_ERROR(CheckMatrix(weights.lm_head, c.vocab_size, hidden, "lm_head"));
  if (static_cast<int64_t>(weights.final_norm.size()) != hidden) {
    return InvalidArgumentError("llama weights: final norm has {} values, expected {}",
                                weights.final_norm.size(), hidden);
  }
  if (static_cast<int>(weights.layers.size()) != c.num_layers) {
    return InvalidArgumentError("llama weights: {} layers, config says {}", weights.layers.size(),
                                c.num_layers);
  }
  for (const LlamaLayerWeights& l : weights.layers) {
    if (static_cast<int64_t>(l.attn_norm.size()) != hidden ||
        static_cast<int64_t>(l.ffn_norm.size()) != hidden) {
      return InvalidArgumentError("llama weights: norm size differs from hidden {}", hidden);
    }
    if (!l.qkv.empty()) {
      RETURN_IF_ERROR(CheckMatrix(l.qkv, qd + 2 * kvd, hidden, "qkv"));
    } else {
      RETURN_IF_ERROR(CheckMatrix(l.q, qd, hidden, "q"));
      RETURN_IF_ERROR(CheckMatrix(l.k, kvd, hidden, "k"));
      RETURN_IF_ERROR(CheckMatrix(l.v, kvd, hidden, "v"));
    }
    if (!l.qkv_bias.empty() && static_cast<int64_t>(l.qkv_bias.size()) != qd + 2 * kvd) {
      return InvalidArgumentError("llama weights: qkv bias has {} values, expected {}", l.qkv_bias.size(),
                                  qd + 2 * kvd);
    }
    RETURN_IF_ERROR(CheckMatrix(l.o, hidden, qd, "o"));
    if (!l.gate_up.empty()) {
      RETURN_IF_ERROR(CheckMatrix(l.gate_up, 2 * ffn, hidden, "gate_up"));
    } else {
      RETURN_IF_ERROR(CheckMatrix(l.gate, ffn, hidden, "gate"));
      RETURN_IF_ERROR(CheckMatrix(l.up, ffn, hidden, "up"));
    }
    RETURN_IF_ERROR(CheckMatrix(l.down, hidden, ffn, "down"));
  }
  if (!(kv.testing_dequant_scale_multiplier > 0.0f)) {
    return InvalidArgumentError("KV cache: dequantisation multiplier {} must be positive",
                                kv.testing_dequant_scale_multiplier);
  }
  return std::unique_ptr<CpuLlama>(new CpuLlama(std::move(weights), pool, ggml_numerics, kv));
}

CpuLlama::CpuLlama(LlamaWeights weights, ThreadPool* pool, bool ggml_numerics, KvCacheOptions kv)
    : weights_(std::move(weights)),
      pool_(pool != nullptr ? pool : &ThreadPool::Default()),
      ggml_(ggml_numerics),
      kv_opts_(kv) {
  inv_freq_ = RopeInverseFrequencies(weights_.config);
  const LlamaConfig& c = weights_.config;
  const bool divisors_ok =
      c.rope_freq_divisors.empty() || static_cast<int64_t>(c.rope_freq_divisors.size()) == c.head_dim / 2;
  // llama3 scaling reaches llama.cpp baked into rope_freqs (the divisors); without them it has no
  // ggml equivalent here.
  ggml_rope_ = ggml_ && divisors_ok &&
               (c.rope_scaling.type != RopeScaling::Type::kLlama3 || !c.rope_freq_divisors.empty());
}

// y[m, w.rows] = x[m, w.cols] · w^T
Status CpuLlama::Linear(const float* x, int64_t m, const LinearWeight& w, float* y) {
  if (ggml_ && cpu::ggml::HasMatMul(w.dtype))
    return cpu::ggml::MatMul(x, m, w.cols, w.data, w.dtype, w.rows, y, *pool_);
  return cpu::MatMul(x, m, w.cols, w.data, w.dtype, w.rows, y, *pool_);
}

void CpuLlama::Norm(const float* x, const std::vector<float>& w, int64_t rows, float* out) {
  const LlamaConfig& c = weights_.config;
  if (ggml_) {
    cpu::ggml::RmsNorm(x, w.data(), rows, c.hidden_size, c.rms_norm_eps, out);
  } else {
    cpu::RmsNorm(x, w.data(), rows, c.hidden_size, c.rms_norm_eps, out);
  }
}

void CpuLlama::Rope(float* x, int64_t tokens, int heads) {
  const LlamaConfig& c = weights_.config;
  if (!ggml_rope_) {
    cpu::RopeNeox(x, positions_.data(), tokens, heads, c.head_dim, inv_freq_.data());
    return;
  }
  cpu::ggml::RopeParams p;
  p.freq_base = c.rope_theta;
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) p.freq_scale = 1.0f / c.rope_scaling.factor;
  if (!c.rope_freq_divisors.empty()) p.freq_factors = c.rope_freq_divisors.data();
  cpu::ggml::Rope(x, positions_.data(), tokens, heads, c.head_dim, p);
}

Status CpuLlama::AllocateKvCache(int num_blocks, int block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return InvalidArgumentError("KV cache: num_blocks {} and block_size {} must be positive", num_blocks,
                                block_size);
  }
  const LlamaConfig& c = weights_.config;
  const size_t per_layer = size_t{2} * num_blocks * block_size * c.num_kv_heads * c.head_dim;
  const size_t scales = KvCacheDtypeIsQuantized(kv_opts_.dtype)
                            ? size_t{2} * num_blocks * block_size * c.num_kv_heads * c.num_layers
                            : 0;
  // Zero pages until written: the cache costs memory as sequences fill it.
  bool ok;
  if (quantized_kv()) {
    kv_.Reset();
    ok = kvq_.Assign(per_layer * c.num_layers * cpu::KvElementBytes(kv_opts_.dtype)) && kv_scales_.Assign(scales);
  } else {
    kvq_.Reset();
    kv_scales_.Reset();
    ok = kv_.Assign(per_layer * c.num_layers);
  }
  if (!ok) {
    return ResourceExhaustedError("KV cache: cannot allocate {} MiB",
                                  static_cast<int64_t>(num_blocks) * block_size * KvBytesPerToken() >> 20);
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  return OkStatus();
}

KvCacheShape CpuLlama::kv_shape() const {
  const LlamaConfig& c = weights_.config;
  return KvCacheShape{c.num_layers, c.num_kv_heads, c.head_dim, block_size_, num_blocks_};
}

std::string CpuLlama::kv_cache_dtype_name() const {
  return quantized_kv() ? std::string(KvCacheDtypeName(kv_opts_.dtype)) : "fp32";
}

int64_t CpuLlama::KvBytesPerToken() const {
  const LlamaConfig& c = weights_.config;
  const int64_t rows = int64_t{2} * c.num_layers * c.num_kv_heads;  // (K or V, layer, kv head)
  if (!quantized_kv()) return rows * c.head_dim * static_cast<int64_t>(sizeof(float));
  const int64_t scale = KvCacheDtypeIsQuantized(kv_opts_.dtype) ? sizeof(float) : 0;
  return rows * (c.head_dim * cpu::KvElementBytes(kv_opts_.dtype) + scale);
}

cpu::PagedKvLayer CpuLlama::KvLayer(int layer) {
  const LlamaConfig& c = weights_.config;
  const size_t half = size_t{1} * num_blocks_ * block_size_ * c.num_kv_heads * c.head_dim;
  float* base = kv_.data() + 2 * half * layer;
  return cpu::PagedKvLayer{base, base + half, num_blocks_, block_size_, c.num_kv_heads, c.head_dim};
}

cpu::QuantPagedKvLayer CpuLlama::QuantKvLayer(int layer) {
  const LlamaConfig& c = weights_.config;
  const size_t rows = size_t{1} * num_blocks_ * block_size_ * c.num_kv_heads;  // (slot, kv head) per layer
  const size_t half = rows * c.head_dim * cpu::KvElementBytes(kv_opts_.dtype);
  uint8_t* base = kvq_.data() + 2 * half * layer;
  const bool scaled = KvCacheDtypeIsQuantized(kv_opts_.dtype);
  float* sbase = scaled ? kv_scales_.data() + 2 * rows * layer : nullptr;
  return cpu::QuantPagedKvLayer{.dtype = kv_opts_.dtype,
                                .k = base,
                                .v = base + half,
                                .k_scale = sbase,
                                .v_scale = scaled ? sbase + rows : nullptr,
                                .num_blocks = num_blocks_,
                                .block_size = block_size_,
                                .num_kv_heads = c.num_kv_heads,
                                .head_dim = c.head_dim,
                                .dequant_scale_multiplier = kv_opts_.testing_dequant_scale_multiplier};
}

Status CpuLlama::CopyKvBlock(int32_t src, int32_t dst) {
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_) {
    return InvalidArgumentError("CopyKvBlock: block {} -> {} outside [0, {})", src, dst, num_blocks_);
  }
  if (src == dst) return OkStatus();
  const LlamaConfig& c = weights_.config;
  if (quantized_kv()) {
    const size_t block_rows = size_t{1} * block_size_ * c.num_kv_heads;
    const size_t block_bytes = block_rows * c.head_dim * cpu::KvElementBytes(kv_opts_.dtype);
    for (int l = 0; l < c.num_layers; ++l) {
      const cpu::QuantPagedKvLayer kv = QuantKvLayer(l);
      std::memcpy(kv.k + dst * block_bytes, kv.k + src * block_bytes, block_bytes);
      std::memcpy(kv.v + dst * block_bytes, kv.v + src * block_bytes, block_bytes);
      if (kv.k_scale == nullptr) continue;
      std::memcpy(kv.k_scale + dst * block_rows, kv.k_scale + src * block_rows, block_rows * sizeof(float));
      std::memcpy(kv.v_scale + dst * block_rows, kv.v_scale + src * block_rows, block_rows * sizeof(float));
    }
    return OkStatus();
  }
  const size_t block_floats = size_t{1} * block_size_ * c.num_kv_heads * c.head_dim;
  for (int l = 0; l < c.num_layers; ++l) {
    cpu::PagedKvLayer kv = KvLayer(l);
    std::memcpy(kv.k + dst * block_floats, kv.k + src * block_floats, block_floats * sizeof(float));
    std::memcpy(kv.v + dst * block_floats, kv.v + src * block_floats, block_floats * sizeof(float));
  }
  return OkStatus();
}

Status CpuLlama::ValidateInput(const StepInput& in) const {
  return ValidateStepInput(in, num_blocks_, block_size_, weights_.config.vocab_size);
}

Status CpuLlama::RunLayer(int layer, const StepInput& in, int64_t T) {
  const LlamaConfig& c = weights_.config;
  const LlamaLayerWeights& w = weights_.layers[layer];
  ThreadPool& pool = *pool_;
  const int64_t hd = c.head_dim;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd, tot = qd + 2 * kvd;

  Norm(x_.data(), w.attn_norm, T, h_.data());
  if (!w.qkv.empty()) {
    RETURN_IF_ERROR(Linear(h_.data(), T, w.qkv, qkv_.data()));
    if (!w.qkv_bias.empty()) cpu::AddBias(qkv_.data(), w.qkv_bias.data(), T, tot);
    for (int64_t t = 0; t < T; ++t) {  // split [T, q | k | v] into dense q, k, v
      const float* row = qkv_.data() + t * tot;
      std::memcpy(q_.data() + t * qd, row, qd * sizeof(float));
      std::memcpy(k_.data() + t * kvd, row + qd, kvd * sizeof(float));
      std::memcpy(v_.data() + t * kvd, row + qd + kvd, kvd * sizeof(float));
    }
  } else {
    RETURN_IF_ERROR(Linear(h_.data(), T, w.q, q_.data()));
    RETURN_IF_ERROR(Linear(h_.data(), T, w.k, k_.data()));
    RETURN_IF_ERROR(Linear(h_.data(), T, w.v, v_.data()));
    if (!w.qkv_bias.empty()) {
      cpu::AddBias(q_.data(), w.qkv_bias.data(), T, qd);
      cpu::AddBias(k_.data(), w.qkv_bias.data() + qd, T, kvd);
      cpu::AddBias(v_.data(), w.qkv_bias.data() + qd + kvd, T, kvd);
    }
  }
  Rope(q_.data(), T, c.num_heads);
  Rope(k_.data(), T, c.num_kv_heads);

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (quantized_kv()) {
    const cpu::QuantPagedKvLayer kvq = QuantKvLayer(layer);
    cpu::WriteKv(kvq, k_.data(), v_.data(), slots_.data(), T);
    for (const StepSequence& seq : in.sequences) {
      const int64_t off = int64_t{seq.token_begin} * qd;
      cpu::PagedAttention(q_.data() + off, seq.num_tokens, c.num_heads, seq.start_pos, seq.block_table.data(),
                          kvq, scale, attn_.data() + off, pool);
    }
    return FinishLayer(w, T);
  }
  const cpu::PagedKvLayer kv = KvLayer(layer);
  const bool interleave = weights_.gguf_qk_interleaved;
  if (ggml_) {
    cpu::ggml::WriteKv(kv, k_.data(), v_.data(), slots_.data(), T, interleave);
  } else {
    cpu::WriteKv(kv, k_.data(), v_.data(), slots_.data(), T);
  }
  for (const StepSequence& seq : in.sequences) {
    const int64_t off = int64_t{seq.token_begin} * qd;
    if (ggml_) {
      cpu::ggml::PagedAttention(q_.data() + off, seq.num_tokens, c.num_heads, seq.start_pos,
                                seq.block_table.data(), kv, scale, interleave, attn_.data() + off, pool);
    } else {
      cpu::PagedAttention(q_.data() + off, seq.num_tokens, c.num_heads, seq.start_pos, seq.block_table.data(),
                          kv, scale, attn_.data() + off, pool);
    }
  }
  return FinishLayer(w, T);
}

// The layer after attention: output projection and residual, then the MLP and its residual.
Status CpuLlama::FinishLayer(const LlamaLayerWeights& w, int64_t T) {
  const LlamaConfig& c = weights_.config;
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  RETURN_IF_ERROR(Linear(attn_.data(), T, w.o, proj_.data()));
  cpu::Add(x_.data(), proj_.data(), T * H, x_.data());

  Norm(x_.data(), w.ffn_norm, T, h_.data());
  auto silu_mul = [&](const float* gate, const float* up, int64_t n, float* out) {
    if (ggml_) {
      cpu::ggml::SwiGlu(gate, up, n, out);
    } else {
      cpu::SiluMul(gate, up, n, out);
    }
  };
  if (!w.gate_up.empty()) {
    RETURN_IF_ERROR(Linear(h_.data(), T, w.gate_up, ffn2_.data()));  // [T, gate | up]
    for (int64_t t = 0; t < T; ++t) {
      const float* row = ffn2_.data() + t * 2 * F;
      silu_mul(row, row + F, F, ffn_.data() + t * F);
    }
  } else {
    RETURN_IF_ERROR(Linear(h_.data(), T, w.gate, ffn_.data()));
    RETURN_IF_ERROR(Linear(h_.data(), T, w.up, ffn2_.data()));
    silu_mul(ffn_.data(), ffn2_.data(), T * F, ffn_.data());
  }
  RETURN_IF_ERROR(Linear(ffn_.data(), T, w.down, proj_.data()));
  cpu::Add(x_.data(), proj_.data(), T * H, x_.data());
  return OkStatus();
}

Status CpuLlama::Step(const StepInput& in, StepOutput* out) {
  RETURN_IF_ERROR(ValidateInput(in));
  const LlamaConfig& c = weights_.config;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int64_t H = c.hidden_size, F = c.intermediate_size, hd = c.head_dim;
  const int64_t qd = c.num_heads * hd, kvd = c.num_kv_heads * hd;
  out->logits.clear();
  out->num_rows = 0;
  if (T == 0) return OkStatus();

  x_.resize(T * H);
  h_.resize(T * H);
  qkv_.resize(T * (qd + 2 * kvd));
  q_.resize(T * qd);
  k_.resize(T * kvd);
  v_.resize(T * kvd);
  attn_.resize(T * qd);
  proj_.resize(T * H);
  ffn_.resize(T * F);
  ffn2_.resize(T * 2 * F);
  positions_.resize(T);
  slots_.resize(T);
  rows_.clear();
  for (const StepSequence& seq : in.sequences) {
    for (int32_t i = 0; i < seq.num_tokens; ++i) {
      const int32_t pos = seq.start_pos + i;
      positions_[seq.token_begin + i] = pos;
      slots_[seq.token_begin + i] = seq.block_table[pos / block_size_] * block_size_ + pos % block_size_;
    }
    if (seq.logits == StepSequence::Logits::kAll) {
      for (int32_t i = 0; i < seq.num_tokens; ++i) rows_.push_back(seq.token_begin + i);
    } else if (seq.logits == StepSequence::Logits::kLast) {
      rows_.push_back(seq.token_begin + seq.num_tokens - 1);
    }
  }

  const LinearWeight& emb = weights_.embedding;
  RETURN_IF_ERROR(cpu::EmbeddingLookup(emb.data, emb.dtype, emb.rows, H, in.token_ids.data(), T, x_.data()));
  for (int l = 0; l < c.num_layers; ++l) RETURN_IF_ERROR(RunLayer(l, in, T));

  const int64_t R = static_cast<int64_t>(rows_.size());
  if (R == 0) return OkStatus();
  sel_.resize(R * H);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(sel_.data() + r * H, x_.data() + rows_[r] * H, H * sizeof(float));
  Norm(sel_.data(), weights_.final_norm, R, sel_.data());
  out->logits.resize(R * c.vocab_size);
  RETURN_IF_ERROR(Linear(sel_.data(), R, weights_.lm_head, out->logits.data()));
  out->num_rows = R;
  return OkStatus();
}

}  // namespace stoke
