// CudaLlama: the Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) on one CUDA GPU, behind the same
// DecoderModel interface as CpuLlama, so the scheduler, KV block allocator and server drive it unchanged.
//
// Numerics: weights bf16 on the device (or fp8 E4M3 with a scale per output channel: Options::quantization) (F32/F16/BF16 converted on the host; GGUF Q4_1/Q8_0 uploaded as raw
// blocks and dequantised on the device, the raw blocks kept for the fused dequant GEMV of 1-token steps;
// other GGML quants dequantised on the host), norm weights fp32, the residual stream fp32, activations bf16,
// GEMMs through cuBLASLt with fp32 accumulation, attention softmax in fp32, logits fp32. KV cache bf16.
//
// One step (T tokens of S sequences):
//   stage ids, positions, slots, block tables, cu_seqlens, start_pos, context lens in pinned memory; one H2D
//   x = Embedding(ids) (fp32)
//   per layer: h = AddRmsNorm(delta, x); qkv = h·Wqkv^T; QkvRopeWriteKv (+bias; q rotated, K/V into their
//   slots);
//              attention (PagedDecodeAttention when every sequence has 1 token, else PrefillAttention);
//              proj = attn·Wo^T; h = AddRmsNorm(proj, x); act = silu(h·Wg^T) ⊙ h·Wu^T; delta = act·Wd^T
//   logits rows (kNone/kLast/kAll, as CpuLlama; kToken): GatherAddRmsNorm(final norm) -> lm_head GEMM (fp32
//   out) in chunks of kLogitsRows rows; kToken rows are sampled there (cuda::SampleRows) and only their ids
//   come back, the other rows are copied D2H into pinned memory and then into StepOutput.
//   One-token steps use the bf16 GEMV (kernels/cuda/gemv.h, gate|up fused with SwiGLU) instead of cuBLASLt
//   (Options::gemv_max_rows, Options::pdl).
//
// Decode steps of up to 256 sequences run padded to a bucket (1, 2, 4, ..., 256 rows; padding rows have slot
// -1 and context 0) with a fixed block-table width per context class, and are captured as CUDA graphs
// (the first step of a shape runs eagerly, which also tunes its GEMMs, then the shape is captured and later
// steps replay it). Eager and graph runs of a bucket enqueue the very same kernels, so they give identical
// logits; Options::cuda_graphs = false routes around graphs entirely.
//
// Device memory: weights, one scratch arena sized for `max_step_tokens` tokens (a bigger step is refused with
// InvalidArgument), pinned staging, and the KV cache allocated by AllocateKvCache. KvBudgetBytes() is what
// gpu_memory_fraction of the GPU leaves after everything in use at load time and a reserve.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/weight_quantization.h"
#include "engine/device/device_resources.h"
#include "engine/model/decoder.h"
#include "engine/model/llama_weights.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/sampling.h"

namespace stoke {

class CudaLlama final : public DecoderModel {
 public:
  struct Options {
    int gpu_index = 0;
    // Fraction of the GPU's total memory stoke may use; KvBudgetBytes() gets what is left of it.
    double gpu_memory_fraction = 0.90;
    // Largest step (tokens) the scratch arena holds; larger steps are refused.
    int max_step_tokens = 8192;
    // Capture decode buckets as CUDA graphs (off: every step runs eagerly, same kernels).
    bool cuda_graphs = true;
    // cuBLASLt algorithm cache file ("" = in memory) and how many heuristic candidates to time per decode
    // shape (1 = the heuristic's first: deterministic across instances).
    std::string gemm_cache_path;
    int gemm_candidates = 8;
    // Steps of at most this many tokens run their projections through the bf16 GEMV (kernels/cuda/gemv.h,
    // 0..8) instead of cuBLASLt; 0 = always cuBLASLt (flag --gemv-max-rows). Default 1: on the
    // H200 the 8B batch-1 step measured level with cuBLASLt with one warp per row (5.06 vs 5.05 ms; one
    // kernel fewer per layer, the SwiGLU fused), 4.62 ms with two (12-03), and 1.8x slower at batch 8 (every
    // warp re-reads all 8 activation rows per weight chunk).
    int gemv_max_rows = 1;
    // With fp8 weights: steps of at most this many tokens (0..8) run the layers' projections (and the fused
    // gate|up + SwiGLU) through the fp8 GEMV, larger ones quantise the activations for cuBLASLt's FP8 GEMM
    // (flag --fp8-gemv-max-rows; the lm_head follows gemv_max_rows). At 2-8 rows the GEMV is the
    // tensor-core kernel (gemv.h), whose cost does not grow with the rows: the 8B decode step at batch 2 / 8
    // took 0.81x / 0.85x the time of the quantiser + FP8 GEMM path (H100, 2026-12-06).
    int fp8_gemv_max_rows = 8;
    // Launch the step's kernels with programmatic dependent launch: the GEMVs (their first weight loads
    // overlap the kernel before), and since 2026-12-06 the norms, the RoPE + cache write, the decode
    // attention and its split merge (each starts while the one before finishes, then waits for it). With the
    // GEMVs alone the 8B batch-1 step measured within noise (H200 12-02 / 12-03, H100 served c=1 12-06); the
    // whole chain (H100, 12-06, bench/results/gpu_pdl_chain_h100_2026-12-06.json): batch 1 ctx 512 5.95 ->
    // 5.86 ms bf16 and 3.91 -> 3.84 ms fp8 weights, ctx 4096 6.55 -> 6.48 ms, but batch 64 10.38 -> 10.46 ms
    // and batch 256 20.28 -> 20.34 ms. kAuto (the default, --pdl auto): PDL in the steps of at most
    // gemv_max_rows tokens (the GEMV steps; with fp8 weights fp8_gemv_max_rows when larger: the fp8 step at
    // batch 2 / 8 took 4.34 / 4.79 ms with it, 4.62 / 4.96 without, and 4.49 / 4.91 vs 4.59 / 4.95 in a
    // second call, H100 12-06); kOn every step; kOff none.
    enum class Pdl { kOff, kOn, kAuto };
    Pdl pdl = Pdl::kAuto;
    // Warps per output row in the one-token GEMVs (kernels/cuda/gemv.h): 0 = auto (GemvSplitFor: 2 when
    // k >= 4096, else 1), or 1, 2, 4, 8 (flag --gemv-split).
    int gemv_split = 0;
    // GGUF Q4_K / Q6_K weights in 1-token steps: how QuantGemv multiplies (flag --kquant-gemv; quant.h).
    cuda::KGemvMath kquant_gemv = cuda::KGemvMath::kAuto;
    // Attention kernel launch choices, passed to every PagedDecodeAttention / PrefillAttention call and to
    // DecodeWorkspaceBytes (flags --decode-min-partition, --decode-pipeline, --prefill-attention).
    cuda::AttentionLaunchOptions attention;
    // A step of decodes and prefill chunks (decodes first, as the scheduler orders them): true = the decodes'
    // attention runs in PagedDecodeAttention (a GQA group's heads share each K/V tile) and only the chunks in
    // PrefillAttention; false = every sequence in PrefillAttention, a decode being a one-row query tile per
    // head (flag --mixed-attention split|prefill).
    bool mixed_split = true;
    // SwiGLU (SiluMulFused) and the fp8 activation quantiser (QuantizeRowsFp8) with 8 values per thread
    // access (16-byte loads), QkvRopeWriteKv(Quant) one warp per head: the same values bit
    // for bit (CudaDecoderTuning::vector_elementwise; on by default).
    bool vector_elementwise = true;
    // KV cache storage (--kv-cache-dtype): kAuto / kBf16 = bf16; kInt8 / kFp8 = 8 bits with an fp32 scale per
    // (slot, kv head), quantised by QkvRopeWriteKvQuant, read by the attention kernels' 8-bit forms.
    KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
    // Weight precision (--quantization): kNone = bf16; kFp8 = E4M3 with an fp32 scale per output channel,
    // quantised on the device at load (the bf16 copies are then freed; the lm_head stays bf16 unless
    // fp8_lm_head): steps of <= fp8_gemv_max_rows tokens (the lm_head: gemv_max_rows)
    // run the fp8 GEMV (bf16 activations), larger ones quantise activations per token and run cuBLASLt
    // FP8 GEMMs. The embedding stays bf16 (rows are gathered, not multiplied).
    WeightQuantization quantization = WeightQuantization::kNone;
    // Tests only (no flag reaches it): every fp8 weight scale is multiplied by this after quantisation. A
    // value other than 1 is a deliberately broken quantiser, which the consistency gate must reject.
    float fp8_scale_multiplier = 1.0f;
    // fp8 weights: the lm_head too (off: it stays bf16, as in the FP8 checkpoints of vLLM / TensorRT-LLM;
    // engine/model/weight_quant.h says why). No flag reaches it; tests and experiments turn it on.
    bool fp8_lm_head = false;
  };

  static StatusOr<std::unique_ptr<CudaLlama>> Create(LlamaWeights weights, const Options& options);
  ~CudaLlama() override;
  CudaLlama(const CudaLlama&) = delete;
  CudaLlama& operator=(const CudaLlama&) = delete;

  const LlamaConfig& config() const override { return config_; }
  Status AllocateKvCache(int num_blocks, int block_size) override;
  KvCacheShape kv_shape() const override;
  int64_t KvBytesPerToken() const override;
  Status CopyKvBlock(int32_t src, int32_t dst) override;
  Status Step(const StepInput& input, StepOutput* output) override;
  int64_t KvBudgetBytes() const override { return kv_budget_bytes_; }
  std::string device_name() const override { return device_name_; }
  std::string quantization_name() const override {
    return std::string(WeightQuantizationName(options_.quantization));
  }
  std::string kv_cache_dtype_name() const override {
    return quant_kv() ? std::string(KvCacheDtypeName(options_.kv_cache_dtype)) : "bf16";
  }
  // Logits::kToken rows are drawn by cuda::SampleRows over the logits on the GPU; only ids come back.
  bool SamplesOnDevice() const override { return true; }

  // Counters for logs and tests.
  int64_t graph_replays() const { return graph_replays_; }
  // Projections (lm_head included) decoded by the GEMV from their GGUF Q8_0 values (UploadLinear).
  int64_t q8_linears() const { return q8_linears_; }
  // Projections whose 1-token steps run the fused-dequant QuantGemv over the file's Q4_1 / Q4_K / Q6_K
  // blocks.
  int64_t quant_gemv_linears() const { return quant_gemv_linears_; }
  int64_t graphs_captured() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t bucket_steps() const { return bucket_steps_; }  // decode steps run through a bucket (either way)
  // Mixed steps whose decodes ran in the decode kernel and chunks in the prefill kernel
  // (Options::mixed_split).
  int64_t split_steps() const { return split_steps_; }
  int max_step_tokens() const { return max_tokens_; }
  int64_t weight_bytes() const { return weight_bytes_; }

  // Rows of logits computed per lm_head chunk (and the largest decode bucket).
  static constexpr int kLogitsRows = 256;

 private:
  // Context classes of the decode buckets: a bucket's block-table width and split count cover this many
  // positions, so one captured graph serves every step whose longest context fits the class.
  static constexpr int kContextClasses[] = {2048, 8192, 32768, 131072};
  static constexpr int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

  // A projection y = x·W^T: W bf16 [rows, cols] on the device (the GEMM's operand), plus, for the GEMV of
  // decode steps of up to options_.gemv_max_rows tokens, the file's 8-bit form when every part is GGUF Q8_0:
  // q8 = int8 [rows (padded), cols] and q8_d = fp16 [rows, cols / 32] (cuda::RepackQ8_0), or (every part
  // Q4_1, Q8_0, Q4_K or Q6_K, not all Q8_0) the raw blocks of each part for the 1-token QuantGemv. With fp8
  // weights `w` is null (freed after quantisation; the embedding keeps it) and q / scale hold the E4M3 bytes
  // and one scale per row.
  struct Linear {
    __nv_bfloat16* w = nullptr;
    uint8_t* q = nullptr;
    float* scale = nullptr;
    int8_t* q8 = nullptr;
    __half* q8_d = nullptr;
    int64_t rows = 0, cols = 0;
    struct QuantPart {
      DType type = DType::kF32;
      const void* raw = nullptr;
      int64_t rows = 0, row_offset = 0;
    };
    std::vector<QuantPart> quant;  // empty: no GEMV path
  };
  // A fused gate|up whose 1-token step runs QuantGemvSiluMul: two raw parts (gate, up) of the same K-quant
  // type and the same number of rows.
  static bool KQuantSwiGlu(const Linear& gate_up) {
    const std::vector<Linear::QuantPart>& q = gate_up.quant;
    return q.size() == 2 && q[0].type == q[1].type &&
           (q[0].type == DType::kQ4_K || q[0].type == DType::kQ6_K) && q[0].rows == q[1].rows &&
           q[1].row_offset == q[0].rows;
  }
  struct Layer {
    float* attn_norm = nullptr;
    float* ffn_norm = nullptr;
    float* qkv_bias = nullptr;  // nullptr or [q_dim + 2 kv_dim]
    Linear qkv, o, gate_up, down;
  };
  // Offsets (in int32 elements) of the step inputs in the staging buffers; sections 256-byte aligned.
  struct Layout {
    int64_t tokens = 0, positions = 0, slots = 0, rows = 0, cu = 0, start = 0, ctx = 0, prefill_cu = 0,
            bt = 0, total = 0;
  };
  // Pointers of one step's inputs on the device plus its shape.
  struct StepArgs {
    int64_t T = 0;  // tokens (incl. padding)
    int S = 0;      // sequences (incl. padding)
    int W = 0;      // block-table width
    // The leading sequences whose attention runs in PagedDecodeAttention (one token each: S for a decode
    // step, the decodes ahead of the prefill chunks in a mixed step, 0 = all through PrefillAttention); the
    // rest run PrefillAttention over prefill_cu (their cu_seqlens less the decode tokens).
    int decode_seqs = 0;
    int max_ctx = 0;  // the max_context_len given to PagedDecodeAttention (over the decode sequences)
    const int32_t *tokens = nullptr, *positions = nullptr, *slots = nullptr, *cu = nullptr, *start = nullptr,
                  *ctx = nullptr, *prefill_cu = nullptr, *bt = nullptr;
  };

  explicit CudaLlama(const Options& options);
  Status Init(LlamaWeights weights);
  Status UploadWeights(const LlamaWeights& weights);
  // gemv_copy: keep the GEMV form of GGUF Q8_0 / Q4_1 / Q4_K / Q6_K parts (false for an untied embedding,
  // which is only gathered from).
  StatusOr<Linear> UploadLinear(const std::vector<const LinearWeight*>& parts, int64_t pad_rows_to,
                                bool gemv_copy = true);
  // Quantises lin's bf16 rows to fp8 + scales (new allocations); frees the bf16 copy when free_bf16.
  Status QuantizeLinearFp8(Linear* lin, int64_t alloc_rows, bool free_bf16);
  // A pre-quantised FP8 checkpoint's projection (F8_E4M3 codes with row scales, LinearWeight::row_scale): the
  // codes and scales go to the device as they are, no bf16 copy (fp8 weights only).
  StatusOr<Linear> UploadFp8Linear(const std::vector<const LinearWeight*>& parts, int64_t pad_rows_to);
  bool fp8_weights() const { return options_.quantization == WeightQuantization::kFp8; }
  StatusOr<void*> DeviceAlloc(size_t bytes);
  void DeviceFree(void* p, size_t bytes);
  Status Upload(void* dst, const void* src, size_t bytes);
  StatusOr<float*> UploadFloats(const std::vector<float>& v);
  Status AllocateScratch();
  Status ValidateInput(const StepInput& in) const;
  static Layout MakeLayout(int64_t T, int64_t S, int64_t R, int64_t W);
  StepArgs ArgsFor(const Layout& l, int64_t T, int S, int W) const;

  // Enqueues the layers for `a` (no sync, no host work besides launches): capturable.
  Status EnqueueLayers(const StepArgs& a, cuda::BlasLtGemm& gemm);
  Status EnqueueAttention(int layer, const StepArgs& a);       // bf16 cache
  Status EnqueueQuantAttention(int layer, const StepArgs& a);  // 8-bit cache
  // Their attention kernels over layer kv (a bf16 or 8-bit cache): the decode kernel for the leading
  // a.decode_seqs sequences, the prefill kernel for the rest.
  template <typename Kv>
  Status EnqueueAttentionKernels(const StepArgs& a, const Kv& kv);
  Status EnqueueLinear(const Linear& lin, const __nv_bfloat16* x, int64_t m, __nv_bfloat16* y,
                       cuda::BlasLtGemm& gemm);
  // Final norm + lm_head of the n token rows listed at `rows` (device) into logits_ (fp32 [n, vocab_pad_]).
  Status EnqueueLogits(const int32_t* rows, int64_t n, cuda::BlasLtGemm& gemm);
  // Copies rows [0, last kept] of logits_ to the host and rows keep[i] (ascending) of them to dst[i, :]
  // (dst = [keep, vocab]); synchronises the stream either way.
  Status CopyLogitsOut(const std::vector<int64_t>& keep, float* dst);
  // Draws the tokens of logits_ rows draws[i].first (< n) on the device; the ids are in SampledTokens()
  // after the next stream synchronisation. No-op without draws.
  Status EnqueueSampling(int64_t n, const std::vector<std::pair<int64_t, TokenSampling>>& draws);
  int32_t* SampledTokens() const;  // pinned [kLogitsRows]

  Status StepGeneral(const StepInput& in, StepOutput* out);
  // Returns false in *handled when the step does not fit a decode bucket (the caller runs StepGeneral).
  Status StepBucket(const StepInput& in, StepOutput* out, bool* handled);
  Status CaptureBucket(std::pair<int, int> key, const StepArgs& a);
  void ReleaseGraphs();

  Options options_;
  LlamaConfig config_;
  std::string device_name_;
  device::Stream stream_;
  // StepInput::time_device: events around a step's work on stream_ (created at the first timed step).
  device::Event step_events_[2];
  bool step_events_ready_ = false;
  std::unique_ptr<cuda::BlasLtGemm> gemm_tuned_;  // decode buckets (timed candidates)
  std::unique_ptr<cuda::BlasLtGemm> gemm_heur_;   // other steps (heuristic's first: no tuning syncs)
  std::vector<void*> allocations_;                // cudaMalloc'd weight buffers, freed at destruction
  int64_t weight_bytes_ = 0;
  int64_t q8_linears_ = 0;
  int64_t quant_gemv_linears_ = 0;
  int64_t kv_budget_bytes_ = 0;

  // Weights.
  __nv_bfloat16* embedding_ = nullptr;  // [vocab_pad_, hidden] (rows >= vocab are zero)
  Linear lm_head_;                      // [vocab_pad_, hidden]
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;  // [head_dim / 2]
  std::vector<Layer> layers_;
  int64_t vocab_pad_ = 0;

  // Scratch (fixed addresses: CUDA graphs bake them in).
  int max_tokens_ = 0;
  std::unique_ptr<device::DeviceArena> arena_;
  float* x_ = nullptr;  // [T, hidden] residual
  __nv_bfloat16 *h_ = nullptr, *qkv_ = nullptr, *q_ = nullptr, *attn_ = nullptr, *proj_ = nullptr,
                *gu_ = nullptr, *act_ = nullptr, *sel_ = nullptr;
  float* logits_ = nullptr;  // [kLogitsRows, vocab_pad_]
  // fp8 weights: a step's activations quantised per token for the FP8 GEMMs ([T, max(hidden, q dim, ffn)]
  // bytes, [T] scales); null otherwise.
  uint8_t* act_q_ = nullptr;
  float* act_scale_ = nullptr;
  void* decode_ws_ = nullptr;
  size_t decode_ws_bytes_ = 0;
  int32_t* d_ints_ = nullptr;
  int64_t ints_capacity_ = 0;
  int32_t* d_row_ids_ = nullptr;             // [kLogitsRows] = 0, 1, 2, ... (bucket logits rows)
  cuda::RowSampling* d_sampling_ = nullptr;  // [kLogitsRows] per-row draw parameters
  int32_t* d_tokens_ = nullptr;              // [kLogitsRows] drawn ids

  // Pinned staging.
  device::PinnedHostPool pinned_;
  device::PinnedHostPool::Buffer h_ints_buf_, h_logits_buf_;
  device::PinnedHostPool::Buffer h_sample_buf_;  // RowSampling[kLogitsRows], then int32 tokens[kLogitsRows]

  // KV cache: per layer k and v = [num_blocks, block_size, kv_heads, head_dim] bf16, back to back.
  void* kv_ = nullptr;
  std::vector<cuda::DevicePagedKv<__nv_bfloat16>> kv_layers_;
  // With an 8-bit cache instead (quant_kv()): per layer k and v bytes, then k and v scales [num_blocks,
  // block_size, kv_heads] fp32, in the same allocation kv_.
  std::vector<cuda::DevicePagedKvQuant> kv_quant_layers_;
  bool quant_kv() const { return KvCacheDtypeIsQuantized(options_.kv_cache_dtype); }
  // Whether kernels over `tokens` rows launch with PDL (Options::pdl): a step's layers ask with its tokens,
  // its final norm and lm_head with the rows whose logits are wanted.
  bool PdlFor(int64_t tokens) const {
    const int gemv_rows =
        fp8_weights() ? std::max(options_.gemv_max_rows, options_.fp8_gemv_max_rows) : options_.gemv_max_rows;
    return options_.pdl == Options::Pdl::kOn || (options_.pdl == Options::Pdl::kAuto && tokens <= gemv_rows);
  }
  int num_blocks_ = 0, block_size_ = 0;

  // Decode buckets: (bucket rows, context class) -> graph.
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;
  std::map<std::pair<int, int>, bool> bucket_seen_;  // true: ran eagerly once (tuned); false: capture failed
  // options_.attention with pdl set: the attention launches of the steps PdlFor() picks.
  cuda::AttentionLaunchOptions attention_pdl_;
  int64_t graph_replays_ = 0;
  int64_t bucket_steps_ = 0;
  int64_t split_steps_ = 0;
};

}  // namespace stoke
