// Test support for the Llama decoder: a tiny random Llama held as HF-named fp32 tensors, turned into
// in-memory LlamaWeights, written as an HF folder (safetensors) or a GGUF file (Q/K permuted as llama.cpp's
// converter does), and a double-precision reference forward pass that shares no code with CpuLlama.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/model/decoder.h"
#include "engine/model/llama_config.h"
#include "engine/model/llama_weights.h"

namespace stoke::testing {

struct TinyLlama {
  LlamaConfig c;
  std::map<std::string, std::vector<float>> w;  // HF names, HF row order
  std::map<std::string, std::vector<int64_t>> shapes;

  void Add(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng, float stddev,
           float mean = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    w[name] = std::move(v);
    shapes[name] = std::move(shape);
  }

  // hidden 64, 4 heads x 16 over 2 kv heads, ffn 96, 2 layers, vocab 96 (multiples of 32 so Q8_0 works).
  explicit TinyLlama(uint32_t seed, bool tied = false, bool bias = false, int layers = 2) {
    c.vocab_size = 96;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_layers = layers;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.max_position = 512;
    c.rope_theta = 10000.0f;
    c.rms_norm_eps = 1e-5f;
    c.tie_word_embeddings = tied;
    c.attention_bias = bias;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    std::mt19937 rng(seed);
    const int64_t H = c.hidden_size, qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
    Add("model.embed_tokens.weight", {c.vocab_size, H}, rng, 1.0f);
    Add("model.norm.weight", {H}, rng, 0.1f, 1.0f);
    if (!tied) Add("lm_head.weight", {c.vocab_size, H}, rng, 0.2f);
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Add(p + "input_layernorm.weight", {H}, rng, 0.1f, 1.0f);
      Add(p + "post_attention_layernorm.weight", {H}, rng, 0.1f, 1.0f);
      Add(p + "self_attn.q_proj.weight", {qd, H}, rng, 0.25f);
      Add(p + "self_attn.k_proj.weight", {kvd, H}, rng, 0.25f);
      Add(p + "self_attn.v_proj.weight", {kvd, H}, rng, 0.25f);
      if (bias) {
        Add(p + "self_attn.q_proj.bias", {qd}, rng, 0.2f);
        Add(p + "self_attn.k_proj.bias", {kvd}, rng, 0.2f);
        Add(p + "self_attn.v_proj.bias", {kvd}, rng, 0.2f);
      }
      Add(p + "self_attn.o_proj.weight", {H, qd}, rng, 0.15f);
      Add(p + "mlp.gate_proj.weight", {c.intermediate_size, H}, rng, 0.2f);
      Add(p + "mlp.up_proj.weight", {c.intermediate_size, H}, rng, 0.2f);
      Add(p + "mlp.down_proj.weight", {H, c.intermediate_size}, rng, 0.15f);
    }
  }

  const std::vector<float>& W(const std::string& n) const { return w.at(n); }

  // In-memory LlamaWeights pointing at copies of the tensors (fp32). fuse: QKV and gate/up concatenated.
  LlamaWeights ToWeights(bool fuse) const {
    LlamaWeights out;
    out.config = c;
    auto mat = [&](const std::string& n) {
      const std::vector<float>& v = W(n);
      auto buf = std::make_unique<uint8_t[]>(v.size() * 4);
      std::memcpy(buf.get(), v.data(), v.size() * 4);
      LinearWeight lw{buf.get(), DType::kF32, shapes.at(n)[0], shapes.at(n)[1]};
      out.owned.push_back(std::move(buf));
      return lw;
    };
    out.embedding = mat("model.embed_tokens.weight");
    out.lm_head = c.tie_word_embeddings ? out.embedding : mat("lm_head.weight");
    out.final_norm = W("model.norm.weight");
    out.layers.resize(c.num_layers);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      LlamaLayerWeights& lw = out.layers[l];
      lw.attn_norm = W(p + "input_layernorm.weight");
      lw.ffn_norm = W(p + "post_attention_layernorm.weight");
      LinearWeight q = mat(p + "self_attn.q_proj.weight"), k = mat(p + "self_attn.k_proj.weight"),
                   v = mat(p + "self_attn.v_proj.weight"), g = mat(p + "mlp.gate_proj.weight"),
                   u = mat(p + "mlp.up_proj.weight");
      if (fuse) {
        lw.qkv = *ConcatRows({RowSource{q}, RowSource{k}, RowSource{v}}, &out);
        lw.gate_up = *ConcatRows({RowSource{g}, RowSource{u}}, &out);
      } else {
        lw.q = q, lw.k = k, lw.v = v, lw.gate = g, lw.up = u;
      }
      lw.o = mat(p + "self_attn.o_proj.weight");
      lw.down = mat(p + "mlp.down_proj.weight");
      if (c.attention_bias) {
        for (const char* b : {"q", "k", "v"}) {
          const auto& bv = W(p + "self_attn." + b + "_proj.bias");
          lw.qkv_bias.insert(lw.qkv_bias.end(), bv.begin(), bv.end());
        }
      }
    }
    return out;
  }

  // Logits [ids.size(), vocab] of a teacher-forced pass, in double precision.
  std::vector<float> Reference(const std::vector<int32_t>& ids) const {
    const int64_t T = ids.size(), H = c.hidden_size, hd = c.head_dim, F = c.intermediate_size;
    const int nh = c.num_heads, nkv = c.num_kv_heads, half = c.head_dim / 2;
    std::vector<double> x(T * H);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) x[t * H + i] = W("model.embed_tokens.weight")[ids[t] * H + i];
    auto rms = [&](const std::vector<double>& in, const std::vector<float>& g) {
      std::vector<double> o(in.size());
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < H; ++i) ss += in[t * H + i] * in[t * H + i];
        const double r = 1.0 / std::sqrt(ss / H + c.rms_norm_eps);
        for (int64_t i = 0; i < H; ++i) o[t * H + i] = in[t * H + i] * r * g[i];
      }
      return o;
    };
    auto linear = [&](const std::vector<double>& in, int64_t k, const std::string& name,
                      const std::string& bias) {
      const std::vector<float>& wv = W(name);
      const int64_t n = wv.size() / k;
      std::vector<double> o(T * n);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < n; ++j) {
          double s = bias.empty() ? 0.0 : W(bias)[j];
          for (int64_t i = 0; i < k; ++i) s += in[t * k + i] * wv[j * k + i];
          o[t * n + j] = s;
        }
      return o;
    };
    auto rope = [&](std::vector<double>& v, int heads) {
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < half; ++i) {
            const double freq = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / hd);
            const double a = t * freq;
            double* p = &v[(t * heads + h) * hd];
            const double x0 = p[i], x1 = p[i + half];
            p[i] = x0 * std::cos(a) - x1 * std::sin(a);
            p[i + half] = x1 * std::cos(a) + x0 * std::sin(a);
          }
    };
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const bool b = c.attention_bias;
      std::vector<double> h = rms(x, W(p + "input_layernorm.weight"));
      std::vector<double> q =
          linear(h, H, p + "self_attn.q_proj.weight", b ? p + "self_attn.q_proj.bias" : "");
      std::vector<double> k =
          linear(h, H, p + "self_attn.k_proj.weight", b ? p + "self_attn.k_proj.bias" : "");
      std::vector<double> v =
          linear(h, H, p + "self_attn.v_proj.weight", b ? p + "self_attn.v_proj.bias" : "");
      rope(q, nh);
      rope(k, nkv);
      std::vector<double> a(T * nh * hd, 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int hh = 0; hh < nh; ++hh) {
          const int kh = hh / (nh / nkv);
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (int64_t u = 0; u <= t; ++u) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += q[(t * nh + hh) * hd + i] * k[(u * nkv + kh) * hd + i];
            s[u] = d / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[u]);
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int64_t u = 0; u <= t; ++u)
            for (int i = 0; i < hd; ++i) a[(t * nh + hh) * hd + i] += s[u] / sum * v[(u * nkv + kh) * hd + i];
        }
      std::vector<double> o = linear(a, nh * hd, p + "self_attn.o_proj.weight", "");
      for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      h = rms(x, W(p + "post_attention_layernorm.weight"));
      std::vector<double> g = linear(h, H, p + "mlp.gate_proj.weight", "");
      std::vector<double> u = linear(h, H, p + "mlp.up_proj.weight", "");
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      std::vector<double> d = linear(g, F, p + "mlp.down_proj.weight", "");
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    std::vector<double> fin = rms(x, W("model.norm.weight"));
    std::vector<double> logits =
        linear(fin, H, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", "");
    return std::vector<float>(logits.begin(), logits.end());
  }

  // config.json + model.safetensors (F32) in `dir`.
  void WriteHfFolder(const std::filesystem::path& dir) const {
    std::filesystem::create_directories(dir);
    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", c.attention_bias ? "qwen2" : "llama"},
                          {"vocab_size", c.vocab_size},
                          {"hidden_size", c.hidden_size},
                          {"intermediate_size", c.intermediate_size},
                          {"num_hidden_layers", c.num_layers},
                          {"num_attention_heads", c.num_heads},
                          {"num_key_value_heads", c.num_kv_heads},
                          {"max_position_embeddings", c.max_position},
                          {"rms_norm_eps", c.rms_norm_eps},
                          {"rope_theta", c.rope_theta},
                          {"tie_word_embeddings", c.tie_word_embeddings},
                          {"hidden_act", "silu"},
                          {"bos_token_id", c.bos_token_id},
                          {"eos_token_id", c.eos_token_ids}};
    std::ofstream(dir / "config.json") << cfg.dump(2);
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, v] : w) {
      const size_t begin = data.size();
      data.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
      header[name] = {{"dtype", "F32"}, {"shape", shapes.at(name)}, {"data_offsets", {begin, data.size()}}};
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h.push_back(' ');
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h << data;
  }

  // A GGUF v3 file with llama.cpp's names and its Q/K row permutation. `quantize` (e.g. Q8_0) re-encodes
  // the 2-D tensors through `encode(values, n) -> bytes`; norms stay F32. ggml_type ids: F32 0, Q8_0 8.
  // `overrides`: 2-D tensors whose GGUF name ends with `suffix` use that type and encoder instead (a mixed
  // file, as llama-quantize's Q4_K_M writes attn_v / ffn_down / output in Q6_K).
  using Encoder = std::string (*)(const float* x, int64_t n);
  struct MatrixOverride {
    std::string suffix;
    uint32_t type;
    Encoder encode;
  };
  void WriteGguf(const std::filesystem::path& path, uint32_t matrix_type = 0, Encoder encode = nullptr,
                 const std::vector<MatrixOverride>& overrides = {}) const {
    std::string out;
    auto u32 = [&](uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); };
    auto u64 = [&](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
    auto f32 = [&](float v) { out.append(reinterpret_cast<const char*>(&v), 4); };
    auto str = [&](const std::string& s) {
      u64(s.size());
      out += s;
    };
    const std::string arch = c.attention_bias ? "qwen2" : "llama";
    struct Kv {
      std::string key;
      int type;  // 4 u32, 6 f32, 8 string
      uint32_t u;
      float f;
      std::string s;
    };
    std::vector<Kv> kvs = {
        {"general.architecture", 8, 0, 0, arch},
        {arch + ".context_length", 4, static_cast<uint32_t>(c.max_position), 0, ""},
        {arch + ".embedding_length", 4, static_cast<uint32_t>(c.hidden_size), 0, ""},
        {arch + ".block_count", 4, static_cast<uint32_t>(c.num_layers), 0, ""},
        {arch + ".feed_forward_length", 4, static_cast<uint32_t>(c.intermediate_size), 0, ""},
        {arch + ".attention.head_count", 4, static_cast<uint32_t>(c.num_heads), 0, ""},
        {arch + ".attention.head_count_kv", 4, static_cast<uint32_t>(c.num_kv_heads), 0, ""},
        {arch + ".rope.dimension_count", 4, static_cast<uint32_t>(c.head_dim), 0, ""},
        {arch + ".rope.freq_base", 6, 0, c.rope_theta, ""},
        {arch + ".attention.layer_norm_rms_epsilon", 6, 0, c.rms_norm_eps, ""},
        {"tokenizer.ggml.bos_token_id", 4, static_cast<uint32_t>(c.bos_token_id), 0, ""},
        {"tokenizer.ggml.eos_token_id", 4, static_cast<uint32_t>(c.eos_token_ids[0]), 0, ""}};
    // Tensors: GGUF name, values (permuted for llama Q/K), shape outermost-first.
    struct T {
      std::string name;
      std::vector<float> v;
      std::vector<int64_t> shape;
    };
    std::vector<T> ts;
    auto add = [&](const std::string& gguf, const std::string& hf, bool permute) {
      std::vector<float> v = W(hf);
      const std::vector<int64_t>& shape = shapes.at(hf);
      if (permute && arch == "llama") {
        // HF row j*half + i -> GGUF row 2i + j within each head (llama.cpp convert_hf_to_gguf permute()).
        const int64_t cols = shape.size() == 2 ? shape[1] : 1, hd = c.head_dim, half = hd / 2;
        std::vector<float> p(v.size());
        for (int64_t r = 0; r < shape[0]; ++r) {
          const int64_t head = r / hd, rr = r % hd, j = rr / half, i = rr % half;
          const int64_t dst = head * hd + 2 * i + j;
          std::memcpy(&p[dst * cols], &v[r * cols], cols * 4);
        }
        v = std::move(p);
      }
      ts.push_back({gguf, std::move(v), shape});
    };
    add("token_embd.weight", "model.embed_tokens.weight", false);
    add("output_norm.weight", "model.norm.weight", false);
    if (!c.tie_word_embeddings) add("output.weight", "lm_head.weight", false);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string g = "blk." + std::to_string(l) + ".", p = "model.layers." + std::to_string(l) + ".";
      add(g + "attn_norm.weight", p + "input_layernorm.weight", false);
      add(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", false);
      add(g + "attn_q.weight", p + "self_attn.q_proj.weight", true);
      add(g + "attn_k.weight", p + "self_attn.k_proj.weight", true);
      add(g + "attn_v.weight", p + "self_attn.v_proj.weight", false);
      if (c.attention_bias) {
        add(g + "attn_q.bias", p + "self_attn.q_proj.bias", true);
        add(g + "attn_k.bias", p + "self_attn.k_proj.bias", true);
        add(g + "attn_v.bias", p + "self_attn.v_proj.bias", false);
      }
      add(g + "attn_output.weight", p + "self_attn.o_proj.weight", false);
      add(g + "ffn_gate.weight", p + "mlp.gate_proj.weight", false);
      add(g + "ffn_up.weight", p + "mlp.up_proj.weight", false);
      add(g + "ffn_down.weight", p + "mlp.down_proj.weight", false);
    }
    out += "GGUF";
    u32(3);
    u64(ts.size());
    u64(kvs.size());
    for (const Kv& kv : kvs) {
      str(kv.key);
      u32(kv.type);
      if (kv.type == 4) u32(kv.u);
      if (kv.type == 6) f32(kv.f);
      if (kv.type == 8) str(kv.s);
    }
    std::string data;
    for (const T& t : ts) {
      uint32_t type = matrix_type;
      Encoder enc = encode;
      for (const MatrixOverride& o : overrides) {
        if (t.name.size() >= o.suffix.size() &&
            t.name.compare(t.name.size() - o.suffix.size(), o.suffix.size(), o.suffix) == 0) {
          type = o.type;
          enc = o.encode;
        }
      }
      const bool quant = t.shape.size() == 2 && enc != nullptr;
      std::string bytes = quant ? enc(t.v.data(), t.v.size())
                                : std::string(reinterpret_cast<const char*>(t.v.data()), t.v.size() * 4);
      while (data.size() % 32 != 0) data.push_back('\0');
      str(t.name);
      u32(t.shape.size());
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) u64(*it);  // ne[0] innermost
      u32(quant ? type : 0);
      u64(data.size());
      data += bytes;
    }
    while (out.size() % 32 != 0) out.push_back('\0');
    out += data;
    std::ofstream(path, std::ios::binary) << out;
  }
};

// Relative L2 error ||a - b|| / ||b||; NaN never passes.
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i])) return 1e9;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Token ids for a teacher-forced pass through TinyLlama (vocab 96).
inline const std::vector<int32_t> kTinyIds = {1, 17, 42, 5, 88, 3, 64, 9, 33, 71, 2, 50, 11, 95, 0, 27, 60, 8, 14};

// Logits [ids.size(), vocab] of one teacher-forced step of `model` over `ids` (KV cache: 32 blocks of 16).
inline std::vector<float> ScoreAll(DecoderModel& model, const std::vector<int32_t>& ids) {
  EXPECT_TRUE(model.AllocateKvCache(32, 16).ok());
  StepInput in;
  in.token_ids = ids;
  in.sequences = {
      StepSequence{0, static_cast<int32_t>(ids.size()), 0, {0, 1, 2, 3}, StepSequence::Logits::kAll}};
  StepOutput out;
  Status st = model.Step(in, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out.logits;
}

}  // namespace stoke::testing
