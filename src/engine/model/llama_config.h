// Hyper-parameters of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2), read from GGUF metadata
// or an HF config.json. See docs and ../shared/reference/model-formats.md §3, §5 for where each comes from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stoke {

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
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2)
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
};

}  // namespace stoke
