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
  // Encoders only: int8 weights with one fp32 scale per output channel (scale = amax / 127,
  // q = clamp(rint(w · 127 / amax), -127, 127)), activations int8 with one static scale per GEMM input,
  // measured on calibration samples (--calibration-data); int8 x int8 -> int32 GEMMs. Decoders refuse it.
  kInt8,
};

// "none", "fp8", "int8"; anything else InvalidArgument naming the value. (Which models accept which is the
// loaders' to say: decoders refuse int8, an encoder's int8 needs calibration data.)
StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name);
std::string_view WeightQuantizationName(WeightQuantization q);

}  // namespace stoke
