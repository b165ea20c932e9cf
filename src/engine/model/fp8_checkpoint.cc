#include "engine/model/fp8_checkpoint.h"

#include <array>
#include <atomic>
#include <cmath>
#include <vector>

#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/quants.h"

namespace stoke {

StatusOr<Fp8CheckpointFormat> Fp8CheckpointFormatFromConfig(const nlohmann::json& config) {
  Fp8CheckpointFormat f;
  if (!config.is_object() || !config.contains("quantization_config")) return f;
  const nlohmann::json& q = config["quantization_config"];
  if (!q.is_object()) return InvalidArgumentError("config.json: quantization_config is not an object");
  if (q.contains("quant_method") && q["quant_method"].is_string()) f.method = q["quant_method"];
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const nlohmann::json& b = q["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() <= 0 || b[1].get<int64_t>() <= 0) {
      return InvalidArgumentError(
          "config.json: quantization_config.weight_block_size is {}, expected two positive integers "
          "[rows, cols]",
          b.dump());
    }
    f.block_rows = b[0].get<int64_t>();
    f.block_cols = b[1].get<int64_t>();
  }
  return f;
}

std::string_view Fp8ScaleLayoutName(Fp8ScaleLayout layout) {
  switch (layout) {
    case Fp8ScaleLayout::kPerTensor:
      return "per-tensor";
    case Fp8ScaleLayout::kPerChannel:
      return "per-channel";
    case Fp8ScaleLayout::kPerBlock:
      return "per-block";
  }
  return "?";
}

StatusOr<Fp8ScaleLayout> DequantizeFp8Weight(const TensorRef& weight, const TensorRef& scale,
                                             const Fp8CheckpointFormat& format, ThreadPool& pool, float* out) {
  if (weight.dtype != DType::kF8E4M3 || weight.shape.size() != 2) {
    return InvalidArgumentError("{}: expected a 2-D F8_E4M3 weight, got {} {}", weight.name,
                                DTypeName(weight.dtype), weight.ShapeString());
  }
  if (scale.dtype != DType::kF32 && scale.dtype != DType::kBF16 && scale.dtype != DType::kF16) {
    return InvalidArgumentError("{}: dtype {}, expected F32, BF16 or F16 (the scale of {})", scale.name,
                                DTypeName(scale.dtype), weight.name);
  }
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const int64_t n = scale.numel();
  const auto& s = scale.shape;
  const int64_t brows = (rows + format.block_rows - 1) / format.block_rows;
  const int64_t bcols = (cols + format.block_cols - 1) / format.block_cols;
  Fp8ScaleLayout layout;
  if (n == 1) {
    layout = Fp8ScaleLayout::kPerTensor;
  } else if (n == rows && (s.size() == 1 || (s.size() == 2 && s[1] == 1))) {
    layout = Fp8ScaleLayout::kPerChannel;
  } else if (s.size() == 2 && s[0] == brows && s[1] == bcols) {
    layout = Fp8ScaleLayout::kPerBlock;
  } else {
    return InvalidArgumentError(
        "{} has shape {}: the scale of {} {} must be [] or [1] (per tensor), [{}] or [{}, 1] (per output "
        "channel) or [{}, {}] (per block of {} x {}, quantization_config.weight_block_size)",
        scale.name, scale.ShapeString(), weight.name, weight.ShapeString(), rows, rows, brows, bcols,
        format.block_rows, format.block_cols);
  }
  std::vector<float> scales(n);
  RETURN_IF_ERROR(cpu::DequantizeRow(scale.dtype, scale.data, scales.data(), n));
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(scales[i]) || scales[i] < 0.0f) {
      return InvalidArgumentError("{}[{}] is {}: a scale must be finite and >= 0 (the scale of {})",
                                  scale.name, i, scales[i], weight.name);
    }
  }
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = cpu::Fp8E4M3ToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  const uint8_t* q = weight.data;
  std::atomic<int64_t> nan_at{-1};
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* qr = q + r * cols;
      float* o = out + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        if ((qr[c] & 0x7f) == 0x7f) {
          int64_t expected = -1;
          nan_at.compare_exchange_strong(expected, r * cols + c);
          return;
        }
        const float sc = layout == Fp8ScaleLayout::kPerTensor    ? scales[0]
                         : layout == Fp8ScaleLayout::kPerChannel ? scales[r]
                                                                 : scales[(r / format.block_rows) * bcols +
                                                                          c / format.block_cols];
        o[c] = kTable[qr[c]] * sc;
      }
    }
  });
  if (const int64_t at = nan_at.load(); at >= 0) {
    return InvalidArgumentError("{}: row {} column {} holds an E4M3 NaN code (0x{:02x}); an FP8 weight must be finite",
                                weight.name, at / cols, at % cols, q[at]);
  }
  return layout;
}

}  // namespace stoke
