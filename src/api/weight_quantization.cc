#include "api/weight_quantization.h"

namespace stoke {

StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name) {
  if (name == "none") return WeightQuantization::kNone;
  if (name == "fp8") return WeightQuantization::kFp8;
  if (name == "int8") return WeightQuantization::kInt8;
  return InvalidArgumentError("--quantization '{}': expected none, fp8 or int8", name);
}

std::string_view WeightQuantizationName(WeightQuantization q) {
  switch (q) {
    case WeightQuantization::kNone:
      return "none";
    case WeightQuantization::kFp8:
      return "fp8";
    case WeightQuantization::kInt8:
      return "int8";
  }
  return "?";
}

}  // namespace stoke
