#include "api/weight_quantization.h"

namespace stoke {

StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "fp8") return WeightQuantization::kFp8;
  if (name == "int8") {
    return UnimplementedError("--quantization int8: INT8 decoder weights are not implemented (use fp8)");
  }
  return InvalidArgumentError("--quantization '{}': expected none or fp8", name);
}

std::string_view WeightQuantizationName(WeightQuantization q) {
  switch (q) {
    case WeightQuantization::kNone:
      return "none";
    case WeightQuantization::kFp8:
      return "fp8";
  }
  return "?";
}

}  // namespace stoke
