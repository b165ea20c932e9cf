// The decoder interface the scheduler and runner drive: one call runs one step over a flat batch of tokens
// from many sequences, each at its own position, reading and writing a paged KV cache through block tables.
// The CPU and CUDA backends implement the same interface; nothing here knows about requests or HTTP.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "api/kv_cache_dtype.h"
#include "api/sampling.h"
#include "base/status.h"
#include "engine/model/llama_config.h"

namespace stoke {

// Where KV lives: `num_blocks` blocks of `block_size` token slots per layer. Block ids are handed out by the
// serving layer's BlockAllocator; the model only reads/writes the slots a block table names.
struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;
};

// How the KV cache is stored (DecoderOptions::kv_cache, --kv-cache-dtype; docs/precision.md).
struct KvCacheOptions {
  // kAuto: the backend's native precision (fp32 on the CPU, bf16 on CUDA); kBf16; kInt8 / kFp8: 8 bits with
  // one fp32 scale per (token slot, KV head), quantised on write, dequantised inside attention.
  KvCacheDtype dtype = KvCacheDtype::kAuto;
  // Tests only, no flag: every dequantisation scale is multiplied by this (CPU backend). A value other than
  // 1 is a deliberately broken quantiser, which the consistency gate (tools/precision) must reject.
  float testing_dequant_scale_multiplier = 1.0f;
};

// One sequence's slice of a step.
struct StepSequence {
  int32_t token_begin = 0;  // first index into StepInput::token_ids for this sequence
  int32_t num_tokens = 0;   // tokens of this sequence in the step (prefill chunk, or 1 for decode)
  int32_t start_pos = 0;    // position of the first of those tokens; tokens [0, start_pos) are already in KV
  std::vector<int32_t> block_table;  // block ids covering positions [0, start_pos + num_tokens)
  // Which rows of logits to produce: none, the last token only (generation), or every token (scoring).
  // kToken: no logits row; the next token after the last one is drawn on the device with `sampling` and
  // returned in StepOutput::tokens (only for a model whose SamplesOnDevice() is true: the logits stay there).
  // Greedy picks the host Sampler's token; a random draw follows the same distribution but may pick another
  // token for the same (seed, step) (kernels/cuda/sampling.h).
  enum class Logits : uint8_t { kNone, kLast, kAll, kToken } logits = Logits::kLast;
  TokenSampling sampling;  // kToken only (api/sampling.h)
};

struct StepInput {
  std::vector<int32_t> token_ids;  // [num_tokens], sequences concatenated
  std::vector<StepSequence> sequences;
  // Time the step on the device (CUDA events around its work on the stream) into StepOutput::device_ns. The
  // loop asks only while a trace is on (the timeline's GPU track where CUPTI is missing); backends without a
  // device ignore it.
  bool time_device = false;
};

struct StepOutput {
  // Rows in sequence order: for each sequence, 0, 1 or num_tokens rows as its `logits` asks.
  std::vector<float> logits;  // [num_rows, vocab_size]
  int64_t num_rows = 0;
  // One token per Logits::kToken sequence, in sequence order.
  std::vector<int32_t> tokens;
  // With StepInput::time_device on a device backend: the device time of the step's work, from a CUDA event
  // before its first kernel to one after its last copy (0 = not measured).
  int64_t device_ns = 0;
};

// The checks every backend's Step makes before touching memory: sequences tile the step's tokens in order,
// positions are non-negative, each block table covers its positions with ids in [0, num_blocks), token ids
// are in [0, vocab_size), Logits::kToken only where the backend samples on the device (`device_sampling`).
// Errors are InvalidArgument naming the sequence and value (FailedPrecondition when the KV cache is not
// allocated: num_blocks == 0).
Status ValidateStepInput(const StepInput& input, int num_blocks, int block_size, int vocab_size,
                         bool device_sampling = false);

class DecoderModel {
 public:
  virtual ~DecoderModel() = default;
  virtual const LlamaConfig& config() const = 0;
  // Allocates KV storage for `num_blocks` blocks of `block_size` tokens (all layers). Call once before Step.
  virtual Status AllocateKvCache(int num_blocks, int block_size) = 0;
  virtual KvCacheShape kv_shape() const = 0;
  // Bytes of KV storage one token takes across all layers (K and V), for sizing from a memory budget.
  virtual int64_t KvBytesPerToken() const = 0;
  // Copies the KV slots of block `src` to block `dst` (all layers), for copy-on-write of shared blocks.
  virtual Status CopyKvBlock(int32_t src, int32_t dst) = 0;
  // Runs one step. Writes K/V for every input token into its slot, then attends over [0, pos] per token.
  virtual Status Step(const StepInput& input, StepOutput* output) = 0;
  // Bytes of device memory left for the KV cache after weights and scratch (a GPU backend, sized by
  // DecoderOptions::gpu_memory_fraction); 0 = no device budget, the caller's budget flag applies (CPU).
  virtual int64_t KvBudgetBytes() const { return 0; }
  // True when Step accepts Logits::kToken: the next token is drawn where the logits are (the GPU), and only
  // the token ids cross to the host.
  virtual bool SamplesOnDevice() const { return false; }
  // How the KV cache is stored, resolved: "fp32", "bf16", "int8" or "fp8" (logs, /v1/models, the gate).
  virtual std::string kv_cache_dtype_name() const { return "fp32"; }
  // The weight precision it was loaded with (--quantization): "none" or "fp8".
  virtual std::string quantization_name() const { return "none"; }
  // "cpu" or "cuda:N (name)": for logs, /v1/models and `stoke model inspect`.
  virtual std::string device_name() const { return "cpu"; }
};

}  // namespace stoke
