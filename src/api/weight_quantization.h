// The precision decoder weights are stored and multiplied in (--quantization), shared by the CPU and CUDA
// engines, the consistency gate, tune and the CLI. docs/precision.md says how each is stored and why.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace stoke {

enum class WeightQuantization : uint8_t {
  kNone,  // the checkpoint's precision as the backend computes it: fp32 on the CPU, bf16 on CUDA
  // fp8 E4M3 weights with one fp32 scale per output channel (row of W): scale = amax / 448,
  // q = e4m3_rne_satfinite(w / scale). CUDA: decode GEMV reads the fp8 bytes (activations bf16); larger
  // steps quantise activations per token on the fly and run cuBLASLt FP8 GEMMs. CPU: the weights are
  // quantised and dequantised at load (the same values, computed in fp32), to test the gate's logic.
  kFp8,
};

// "none", "fp8"; "int8" is Unimplemented (named, not built); anything else InvalidArgument naming the value.
StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name);
std::string_view WeightQuantizationName(WeightQuantization q);

}  // namespace stoke
