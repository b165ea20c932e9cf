#include "engine/model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/loader/gguf_reader.h"

namespace stoke {

Status LlamaConfig::Validate() const {
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || num_layers <= 0 || num_heads <= 0 ||
      num_kv_heads <= 0 || head_dim <= 0) {
    return InvalidArgumentError(
        "llama config: sizes must be positive (vocab {}, hidden {}, ffn {}, layers {}, heads {}, kv heads "
        "{}, "
        "head_dim {})",
        vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim);
  }
  if (num_heads % num_kv_heads != 0) {
    return InvalidArgumentError("llama config: {} heads not a multiple of {} kv heads", num_heads,
                                num_kv_heads);
  }
  if (head_dim % 2 != 0) return InvalidArgumentError("llama config: head_dim {} is odd", head_dim);
  if (!rope_freq_divisors.empty() && static_cast<int>(rope_freq_divisors.size()) != head_dim / 2) {
    return InvalidArgumentError("llama config: rope_freqs has {} values, expected head_dim/2 = {}",
                                rope_freq_divisors.size(), head_dim / 2);
  }
  if (!(rope_theta > 0)) return InvalidArgumentError("llama config: rope_theta {} must be > 0", rope_theta);
  return OkStatus();
}

namespace {

// Optional GGUF integer: `fallback` when absent, error when present with the wrong type.
StatusOr<int64_t> IntOr(const GgufFile& f, const std::string& key, int64_t fallback) {
  if (!f.Has(key)) return fallback;
  return f.GetInt(key);
}
StatusOr<double> FloatOr(const GgufFile& f, const std::string& key, double fallback) {
  if (!f.Has(key)) return fallback;
  return f.GetFloat(key);
}
StatusOr<int64_t> RequiredInt(const GgufFile& f, const std::string& key) {
  if (!f.Has(key)) return NotFoundError("{}: required key {} missing", f.path(), key);
  return f.GetInt(key);
}

}  // namespace

StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& f) {
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  const std::string& a = c.architecture;
  if (a != "llama" && a != "mistral" && a != "qwen2") {
    return UnimplementedError("{}: architecture '{}' is not a Llama-family decoder (llama, mistral, qwen2)",
                              f.path(), a);
  }
  ASSIGN_OR_RETURN(int64_t ctx, RequiredInt(f, a + ".context_length"));
  ASSIGN_OR_RETURN(int64_t hidden, RequiredInt(f, a + ".embedding_length"));
  ASSIGN_OR_RETURN(int64_t layers, RequiredInt(f, a + ".block_count"));
  ASSIGN_OR_RETURN(int64_t ffn, RequiredInt(f, a + ".feed_forward_length"));
  ASSIGN_OR_RETURN(int64_t heads, RequiredInt(f, a + ".attention.head_count"));
  ASSIGN_OR_RETURN(int64_t kv_heads, IntOr(f, a + ".attention.head_count_kv", heads));
  ASSIGN_OR_RETURN(double eps, FloatOr(f, a + ".attention.layer_norm_rms_epsilon", 1e-5));
  ASSIGN_OR_RETURN(double theta, FloatOr(f, a + ".rope.freq_base", 10000.0));
  c.max_position = static_cast<int>(ctx);
  c.hidden_size = static_cast<int>(hidden);
  c.num_layers = static_cast<int>(layers);
  c.intermediate_size = static_cast<int>(ffn);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv_heads);
  c.rms_norm_eps = static_cast<float>(eps);
  c.rope_theta = static_cast<float>(theta);
  if (heads <= 0) return InvalidArgumentError("{}: {}.attention.head_count is {}", f.path(), a, heads);
  ASSIGN_OR_RETURN(int64_t head_dim, IntOr(f, a + ".attention.key_length", hidden / heads));
  ASSIGN_OR_RETURN(int64_t v_dim, IntOr(f, a + ".attention.value_length", head_dim));
  ASSIGN_OR_RETURN(int64_t rope_dim, IntOr(f, a + ".rope.dimension_count", head_dim));
  if (v_dim != head_dim) {
    return UnimplementedError("{}: key_length {} != value_length {}", f.path(), head_dim, v_dim);
  }
  if (rope_dim != head_dim) {
    return UnimplementedError("{}: partial RoPE (rope.dimension_count {} < head_dim {}) is not supported",
                              f.path(), rope_dim, head_dim);
  }
  c.head_dim = static_cast<int>(head_dim);

  // Vocab: the explicit key, else the token list, else the embedding table's rows.
  if (f.Has(a + ".vocab_size")) {
    ASSIGN_OR_RETURN(int64_t v, f.GetInt(a + ".vocab_size"));
    c.vocab_size = static_cast<int>(v);
  } else if (const TensorRef* emb = f.FindTensor("token_embd.weight");
             emb != nullptr && emb->shape.size() == 2) {
    c.vocab_size = static_cast<int>(emb->shape[0]);
  }

  if (f.Has(a + ".rope.scaling.type")) {
    ASSIGN_OR_RETURN(std::string type, f.GetString(a + ".rope.scaling.type"));
    ASSIGN_OR_RETURN(double factor, FloatOr(f, a + ".rope.scaling.factor", 1.0));
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = static_cast<float>(factor);
    } else if (type != "none") {
      return UnimplementedError("{}: rope scaling type '{}' is not supported", f.path(), type);
    }
  }
  if (const TensorRef* freqs = f.FindTensor("rope_freqs.weight"); freqs != nullptr) {
    if (freqs->dtype != DType::kF32) {
      return InvalidArgumentError("{}: rope_freqs.weight is {}, expected F32", f.path(),
                                  DTypeName(freqs->dtype));
    }
    c.rope_freq_divisors.resize(freqs->numel());
    std::memcpy(c.rope_freq_divisors.data(), freqs->data, freqs->numel() * sizeof(float));
  }

  c.tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c.attention_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  if (f.Has("tokenizer.ggml.bos_token_id")) {
    ASSIGN_OR_RETURN(int64_t bos, f.GetInt("tokenizer.ggml.bos_token_id"));
    c.bos_token_id = static_cast<int32_t>(bos);
  }
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!f.Has(key)) continue;
    ASSIGN_OR_RETURN(int64_t id, f.GetInt(key));
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  Status st = c.Validate();
  if (!st.ok()) return st.WithContext(f.path());
  return c;
}

namespace {

using nlohmann::json;

// Reads config[key] as T when present and not null; errors name the key on a type mismatch.
template <typename T>
Status ReadKey(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return InvalidArgumentError("config.json: '{}' must be a boolean", key);
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return InvalidArgumentError("config.json: '{}' must be an integer", key);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return InvalidArgumentError("config.json: '{}' must be a number", key);
  } else {
    if (!it->is_string()) return InvalidArgumentError("config.json: '{}' must be a string", key);
  }
  *out = it->get<T>();
  return OkStatus();
}

Status ReadRopeScaling(const json& s, RopeScaling* out) {
  if (!s.is_object()) return InvalidArgumentError("config.json: rope scaling must be an object");
  std::string type = "default";
  if (s.contains("rope_type") && s["rope_type"].is_string()) {
    type = s["rope_type"].get<std::string>();
  } else if (s.contains("type") && s["type"].is_string()) {
    type = s["type"].get<std::string>();
  }
  if (type == "default" || type == "none") return OkStatus();
  RETURN_IF_ERROR(ReadKey(s, "factor", &out->factor));
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
    RETURN_IF_ERROR(ReadKey(s, "low_freq_factor", &out->low_freq_factor));
    RETURN_IF_ERROR(ReadKey(s, "high_freq_factor", &out->high_freq_factor));
    RETURN_IF_ERROR(ReadKey(s, "original_max_position_embeddings", &out->original_max_position));
  } else {
    return UnimplementedError("config.json: rope scaling type '{}' is not supported (linear, llama3)", type);
  }
  if (!(out->factor > 0)) return InvalidArgumentError("config.json: rope scaling factor must be > 0");
  return OkStatus();
}

Status ReadTokenIds(const json& j, const char* key, std::vector<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return OkStatus();
  if (it->is_number_integer()) {
    out->push_back(it->get<int32_t>());
    return OkStatus();
  }
  if (it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number_integer()) return InvalidArgumentError("config.json: '{}' must hold integers", key);
      out->push_back(v.get<int32_t>());
    }
    return OkStatus();
  }
  return InvalidArgumentError("config.json: '{}' must be an integer or a list of integers", key);
}

}  // namespace

StatusOr<LlamaConfig> LlamaConfigFromHfConfig(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("config.json: not a JSON object");
  LlamaConfig c;
  std::string model_type = "llama";
  RETURN_IF_ERROR(ReadKey(j, "model_type", &model_type));
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2") {
    return UnimplementedError(
        "config.json: model_type '{}' is not a Llama-family decoder (llama, mistral, qwen2)", model_type);
  }
  c.architecture = model_type;
  // transformers' LlamaConfig defaults.
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_layers = 32;
  c.num_heads = 32;
  c.max_position = 2048;
  c.rms_norm_eps = 1e-6f;
  RETURN_IF_ERROR(ReadKey(j, "vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(ReadKey(j, "hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(ReadKey(j, "intermediate_size", &c.intermediate_size));
  RETURN_IF_ERROR(ReadKey(j, "num_hidden_layers", &c.num_layers));
  RETURN_IF_ERROR(ReadKey(j, "num_attention_heads", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(ReadKey(j, "num_key_value_heads", &c.num_kv_heads));
  if (c.num_heads <= 0) return InvalidArgumentError("config.json: num_attention_heads must be > 0");
  c.head_dim = c.hidden_size / c.num_heads;
  RETURN_IF_ERROR(ReadKey(j, "head_dim", &c.head_dim));
  RETURN_IF_ERROR(ReadKey(j, "max_position_embeddings", &c.max_position));
  RETURN_IF_ERROR(ReadKey(j, "rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(ReadKey(j, "tie_word_embeddings", &c.tie_word_embeddings));
  c.attention_bias = model_type == "qwen2";  // Qwen2 always has q/k/v bias and no config key for it
  RETURN_IF_ERROR(ReadKey(j, "attention_bias", &c.attention_bias));
  bool mlp_bias = false;
  RETURN_IF_ERROR(ReadKey(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) return UnimplementedError("config.json: mlp_bias = true is not supported");
  std::string act = "silu";
  RETURN_IF_ERROR(ReadKey(j, "hidden_act", &act));
  if (act != "silu") return UnimplementedError("config.json: hidden_act '{}' is not supported (silu)", act);

  // RoPE: classic top-level keys, or transformers v5's rope_parameters (theta and scaling together).
  RETURN_IF_ERROR(ReadKey(j, "rope_theta", &c.rope_theta));
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(ReadRopeScaling(*it, &c.rope_scaling));
  }
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidArgumentError("config.json: rope_parameters must be an object");
    RETURN_IF_ERROR(ReadKey(*it, "rope_theta", &c.rope_theta));
    RETURN_IF_ERROR(ReadRopeScaling(*it, &c.rope_scaling));
  }

  int32_t bos = -1;
  RETURN_IF_ERROR(ReadKey(j, "bos_token_id", &bos));
  c.bos_token_id = bos;
  RETURN_IF_ERROR(ReadTokenIds(j, "eos_token_id", &c.eos_token_ids));
  RETURN_IF_ERROR(c.Validate());
  return c;
}

std::vector<float> RopeInverseFrequencies(const LlamaConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // Computed in double then rounded, as torch computes 1 / theta^(arange(0, d, 2) / d) in fp32 from an
    // exact exponent; the difference is below fp32 resolution.
    inv[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(c.rope_theta), (2.0 * i) / c.head_dim));
  }
  if (!c.rope_freq_divisors.empty()) {
    for (int i = 0; i < half; ++i) inv[i] /= c.rope_freq_divisors[i];
    return inv;
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    const double kPi = 3.14159265358979323846;
    const double old_len = s.original_max_position;
    const double low_wavelen = old_len / s.low_freq_factor;
    const double high_wavelen = old_len / s.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * kPi / f;
      if (wavelen < high_wavelen) continue;  // high frequency: unchanged
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
      } else {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
      }
    }
  }
  return inv;
}

}  // namespace stoke
