// What one decoder step costs in bytes and FLOPs, from the model's shape and storage: the modelled side of
// `stoke bench step`'s roofline figures and of the serving loop's per-step split
// (stoke:step_read_bytes_total, stoke:step_flops_total; docs/telemetry.md). Pure arithmetic on the config;
// the bytes per parameter come from the weights as the backend stores them.
#pragma once

#include <cstdint>
#include <string>

#include "api/dtype.h"
#include "base/status.h"
#include "engine/model/decoder.h"

namespace stoke {

struct DecoderStepCosts {
  // Parameters: every layer's matmuls (QKV, O, gate, up, down); the lm_head; the rest (norms, biases).
  int64_t matmul_params = 0;
  int64_t lm_head_params = 0;
  int64_t other_params = 0;
  double bytes_per_param = 0;          // matmul weights as a decode step reads them
  double lm_head_bytes_per_param = 0;  // the lm_head's
  // Bytes of weights one step reads, whatever its batch: matmuls + lm_head + the rest (fp32). A step with
  // no logits row skips the lm_head, which ReadWeightBytes accounts for.
  double weight_bytes = 0;
  double lm_head_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // K and V of one position, all layers
  // FLOPs of the attention per (query, key) pair, all layers and heads: QK^T and PV, 2 * 2 * head_dim each.
  double attention_flops_per_pair = 0;

  bool known() const { return weight_bytes > 0; }
  // Bytes of weights a step reads: everything, less the lm_head when no row needs logits.
  double ReadWeightBytes(int64_t logit_rows) const {
    return logit_rows > 0 ? weight_bytes : weight_bytes - lm_head_bytes;
  }
  // Matmul FLOPs of `tokens` tokens of which `logit_rows` go through the lm_head.
  double MatmulFlops(int64_t tokens, int64_t logit_rows) const {
    return 2.0 * static_cast<double>(matmul_params) * static_cast<double>(tokens) +
           2.0 * static_cast<double>(lm_head_params) * static_cast<double>(logit_rows);
  }
};

// The costs of `model`, loaded from `path` (the file decides the bytes per parameter of GGUF quantised
// weights). CUDA reads bf16, or one byte with --quantization fp8 (the lm_head stays bf16), or a GGUF file's
// own bytes for the block types its decode GEMVs read (CudaGemvReadsBlocks) and bf16's 2 for the others; the
// CPU reads the file's bytes, or the fp32 matrices fp8 weights were dequantised into.
StatusOr<DecoderStepCosts> ComputeDecoderStepCosts(const DecoderModel& model, const std::string& path);

// GGUF block types whose blocks the CUDA decoder's decode GEMVs read as stored (Q8_0 through Q8Gemv; Q4_1,
// Q4_K and Q6_K through QuantGemv); every other type is converted to bf16 at load (CudaLlama::UploadLinear).
bool CudaGemvReadsBlocks(DType t);

// Bytes per weight element over the file's 2-D tensors: as stored (quantised files: fractional), or with
// `cuda_decode` as the CUDA decoder's decode steps read them (stored bytes for CudaGemvReadsBlocks types, 2
// for the rest).
StatusOr<double> FileBytesPerParam(const std::string& path, bool cuda_decode = false);

}  // namespace stoke
