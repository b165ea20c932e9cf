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
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/loader/tensor.h"

namespace stoke {

// What config.json's quantization_config says about an FP8 checkpoint.
struct Fp8CheckpointFormat {
  std::string method;  // quant_method ("compressed-tensors", "fp8", "fbgemm_fp8"); "" when absent
  // Whether the config names a pre-quantised FP8 checkpoint: quant_method "fp8" or "fbgemm_fp8", or
  // "compressed-tensors" in its "float-quantized" format.
  bool pre_quantized = false;
  // weight_block_size of block-wise checkpoints; 128 x 128 (the only size released) when the config has none.
  int64_t block_rows = 128, block_cols = 128;
};

// From config.json (the whole object). InvalidArgument for a malformed weight_block_size.
StatusOr<Fp8CheckpointFormat> Fp8CheckpointFormatFromConfig(const nlohmann::json& config);

// Whether `path` is an HF folder whose config.json names a pre-quantised FP8 checkpoint
// (Fp8CheckpointFormatFromConfig's pre_quantized). Reads config.json only (false for anything it cannot read).
bool IsFp8CheckpointFolder(const std::string& path);

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

// A weight's scales, checked: the layout its shape has and its values as fp32 (1, rows, or blocks_rows x
// block_cols of them). InvalidArgument naming the tensors for a scale whose shape fits no layout, a scale
// that is negative or not finite, a scale dtype other than F32 / BF16 / F16, a weight that is not 2-D F8_E4M3.
struct Fp8Scales {
  Fp8ScaleLayout layout = Fp8ScaleLayout::kPerTensor;
  std::vector<float> values;
  int64_t block_rows = 0, block_cols = 0, blocks_per_row = 0;  // kPerBlock
  float at(int64_t r, int64_t c) const {
    return layout == Fp8ScaleLayout::kPerTensor    ? values[0]
           : layout == Fp8ScaleLayout::kPerChannel ? values[r]
                                                   : values[(r / block_rows) * blocks_per_row + c / block_cols];
  }
};
StatusOr<Fp8Scales> ReadFp8Scales(const TensorRef& weight, const TensorRef& scale,
                                  const Fp8CheckpointFormat& format);

// InvalidArgument naming the row and column of the first E4M3 NaN code (0x7f / 0xff) in `weight`.
Status CheckFp8Codes(const TensorRef& weight, ThreadPool& pool);

// Dequantises `weight` (F8_E4M3, [rows, cols]) with `scale` into out[rows * cols] fp32, on `pool`, and says
// which layout the scale's shape has: ReadFp8Scales' and CheckFp8Codes' errors.
StatusOr<Fp8ScaleLayout> DequantizeFp8Weight(const TensorRef& weight, const TensorRef& scale,
                                             const Fp8CheckpointFormat& format, ThreadPool& pool, float* out);

// The fp32 values of `rows` x `cols` E4M3 codes with one scale per row, into out (the CPU form of a matrix
// LoadLlamaWeights kept as codes: LinearWeight::row_scale).
void DequantizeFp8Rows(const uint8_t* codes, const float* row_scale, int64_t rows, int64_t cols, ThreadPool& pool,
                       float* out);

}  // namespace stoke
