#include "engine/model/llama_weights.h"

#include <cstring>
#include <functional>
#include <map>

#include "engine/loader/gguf_reader.h"
#include "engine/loader/hf_folder.h"
#include "engine/model/fp8_checkpoint.h"
#include "kernels/cpu/quants.h"

namespace stoke {

int64_t GgufQkSourceRow(int64_t hf_row, int head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t head = hf_row / head_dim;
  const int64_t r = hf_row % head_dim;
  const int64_t j = r / half;  // 0: first half (cos partner), 1: second half
  const int64_t i = r % half;
  return head * head_dim + 2 * i + j;
}

StatusOr<LinearWeight> ConcatRows(const std::vector<RowSource>& parts, LlamaWeights* owner) {
  if (parts.empty()) return InvalidArgumentError("ConcatRows: no parts");
  const DType dt = parts[0].w.dtype;
  const int64_t cols = parts[0].w.cols;
  int64_t rows = 0;
  for (const RowSource& p : parts) {
    if (p.w.dtype != dt || p.w.cols != cols) {
      return InvalidArgumentError("ConcatRows: parts differ in dtype or columns");
    }
    if (p.unpermute_qk && (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.w.rows % p.head_dim != 0)) {
      return InvalidArgumentError("ConcatRows: {} rows do not split into heads of {}", p.w.rows, p.head_dim);
    }
    rows += p.w.rows;
  }
  ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(dt, cols));
  auto buf = std::make_unique<uint8_t[]>(row_bytes * rows);
  uint8_t* dst = buf.get();
  for (const RowSource& p : parts) {
    const auto* src = static_cast<const uint8_t*>(p.w.data);
    for (int64_t r = 0; r < p.w.rows; ++r) {
      const int64_t s = p.unpermute_qk ? GgufQkSourceRow(r, p.head_dim) : r;
      std::memcpy(dst, src + s * row_bytes, row_bytes);
      dst += row_bytes;
    }
  }
  LinearWeight out{buf.get(), dt, rows, cols};
  owner->owned.push_back(std::move(buf));
  if (dt == DType::kF8E4M3) {  // codes with a scale per row: the scales follow their rows
    auto scales = std::make_unique<uint8_t[]>(static_cast<size_t>(rows) * sizeof(float));
    auto* s = reinterpret_cast<float*>(scales.get());
    for (const RowSource& p : parts) {
      if (p.w.row_scale == nullptr || p.unpermute_qk) {
        return InvalidArgumentError("ConcatRows: F8_E4M3 parts need their row scales (and no Q/K permutation)");
      }
      s = std::copy(p.w.row_scale, p.w.row_scale + p.w.rows, s);
    }
    out.row_scale = reinterpret_cast<const float*>(scales.get());
    owner->owned.push_back(std::move(scales));
  }
  return out;
}

Status WidenFp8Matrices(LlamaWeights* w, ThreadPool& pool) {
  auto widen = [&](LinearWeight* m) -> Status {
    if (m->empty() || m->dtype != DType::kF8E4M3) return OkStatus();
    if (m->row_scale == nullptr) return InvalidArgumentError("an F8_E4M3 matrix without row scales");
    auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(m->rows * m->cols) * sizeof(float));
    auto* out = reinterpret_cast<float*>(buf.get());
    DequantizeFp8Rows(static_cast<const uint8_t*>(m->data), m->row_scale, m->rows, m->cols, pool, out);
    *m = LinearWeight{out, DType::kF32, m->rows, m->cols};
    w->owned.push_back(std::move(buf));
    return OkStatus();
  };
  RETURN_IF_ERROR(widen(&w->embedding));
  RETURN_IF_ERROR(widen(&w->lm_head));
  for (LlamaLayerWeights& l : w->layers) {
    for (LinearWeight* m : {&l.qkv, &l.q, &l.k, &l.v, &l.o, &l.gate_up, &l.gate, &l.up, &l.down})
      RETURN_IF_ERROR(widen(m));
  }
  return OkStatus();
}

namespace {

// Where a format keeps each tensor.
struct TensorNames {
  std::string embedding, final_norm, lm_head;
  std::function<std::string(int layer, const char* part)> layer;  // part: "attn_norm", "q", "q_bias", ...
};

const TensorNames& GgufNames() {
  static const TensorNames n{
      "token_embd.weight", "output_norm.weight", "output.weight", [](int l, const char* part) {
        static const std::map<std::string, std::string> kMap = {{"attn_norm", "attn_norm.weight"},
                                                                {"q", "attn_q.weight"},
                                                                {"k", "attn_k.weight"},
                                                                {"v", "attn_v.weight"},
                                                                {"q_bias", "attn_q.bias"},
                                                                {"k_bias", "attn_k.bias"},
                                                                {"v_bias", "attn_v.bias"},
                                                                {"o", "attn_output.weight"},
                                                                {"ffn_norm", "ffn_norm.weight"},
                                                                {"gate", "ffn_gate.weight"},
                                                                {"up", "ffn_up.weight"},
                                                                {"down", "ffn_down.weight"}};
        return fmt::format("blk.{}.{}", l, kMap.at(part));
      }};
  return n;
}

const TensorNames& HfNames() {
  static const TensorNames n{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                             [](int l, const char* part) {
                               static const std::map<std::string, std::string> kMap = {
                                   {"attn_norm", "input_layernorm.weight"},
                                   {"q", "self_attn.q_proj.weight"},
                                   {"k", "self_attn.k_proj.weight"},
                                   {"v", "self_attn.v_proj.weight"},
                                   {"q_bias", "self_attn.q_proj.bias"},
                                   {"k_bias", "self_attn.k_proj.bias"},
                                   {"v_bias", "self_attn.v_proj.bias"},
                                   {"o", "self_attn.o_proj.weight"},
                                   {"ffn_norm", "post_attention_layernorm.weight"},
                                   {"gate", "mlp.gate_proj.weight"},
                                   {"up", "mlp.up_proj.weight"},
                                   {"down", "mlp.down_proj.weight"}};
                               return fmt::format("model.layers.{}.{}", l, kMap.at(part));
                             }};
  return n;
}

using FindFn = std::function<const TensorRef*(const std::string&)>;

class Loader {
 public:
  Loader(FindFn find, const TensorNames& names, std::string file, bool gguf_llama_permuted,
         Fp8CheckpointFormat fp8 = {})
      : find_(std::move(find)),
        names_(names),
        file_(std::move(file)),
        unpermute_(gguf_llama_permuted),
        fp8_(std::move(fp8)) {}

  Status Load(LlamaWeights* w);

 private:
  StatusOr<const TensorRef*> Get(const std::string& name) const {
    const TensorRef* t = find_(name);
    if (t == nullptr) return NotFoundError("{}: tensor {} missing", file_, name);
    return t;
  }
  // keep_codes: an F8 matrix with per-tensor or per-channel scales may stay codes with row scales (the
  // projections); false dequantises it (the embedding and lm_head, read as tables and by other paths).
  StatusOr<LinearWeight> Matrix(const std::string& name, int64_t rows, int64_t cols, LlamaWeights* w,
                                bool keep_codes = true) {
    ASSIGN_OR_RETURN(const TensorRef* t, Get(name));
    if (t->shape.size() != 2 || t->shape[0] != rows || t->shape[1] != cols) {
      return InvalidArgumentError("{}: tensor {} has shape {}, expected [{}, {}]", file_, name,
                                  t->ShapeString(), rows, cols);
    }
    if (t->dtype == DType::kF8E4M3) return Fp8Matrix(*t, w, keep_codes);
    const DTypeInfo& info = GetDTypeInfo(t->dtype);
    const bool supported =
        t->dtype == DType::kF32 || t->dtype == DType::kF16 || t->dtype == DType::kBF16 || info.quantized;
    if (!supported) {
      return InvalidArgumentError("{}: tensor {} has dtype {}, not a weight type", file_, name, info.name);
    }
    ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(t->dtype, cols));
    if (t->nbytes < row_bytes * rows) {
      return InvalidArgumentError("{}: tensor {} holds {} bytes, expected {}", file_, name, t->nbytes,
                                  row_bytes * rows);
    }
    return LinearWeight{t->data, t->dtype, rows, cols};
  }
  StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) const {
    ASSIGN_OR_RETURN(const TensorRef* t, Get(name));
    if (t->numel() != n || t->shape.size() != 1) {
      return InvalidArgumentError("{}: tensor {} has shape {}, expected [{}]", file_, name, t->ShapeString(),
                                  n);
    }
    if (t->dtype == DType::kF8E4M3) {
      return InvalidArgumentError("{}: tensor {} is F8_E4M3; stoke reads fp8 only for Linear weights", file_,
                                  name);
    }
    std::vector<float> v(n);
    Status st = cpu::DequantizeRow(t->dtype, t->data, v.data(), n);
    if (!st.ok()) return st.WithContext(fmt::format("{}: tensor {}", file_, name));
    return v;
  }
  // A pre-quantised FP8 weight (engine/model/fp8_checkpoint.h): its codes with one scale per row when its
  // scales allow it and keep_codes, else dequantised into an owned F32 matrix. Marks `w` as fp8 and counts the
  // layout of its scale.
  StatusOr<LinearWeight> Fp8Matrix(const TensorRef& t, LlamaWeights* w, bool keep_codes) {
    const std::string scale_name = Fp8ScaleName(t.name, [&](const std::string& n) { return find_(n) != nullptr; });
    if (scale_name.empty()) {
      return NotFoundError(
          "{}: tensor {} is F8_E4M3 but {}_scale (or {}_scale_inv) is missing: a pre-quantised FP8 checkpoint "
          "keeps a scale beside each fp8 weight",
          file_, t.name, t.name, t.name);
    }
    const int64_t rows = t.shape[0], cols = t.shape[1];
    ThreadPool& pool = ThreadPool::Default();
    StatusOr<Fp8Scales> scales = ReadFp8Scales(t, *find_(scale_name), fp8_);
    if (!scales.ok()) return scales.status().WithContext(file_);
    w->quantization = WeightQuantization::kFp8;
    ++w->fp8_checkpoint.matrices[static_cast<size_t>(scales->layout)];
    if (keep_codes && scales->layout != Fp8ScaleLayout::kPerBlock) {
      if (Status st = CheckFp8Codes(t, pool); !st.ok()) return st.WithContext(file_);
      auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(rows) * sizeof(float));
      auto* rs = reinterpret_cast<float*>(buf.get());
      for (int64_t r = 0; r < rows; ++r) rs[r] = scales->at(r, 0);
      LinearWeight lin{t.data, DType::kF8E4M3, rows, cols, rs};
      w->owned.push_back(std::move(buf));
      return lin;
    }
    auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(rows * cols) * sizeof(float));
    StatusOr<Fp8ScaleLayout> layout =
        DequantizeFp8Weight(t, *find_(scale_name), fp8_, pool, reinterpret_cast<float*>(buf.get()));
    if (!layout.ok()) return layout.status().WithContext(file_);
    LinearWeight lin{buf.get(), DType::kF32, rows, cols};
    w->owned.push_back(std::move(buf));
    return lin;
  }
  Status LoadLayer(int l, LlamaWeights* w);

  FindFn find_;
  const TensorNames& names_;
  std::string file_;
  bool unpermute_;
  Fp8CheckpointFormat fp8_;
};

Status Loader::LoadLayer(int l, LlamaWeights* w) {
  const LlamaConfig& c = w->config;
  const int64_t hidden = c.hidden_size, hd = c.head_dim;
  const int64_t q_rows = int64_t{c.num_heads} * hd, kv_rows = int64_t{c.num_kv_heads} * hd;
  const int64_t ffn = c.intermediate_size;
  auto name = [&](const char* part) { return names_.layer(l, part); };
  LlamaLayerWeights& lw = w->layers[l];
  ASSIGN_OR_RETURN(lw.attn_norm, Vector(name("attn_norm"), hidden));
  ASSIGN_OR_RETURN(lw.ffn_norm, Vector(name("ffn_norm"), hidden));
  ASSIGN_OR_RETURN(LinearWeight q, Matrix(name("q"), q_rows, hidden, w));
  ASSIGN_OR_RETURN(LinearWeight k, Matrix(name("k"), kv_rows, hidden, w));
  ASSIGN_OR_RETURN(LinearWeight v, Matrix(name("v"), kv_rows, hidden, w));
  ASSIGN_OR_RETURN(lw.o, Matrix(name("o"), hidden, q_rows, w));
  ASSIGN_OR_RETURN(LinearWeight gate, Matrix(name("gate"), ffn, hidden, w));
  ASSIGN_OR_RETURN(LinearWeight up, Matrix(name("up"), ffn, hidden, w));
  ASSIGN_OR_RETURN(lw.down, Matrix(name("down"), hidden, ffn, w));

  RowSource qs{q, unpermute_, static_cast<int>(hd)}, ks{k, unpermute_, static_cast<int>(hd)}, vs{v};
  if (q.dtype == k.dtype && k.dtype == v.dtype) {
    ASSIGN_OR_RETURN(lw.qkv, ConcatRows({qs, ks, vs}, w));
  } else {  // mixed types (e.g. Q4_K_M keeps V in Q6_K): three matmuls
    if (unpermute_) {
      ASSIGN_OR_RETURN(q, ConcatRows({qs}, w));
      ASSIGN_OR_RETURN(k, ConcatRows({ks}, w));
    }
    lw.q = q, lw.k = k, lw.v = v;
  }
  if (gate.dtype == up.dtype) {
    ASSIGN_OR_RETURN(lw.gate_up, ConcatRows({RowSource{gate}, RowSource{up}}, w));
  } else {
    lw.gate = gate, lw.up = up;
  }

  if (c.attention_bias) {
    ASSIGN_OR_RETURN(std::vector<float> qb, Vector(name("q_bias"), q_rows));
    ASSIGN_OR_RETURN(std::vector<float> kb, Vector(name("k_bias"), kv_rows));
    ASSIGN_OR_RETURN(std::vector<float> vb, Vector(name("v_bias"), kv_rows));
    lw.qkv_bias.reserve(q_rows + 2 * kv_rows);
    // Biases live in the same (possibly permuted) row order as their weights.
    for (int64_t r = 0; r < q_rows; ++r) lw.qkv_bias.push_back(qb[unpermute_ ? GgufQkSourceRow(r, hd) : r]);
    for (int64_t r = 0; r < kv_rows; ++r) lw.qkv_bias.push_back(kb[unpermute_ ? GgufQkSourceRow(r, hd) : r]);
    lw.qkv_bias.insert(lw.qkv_bias.end(), vb.begin(), vb.end());
  }
  return OkStatus();
}

Status Loader::Load(LlamaWeights* w) {
  LlamaConfig& c = w->config;
  {
    ASSIGN_OR_RETURN(const TensorRef* emb, Get(names_.embedding));
    if (emb->shape.size() == 2 && emb->shape[0] != c.vocab_size) {
      return InvalidArgumentError("{}: {} has {} rows but the config says vocab_size {}", file_,
                                  names_.embedding, emb->shape[0], c.vocab_size);
    }
  }
  ASSIGN_OR_RETURN(w->embedding, Matrix(names_.embedding, c.vocab_size, c.hidden_size, w, /*keep_codes=*/false));
  ASSIGN_OR_RETURN(w->final_norm, Vector(names_.final_norm, c.hidden_size));
  if (find_(names_.lm_head) != nullptr) {
    ASSIGN_OR_RETURN(w->lm_head, Matrix(names_.lm_head, c.vocab_size, c.hidden_size, w, /*keep_codes=*/false));
    c.tie_word_embeddings = false;
  } else {
    // Tied models omit the head (and some untied-config files still tie in practice): reuse the table.
    w->lm_head = w->embedding;
    c.tie_word_embeddings = true;
  }
  // q/k/v bias by presence (Qwen2 has it without a config key; a llama config may lack attention_bias).
  c.attention_bias = find_(names_.layer(0, "q_bias")) != nullptr;
  w->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) RETURN_IF_ERROR(LoadLayer(l, w));
  return OkStatus();
}

}  // namespace

StatusOr<LlamaWeights> LoadLlamaWeights(std::shared_ptr<const GgufFile> gguf) {
  LlamaWeights w;
  ASSIGN_OR_RETURN(w.config, LlamaConfigFromGguf(*gguf));
  // llama.cpp's converter permutes Q/K for archs that use its adjacent-pair RoPE (llama, mistral), not for
  // NeoX-RoPE archs (qwen2).
  const bool permuted = w.config.architecture == "llama" || w.config.architecture == "mistral";
  const GgufFile* f = gguf.get();
  Loader loader([f](const std::string& n) { return f->FindTensor(n); }, GgufNames(), gguf->path(), permuted);
  RETURN_IF_ERROR(loader.Load(&w));
  w.source = std::move(gguf);
  w.from_gguf = true;
  w.gguf_qk_interleaved = permuted;
  return w;
}

StatusOr<LlamaWeights> LoadLlamaWeights(std::shared_ptr<const HfFolder> folder) {
  LlamaWeights w;
  {
    StatusOr<LlamaConfig> c = LlamaConfigFromHfConfig(folder->config());
    if (!c.ok()) return c.status().WithContext(folder->dir());
    w.config = std::move(c).value();
  }
  StatusOr<Fp8CheckpointFormat> fp8 = Fp8CheckpointFormatFromConfig(folder->config());
  if (!fp8.ok()) return fp8.status().WithContext(folder->dir());
  w.fp8_checkpoint.method = fp8->method;
  const HfFolder* f = folder.get();
  Loader loader([f](const std::string& n) { return f->FindTensor(n); }, HfNames(), folder->dir(), false,
                *std::move(fp8));
  RETURN_IF_ERROR(loader.Load(&w));
  w.source = std::move(folder);
  return w;
}

}  // namespace stoke
