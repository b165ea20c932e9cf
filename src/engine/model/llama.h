// CpuLlama: the Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) on the CPU backend. One Step runs
// every token of a flat batch through each matmul at once (m = total tokens), whatever mix of prefill chunks
// and decodes it holds; attention then runs per sequence over that sequence's paged KV.
//
// Per layer (T tokens, H hidden, q = heads·hd, kv = kv_heads·hd, F ffn):
//   h = RmsNorm(x)                        [T, H]
//   qkv = h · Wqkv^T (+ bias)            [T, q + 2 kv] -> q [T, heads, hd], k/v [T, kv_heads, hd]
//   RoPE(q, k) at each token's position; K/V written to their slots
//   a = PagedAttention(q) per sequence    [T, q]
//   x += a · Wo^T
//   h = RmsNorm(x); x += (silu(h·Wg^T) ⊙ h·Wu^T) · Wd^T
// then RmsNorm and the LM head only for the rows whose logits were asked for.
#pragma once

#include <memory>
#include <vector>

#include "base/thread_pool.h"
#include "base/zeroed_buffer.h"
#include "engine/model/decoder.h"
#include "engine/model/llama_weights.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kv_quant.h"

namespace stoke {

class CpuLlama final : public DecoderModel {
 public:
  // `pool` null = ThreadPool::Default(). Fails when the weights do not match their config.
  // ggml_numerics: compute in ggml's order and precision (kernels/cpu/ggml_numerics.h: fp16-rounded KV,
  // ggml's activation quantisation, accumulation orders, expf, RoPE angles), so a GGUF model's logits equal
  // llama.cpp's CPU backend's; matmuls of weight types without a ggml-exact kernel (only Q4_1 and Q8_0 have
  // one) and RoPE scaling other than linear / GGUF frequency factors keep stoke's own numerics.
  // kv: how the KV cache is stored. kAuto = fp32; bf16 / int8 / fp8 go through kernels/cpu/kv_quant.h (the
  // attention then runs stoke's own numerics, not ggml's, whatever ggml_numerics says).
  static StatusOr<std::unique_ptr<CpuLlama>> Create(LlamaWeights weights, ThreadPool* pool = nullptr,
                                                    bool ggml_numerics = false, KvCacheOptions kv = {});
  bool ggml_numerics() const { return ggml_; }

  const LlamaConfig& config() const override { return weights_.config; }
  Status AllocateKvCache(int num_blocks, int block_size) override;
  KvCacheShape kv_shape() const override;
  std::string kv_cache_dtype_name() const override;
  // "fp8" when the weights came through QuantizeLlamaWeightsFp8 (engine/model/weight_quant.h), else "none".
  std::string quantization_name() const override {
    return std::string(WeightQuantizationName(weights_.quantization));
  }
  int64_t KvBytesPerToken() const override;
  Status CopyKvBlock(int32_t src, int32_t dst) override;
  Status Step(const StepInput& input, StepOutput* output) override;

 private:
  CpuLlama(LlamaWeights weights, ThreadPool* pool, bool ggml_numerics, KvCacheOptions kv);
  bool quantized_kv() const { return kv_opts_.dtype != KvCacheDtype::kAuto; }
  Status ValidateInput(const StepInput& input) const;
  Status Linear(const float* x, int64_t m, const LinearWeight& w, float* y);
  void Norm(const float* x, const std::vector<float>& w, int64_t rows, float* out);
  void Rope(float* x, int64_t tokens, int heads);
  Status RunLayer(int layer, const StepInput& input, int64_t tokens);
  Status FinishLayer(const LlamaLayerWeights& w, int64_t tokens);
  cpu::PagedKvLayer KvLayer(int layer);
  cpu::QuantPagedKvLayer QuantKvLayer(int layer);

  LlamaWeights weights_;
  ThreadPool* pool_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  bool ggml_ = false;            // ggml-compatible numerics
  bool ggml_rope_ = false;       // ... including RoPE (RopeParams can express the model's scaling)

  // KV cache: per layer, k and v = [num_blocks, block_size, kv_heads, head_dim] fp32, back to back.
  ZeroedBuffer<float> kv_;  // pages committed as the cache fills (base/zeroed_buffer.h)
  // With kv_opts_.dtype bf16 / int8 / fp8 instead: per layer k then v, each [num_blocks, block_size,
  // kv_heads, head_dim] of 2 or 1 bytes (kvq_), and per layer k then v scales [num_blocks, block_size,
  // kv_heads] fp32 (kv_scales_, 8-bit only).
  KvCacheOptions kv_opts_;
  ZeroedBuffer<uint8_t> kvq_;
  ZeroedBuffer<float> kv_scales_;
  int num_blocks_ = 0;
  int block_size_ = 0;

  // Per-step scratch, reused across steps (Step is called from one thread at a time).
  std::vector<float> x_, h_, qkv_, q_, k_, v_, attn_, proj_, ffn_, ffn2_, sel_;
  std::vector<int32_t> positions_, slots_, rows_;
};

}  // namespace stoke
