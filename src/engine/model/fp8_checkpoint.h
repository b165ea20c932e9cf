// Pre-quantised FP8 checkpoints (docs/precision.md, "Pre-quantised FP8 checkpoints"): an HF folder whose
// Linear weights are safetensors F8_E4M3 with a scale tensor beside each, as llm-compressor
// (compressed-tensors), AutoFP8 / vLLM ("fp8"), fbgemm_fp8 and the block-wise FP8 releases (DeepSeek-V3,
// Qwen3-FP8) write them:
//
//   <stem>.weight        F8_E4M3 [out, in]
//   <stem>.weight_scale  F32 / BF16 / F16: [] or [1] (per tensor), [out] or [out, 1] (per output channel),
//                        or [ceil(out / br), ceil(in / bc)] (per block of br x bc)
//   (or <stem>.weight_scale_inv, the block-wise releases' name for the same multiplier)
//
// W[r, c] = e4m3(weight[r, c]) · scale(r, c), computed in fp32. A static <stem>.input_scale is not used: stoke
// quantises activations per token on the fly (docs/precision.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/tensor.h"

namespace stoke {

// What config.json's quantization_config says about an FP8 checkpoint.
struct Fp8CheckpointFormat {
  std::string method;  // quant_method ("compressed-tensors", "fp8", "fbgemm_fp8"); "" when absent
  // weight_block_size of block-wise checkpoints; 128 x 128 (the only size released) when the config has none.
  int64_t block_rows = 128, block_cols = 128;
};

// From config.json (the whole object). InvalidArgument for a malformed weight_block_size.
StatusOr<Fp8CheckpointFormat> Fp8CheckpointFormatFromConfig(const nlohmann::json& config);

enum class Fp8ScaleLayout : uint8_t { kPerTensor, kPerChannel, kPerBlock };
std::string_view Fp8ScaleLayoutName(Fp8ScaleLayout layout);  // "per-tensor", "per-channel", "per-block"

// The scale tensor's name for an F8 weight named `weight_name` ("....weight"): the first of
// "....weight_scale" and "....weight_scale_inv" that `has` says exists, or "" when neither does.
template <typename Has>
std::string Fp8ScaleName(const std::string& weight_name, Has has) {
  if (!weight_name.ends_with("weight")) return "";
  for (const char* suffix : {"_scale", "_scale_inv"}) {
    std::string n = weight_name + suffix;
    if (has(n)) return n;
  }
  return "";
}

// Dequantises `weight` (F8_E4M3, [rows, cols]) with `scale` into out[rows * cols] fp32, on `pool`, and says
// which layout the scale's shape has. InvalidArgument naming the tensors for a scale whose shape fits no
// layout, a scale that is negative or not finite, a scale dtype other than F32 / BF16 / F16, and a NaN code
// (0x7f / 0xff) in the weight (its row and column).
StatusOr<Fp8ScaleLayout> DequantizeFp8Weight(const TensorRef& weight, const TensorRef& scale,
                                             const Fp8CheckpointFormat& format, ThreadPool& pool, float* out);

}  // namespace stoke
