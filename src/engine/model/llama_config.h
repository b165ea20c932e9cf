// Hyper-parameters of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2), read from GGUF metadata
// or an HF config.json. See docs and ../shared/reference/model-formats.md §3, §5 for where each comes from.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace stoke {

class GgufFile;

struct RopeScaling {
  enum class Type : uint8_t { kNone, kLlama3, kLinear } type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

struct LlamaConfig {
  std::string architecture = "llama";  // "llama", "qwen2", "mistral"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position = 0;  // context length
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  // GGUF `rope_freqs.weight` (llama.cpp's converter bakes llama3 scaling into it): [head_dim / 2]
  // divisors of the inverse frequencies. Empty when absent; takes precedence over rope_scaling.
  std::vector<float> rope_freq_divisors;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2)
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // Shape checks shared by every loader: positive sizes, heads % kv_heads == 0, even head_dim.
  Status Validate() const;
};

// From GGUF metadata ({arch}.* keys, tokenizer.ggml.{bos,eos,eot}_token_id). vocab_size comes from
// {arch}.vocab_size, else the token list, else token_embd's rows; tie_word_embeddings = no output.weight.
StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& gguf);

// From an HF config.json (LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM). Accepts both the
// classic `rope_theta` + `rope_scaling` keys and transformers v5's `rope_parameters`; eos may be an int or
// a list. Missing keys take LlamaConfig's HF defaults (model-formats.md §5).
StatusOr<LlamaConfig> LlamaConfigFromHfConfig(const nlohmann::json& config);

// Inverse RoPE frequencies [head_dim / 2]: theta^(-2i/head_dim), then llama3 / linear scaling or the GGUF
// divisors.
std::vector<float> RopeInverseFrequencies(const LlamaConfig& config);

}  // namespace stoke
