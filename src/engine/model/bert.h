// BERT-family encoders (all-MiniLM-L6-v2, BGE, E5, BERT-base/large) on the CPU, for sentence embeddings:
// token ids -> post-LN encoder -> mean pooling over real tokens -> L2 normalisation (the
// sentence-transformers pipeline Transformer -> Pooling(mean) -> Normalize).
//
// A batch never pads: every sequence's tokens are concatenated into one [total_tokens, hidden] activation so
// each Linear runs once over all rows, and attention runs per sequence over its own length. A sequence's
// embedding is therefore independent of what it is batched with.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
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

// The four distinct GEMM inputs of a BERT layer (query, key and value share the first): the tensors
// --quantization int8 quantises with one static scale each (engine/model/bert_int8.h).
enum class BertGemmInput : uint8_t {
  kQkv = 0,       // the layer's input x, [tokens, hidden]: query, key, value
  kAttnOut = 1,   // the attention context, [tokens, hidden]: attention output
  kIntermediate,  // x after the attention's residual + LayerNorm, [tokens, hidden]: intermediate
  kOutput,        // GELU(intermediate), [tokens, intermediate]: output
};
inline constexpr int kBertGemmInputs = 4;
std::string_view BertGemmInputName(BertGemmInput input);

// --quantization int8: how each GEMM input is scaled to int8 (flag --int8-activations; docs/precision.md).
//   kPerToken (default): every row (token) of the input gets its own scale, amax of the row / 127, computed
//                        at run time (nothing clips); calibration still measures the SmoothQuant factors.
//   kStatic:             one scale per input from calibration (its percentile of |x|; larger values clip).
// On all-MiniLM-L6-v2 only per-token passes the consistency gate (docs/precision.md).
enum class Int8Activations : uint8_t { kPerToken = 0, kStatic = 1 };
std::string_view Int8ActivationsName(Int8Activations a);  // "per-token", "static"
// "per-token" | "static"; InvalidArgument naming --int8-activations otherwise.
StatusOr<Int8Activations> ParseInt8Activations(std::string_view s);

// Sees each GEMM input of a forward pass before it is multiplied (calibration): `x` is [rows, cols] fp32,
// rows = every token of the batch. Called on Embed's calling thread, in layer order.
using BertActivationObserver =
    std::function<void(int layer, BertGemmInput input, const float* x, int64_t rows, int64_t cols)>;

// --quantization int8: the value each GEMM input is clipped to, [layer][BertGemmInput] (>= 0), measured by
// CalibrateBertActivations (bert_int8.h); the static activation scale is clip / 127. With smoothing
// (SmoothQuant), smooth[layer][input] holds one factor s_j > 0 per input channel: the GEMM multiplies
// x_j / s_j by W[:, j] · s_j (the same product), and `layers` is the range of x / s. With per-token
// activations `layers` is unused (all 0: each row's scale is its own amax of x / s at run time).
struct BertActivationRanges {
  Int8Activations activations = Int8Activations::kPerToken;
  std::vector<std::array<float, kBertGemmInputs>> layers;
  std::vector<std::array<std::vector<float>, kBertGemmInputs>> smooth;  // empty: no smoothing
  double smoothing_alpha = 0.0;
  double percentile = 100.0;  // of |x| over every element the calibration samples produced
  int64_t samples = 0;        // calibration sequences
  int64_t tokens = 0;         // their tokens (after truncation to max_seq_length)
};

struct Int8WeightOptions {
  ThreadPool* pool = nullptr;  // null = ThreadPool::Default()
  // Tests only (no flag reaches it): every activation scale multiplied by this. 0.1 is a deliberately broken
  // calibration (inputs saturate at a tenth of their range), which the consistency gate must reject.
  float testing_activation_scale_multiplier = 1.0f;
};

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
  // The same, showing each GEMM input to `observer` (calibration).
  Status Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out, ThreadPool& pool,
               const BertActivationObserver& observer) const;

  // --quantization fp8 on the CPU (docs/precision.md): the Linear weights of every layer (query, key, value,
  // attention output, intermediate, output) replaced by their fp8 E4M3 round trip, one scale per output
  // channel (RoundTripFp8Rows, engine/model/weight_quant.h: cpu::QuantizeKvRow's fp8 rounding), held
  // dequantised as F32 in buffers the encoder owns, so Embed multiplies exactly the values fp8 weights stand
  // for. Embeddings, LayerNorms and biases are unchanged. Call before the encoder is shared (it rewrites
  // layers(); not safe beside Embed). Only options.pool and options.testing_scale_multiplier apply.
  // The CUDA backend takes an unquantised encoder and BertDeviceOptions::quantization instead.
  // FailedPrecondition when the weights are quantised already.
  Status QuantizeWeightsFp8(const Fp8WeightOptions& options = {});
  // --quantization int8 on the CPU (docs/precision.md; kernels/cpu/int8_gemm.h): every layer's six Linear
  // weights quantised to int8 with one scale per output row, and each GEMM input quantised at run time with
  // the static scale ranges.layers[layer][input] / 127 (clipping beyond it); the GEMMs run int8 x int8 ->
  // int32 and are scaled back to fp32 (+ bias). Embeddings, LayerNorms, biases, attention and GELU stay fp32.
  // Call before the encoder is shared. FailedPrecondition when already quantised; InvalidArgument when
  // `ranges` does not have one entry per layer or holds a negative or non-finite value.
  Status QuantizeWeightsInt8(const BertActivationRanges& ranges, const Int8WeightOptions& options = {});
  // kNone, kFp8 after QuantizeWeightsFp8, kInt8 after QuantizeWeightsInt8.
  WeightQuantization quantization() const { return quantization_; }

  // A Linear layer's weight [out, in] (mapped, any MatMul dtype) and its bias [out] (fp32, owned).
  struct Linear {
    const void* w = nullptr;
    DType dtype = DType::kF32;
    int64_t out = 0;
    int64_t in = 0;
    std::vector<float> bias;
    // --quantization int8 (QuantizeWeightsInt8): the weight [out, in] as int8 with w_scale [out], and the
    // static scale of the input (x_scale; every q = clamp(rint(x / x_scale), -127, 127)). Empty otherwise.
    std::vector<int8_t> w_int8;
    std::vector<float> w_scale;
    float x_scale = 0.f;
    // With smoothing: the weight's columns were multiplied by s_j before quantisation, and the input is
    // quantised per channel as q_j = clamp(rint(x_j · x_inv[j]), -127, 127), x_inv[j] = 1 / (x_scale · s_j).
    std::vector<float> x_inv;
    // Per-token activations (Int8Activations::kPerToken): x_scale is unused (0); each row i of the input is
    // quantised with its own scale and centre (cpu::QuantizeInt8PerToken over x_j · x_inv[j], the scale
    // times x_scale_mul), here x_inv[j] = 1 / s_j (empty without smoothing), and w_sum[r] = w_scale[r] ·
    // Σ_j w_int8[r, j] (the centre's term). x_scale_mul is 1 but in tests.
    bool x_per_token = false;
    bool x_centred = false;  // per-token: each row quantised around the centre of its range (the GELU output)
    float x_scale_mul = 1.0f;
    std::vector<float> w_sum;
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
  // The layers QuantizeWeightsInt8 would make, as copies, leaving this encoder as it is: how the CUDA backend
  // gets the CPU reference's int8 weights, scales and smoothing (bit for bit) for an unquantised encoder.
  // The same errors as QuantizeWeightsInt8.
  StatusOr<std::vector<Layer>> QuantizedInt8Layers(const BertActivationRanges& ranges,
                                                   const Int8WeightOptions& options = {}) const;

 private:
  BertEncoder() = default;
  Status LoadWeights();
  // t's data, or an aligned owned copy when the file left it misaligned for its element type.
  const void* Aligned(const TensorRef& t);
  Status Forward(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                 ThreadPool& pool, const BertActivationObserver* observer) const;

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
