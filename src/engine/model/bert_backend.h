// A BERT encoder on another device than the CPU (the CUDA backend, engine/cuda/cuda_bert.h), behind an
// interface this CPU-only library can name: the backend travels in the Backends value main() builds
// (engine/model/backends.h; CudaBackends() in CUDA builds), so callers (stoke embed, the classic serving
// path) select a device without linking CUDA.
//
//   // weights uploaded once:
//   ASSIGN_OR_RETURN(auto dev, LoadBertOnDevice(encoder, {.device = "cuda"}, backends));
//   ASSIGN_OR_RETURN(auto runner, dev->CreateRunner());   // one per instance: its own stream + scratch
//   RETURN_IF_ERROR(runner->Embed(batch_ids, &out, &times));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/weight_quantization.h"
#include "base/status.h"
#include "engine/model/bert.h"

namespace stoke {

struct Backends;  // engine/model/backends.h

// Where one batch's time went on the device, ns (events on the runner's stream). prepare/finish are host
// time inside Embed before the first copy (flatten, validate, stage into pinned memory) and after the last
// (copy out of pinned memory).
struct EmbedTimes {
  int64_t prepare_ns = 0;
  int64_t h2d_ns = 0;
  int64_t compute_ns = 0;
  int64_t d2h_ns = 0;
  int64_t finish_ns = 0;
};

// One execution context (a stream, scratch memory, pinned staging): not thread-safe; one per instance.
class BertRunner {
 public:
  virtual ~BertRunner() = default;
  // Same contract as BertEncoder::Embed (truncation to max_seq_length, errors for empty sequences and bad
  // ids); blocks until the result is on the host. `times` may be null.
  virtual Status Embed(const std::vector<std::vector<int32_t>>& batch_ids, std::vector<float>* out,
                       EmbedTimes* times) = 0;
  // Embeds that replayed a captured CUDA graph instead of launching each kernel (BertDeviceOptions::
  // cuda_graphs); 0 for runners without graphs.
  virtual int64_t graph_launches() const { return 0; }
};

// An encoder's weights on a device, shared by every runner created from it. Thread-safe.
class BertDeviceModel {
 public:
  virtual ~BertDeviceModel() = default;
  virtual std::string device_name() const = 0;  // e.g. "cuda:0 (NVIDIA H200)"
  virtual StatusOr<std::unique_ptr<BertRunner>> CreateRunner() = 0;
};

struct BertDeviceOptions {
  std::string device = "cuda";  // "cpu", "cuda", or "auto" (cuda when available)
  int gpu_index = 0;
  // Tokens (all sequences of a batch together) a runner accepts in one Embed; its scratch grows to fit the
  // largest batch seen, up to this. Larger batches get InvalidArgument.
  int64_t max_batch_tokens = 1 << 17;
  // cuBLASLt algorithms timed per GEMM shape the first time it is seen (1 = the heuristic's first, no
  // timing: right for serving, where every batch has another token count).
  int gemm_candidates = 1;
  // CUDA attention kernel (flag --encoder-attention): "auto" = the first of tensor-core, vectorized that
  // agrees with the simple kernel on a random probe at load; "tensor" or "vectorized" = only that one (falls
  // back to simple if it disagrees); "tensor32" = the tensor-core kernel with 32 query rows per warp
  // (head_dim <= 64; else, or if it disagrees, as "tensor"); "simple" = the simple kernel (slowest, the reference). For A/B runs and
  // as a way around a kernel problem. Anything else: InvalidArgument.
  std::string attention = "auto";
  // GEMM epilogues of the CUDA encoder (flag --encoder-epilogues; docs/cuda.md):
  //   "fused-tanh" (default) biases added by cuBLASLt's epilogue (BIAS; the FFN's GELU_BIAS: bias + GELU in
  //                the epilogue, GELU's tanh approximation), the residual stream in bf16, residual + LayerNorm
  //                one kernel (ResidualLayerNormBf16);
  //   "fused"      the same with BERT's exact erf GELU as a kernel after the FFN's biased GEMM;
  //   "separate"   bias / bias + GELU / bias + residual + LayerNorm as kernels after each GEMM, the residual
  //                stream in fp32 (the first form, kept for A/B runs).
  // On the H200 (bench/results/gpu_bert_fused_epilogues_h200_2026-12-04.json) fused-tanh is the fastest
  // (BERT-large s384 b256: 2,129 seq/s against 1,939 fused and 1,609 separate) with the same cosine to
  // transformers' fp32 erf model as the other two (mean 0.99997, min 0.99989). fp8 weights and hidden sizes
  // the fused LayerNorm does not take (ResidualLayerNormBf16Supports) run "separate".
  std::string epilogues = "fused-tanh";
  // CUDA graphs for the encoder's forward pass (flag --encoder-cuda-graphs on|off; docs/cuda.md): a batch
  // shape (tokens, sequences, longest sequence) seen a second time is captured once and replayed from then
  // on, one launch instead of ~8 per layer. Shapes repeat when clients send the same batch (benchmarks,
  // perf_analyzer, fixed-length inputs); served variable lengths mostly run eagerly. At most 64 graphs per
  // runner; a shape whose capture fails runs eagerly (logged once). Measured on the H200
  // (bench/results/gpu_bert_int8_graphs_h200_2026-12-05.json): batch 1 BERT-base 1,166 -> 2,136 seq/s, BERT-large
  // 574 -> 778; batch 8 +14 % / +4 %; batch >= 32 within 2 %; replays equal the eager pass bit for bit.
  bool cuda_graphs = true;
  // Weight precision of the encoder's Linear layers (flag --quantization; docs/precision.md). kFp8 on cuda:
  // weights fp8 E4M3 with one fp32 scale per output channel, activations quantised per token before each
  // cuBLASLt FP8 GEMM (W8A8), embeddings / LayerNorm / biases unchanged. The CPU form (BertEncoder) is
  // selected by the caller, not here.
  WeightQuantization quantization = WeightQuantization::kNone;
  // Tests only (no flag): every weight scale multiplied by this (a deliberately broken quantiser).
  float fp8_scale_multiplier = 1.0f;
  // kInt8 (encoders; docs/precision.md): what calibration measured (precision::CalibrateForInt8): the
  // SmoothQuant factors and, with static activations, one scale per GEMM input; required for kInt8. On cuda
  // the device uploads the CPU reference's int8 weights (BertEncoder::QuantizedInt8Layers) and quantises each
  // GEMM input as the CPU does, then runs cuBLASLt's int8 GEMM (exact int32 sums).
  std::shared_ptr<const BertActivationRanges> int8_ranges;
  // Tests only (no flag): every int8 activation scale multiplied by this (0.1: a broken calibration).
  float int8_activation_scale_multiplier = 1.0f;
};

// InvalidArgument naming the flag for an unknown `attention`.
Status ValidateBertDeviceOptions(const BertDeviceOptions& options);

// A device encoder backend (engine/cuda: CudaBertBackend()), carried in Backends::cuda_bert. `available`: a
// usable GPU is visible (null = always).
struct BertBackend {
  StatusOr<std::shared_ptr<BertDeviceModel>> (*create)(std::shared_ptr<const BertEncoder> encoder,
                                                       const BertDeviceOptions& options) = nullptr;
  bool (*available)() = nullptr;
};

// "auto" -> "cuda" when backends.cuda_bert is usable (built in, a GPU visible), else "cpu"; any other value
// as it is.
std::string ResolveBertDevice(const std::string& device, const Backends& backends);

// "cpu" (or "auto" without a usable backends.cuda_bert): nullptr, run BertEncoder::Embed. "cuda": the model
// uploaded by backends.cuda_bert, or FailedPrecondition saying why not (built without CUDA, no GPU, or an
// encoder already quantised on the CPU: the device quantises its own copies, options.quantization; int8
// takes the calibration's options.int8_ranges). Anything else: InvalidArgument. On the CPU
// options.quantization is the caller's to apply (BertEncoder::QuantizeWeightsFp8 / QuantizeWeightsInt8).
StatusOr<std::shared_ptr<BertDeviceModel>> LoadBertOnDevice(std::shared_ptr<const BertEncoder> encoder,
                                                            const BertDeviceOptions& options,
                                                            const Backends& backends);

}  // namespace stoke
