// BERT-family encoders (all-MiniLM-L6-v2, BGE, E5, BERT-base/large) on the CPU, for sentence embeddings:
// token ids -> post-LN encoder -> mean pooling over real tokens -> L2 normalisation (the
// sentence-transformers pipeline Transformer -> Pooling(mean) -> Normalize).
//
// A batch never pads: every sequence's tokens are concatenated into one [total_tokens, hidden] activation so
// each Linear runs once over all rows, and attention runs per sequence over its own length. A sequence's
// embedding is therefore independent of what it is batched with.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "api/weight_quantization.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/tensor.h"
#include "engine/model/weight_quant.h"

namespace stoke {

class HfFolder;

// config.json of a BERT checkpoint (model-formats.md §5); missing keys take BERT-base defaults.
struct BertConfig {
  int vocab_size = 30522;
  int hidden_size = 768;
  int num_hidden_layers = 12;
  int num_attention_heads = 12;
  int intermediate_size = 3072;
  int max_position_embeddings = 512;
  int type_vocab_size = 2;
  int pad_token_id = 0;
  float layer_norm_eps = 1e-12f;
  std::string hidden_act = "gelu";  // only exact erf GELU is supported

  int head_dim() const { return hidden_size / num_attention_heads; }
  // Validates ranges and divisibility; errors name `source` (the config file) and the key.
  static StatusOr<BertConfig> FromJson(const nlohmann::json& j, const std::string& source);
};

class BertEncoder {
 public:
  // An HF folder holding config.json + model.safetensors (names with or without "bert.", LayerNorm
  // gamma/beta or weight/bias). Weights stay memory-mapped; Linear weights may be F32, F16 or BF16.
  static StatusOr<std::unique_ptr<BertEncoder>> Load(const std::string& hf_dir);
  ~BertEncoder();

  const BertConfig& config() const { return config_; }
  // sentence_bert_config.json's max_seq_length (256 for MiniLM) when present, else max_position_embeddings.
  // Counts [CLS] and [SEP]. Tokenize with EncodeOptions::max_length = max_seq_length().
  int max_seq_length() const { return max_seq_length_; }
  void set_max_seq_length(int n);  // clamped to [2, max_position_embeddings]
  int hidden_size() const { return config_.hidden_size; }

  // Pooled (mean over real tokens) and L2-normalised embeddings: out = [batch_ids.size(), hidden] row-major.
  // Each sequence is token ids including [CLS]/[SEP]; one longer than max_seq_length() is truncated to its
  // first max_seq_length() - 1 ids plus its last id (the [SEP]), as the tokenizer would. Token type 0.
  // Errors: InvalidArgument for an empty sequence or an id outside [0, vocab_size).
  // Thread-safe (scratch is per call); runs on ThreadPool::Default() unless a pool is given.
  Status Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out) const;
  Status Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
               ThreadPool& pool) const;

  // --quantization fp8 on the CPU (docs/precision.md): the Linear weights of every layer (query, key, value,
  // attention output, intermediate, output) replaced by their fp8 E4M3 round trip, one scale per output
  // channel (RoundTripFp8Rows, engine/model/weight_quant.h: cpu::QuantizeKvRow's fp8 rounding), held
  // dequantised as F32 in buffers the encoder owns, so Embed multiplies exactly the values fp8 weights stand
  // for. Embeddings, LayerNorms and biases are unchanged. Call before the encoder is shared (it rewrites
  // layers(); not safe beside Embed). Only options.pool and options.testing_scale_multiplier apply.
  // The CUDA backend takes an unquantised encoder and BertDeviceOptions::quantization instead.
  // FailedPrecondition when the weights are quantised already.
  Status QuantizeWeightsFp8(const Fp8WeightOptions& options = {});
  // kNone, or kFp8 after QuantizeWeightsFp8.
  WeightQuantization quantization() const { return quantization_; }

  // A Linear layer's weight [out, in] (mapped, any MatMul dtype) and its bias [out] (fp32, owned).
  struct Linear {
    const void* w = nullptr;
    DType dtype = DType::kF32;
    int64_t out = 0;
    int64_t in = 0;
    std::vector<float> bias;
  };
  struct Norm {
    std::vector<float> gamma, beta;  // [hidden] fp32
  };
  struct Layer {
    Linear query, key, value, attn_out, intermediate, output;
    Norm attn_norm, out_norm;
  };

  // The weights, for device backends that upload them (engine/cuda/cuda_bert.h). Tables are mapped
  // [rows, hidden] in word_dtype() / position_dtype() (F32, F16 or BF16).
  const void* word_embeddings() const { return word_emb_; }
  DType word_dtype() const { return word_dtype_; }
  const void* position_embeddings() const { return pos_emb_; }
  DType position_dtype() const { return pos_dtype_; }
  const std::vector<float>& token_type0_embedding() const { return type0_emb_; }
  const Norm& embedding_norm() const { return emb_norm_; }
  const std::vector<Layer>& layers() const { return layers_; }

 private:
  BertEncoder() = default;
  Status LoadWeights();
  // t's data, or an aligned owned copy when the file left it misaligned for its element type.
  const void* Aligned(const TensorRef& t);

  std::unique_ptr<HfFolder> folder_;  // owns the mapped weights
  BertConfig config_;
  int max_seq_length_ = 0;
  // Embedding tables (mapped): word [vocab, hidden], position [max_pos, hidden], token type [types, hidden].
  const void* word_emb_ = nullptr;
  DType word_dtype_ = DType::kF32;
  const void* pos_emb_ = nullptr;
  DType pos_dtype_ = DType::kF32;
  std::vector<float> type0_emb_;  // token type 0 row, [hidden] fp32
  Norm emb_norm_;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // aligned copies made by Aligned(), fp8 round trips
  WeightQuantization quantization_ = WeightQuantization::kNone;
};

}  // namespace stoke
