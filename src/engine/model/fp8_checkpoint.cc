#include "engine/model/fp8_checkpoint.h"

#include <array>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
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
  f.pre_quantized = f.method == "fp8" || f.method == "fbgemm_fp8" ||
                    (f.method == "compressed-tensors" && q.value("format", nlohmann::json()) == "float-quantized");
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

bool IsFp8CheckpointFolder(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  std::ifstream in(std::filesystem::path(path) / "config.json");
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const StatusOr<Fp8CheckpointFormat> f = Fp8CheckpointFormatFromConfig(j);
  return f.ok() && f->pre_quantized;
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

StatusOr<Fp8Scales> ReadFp8Scales(const TensorRef& weight, const TensorRef& scale,
                                  const Fp8CheckpointFormat& format) {
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
  Fp8Scales out;
  out.block_rows = format.block_rows;
  out.block_cols = format.block_cols;
  const int64_t brows = (rows + format.block_rows - 1) / format.block_rows;
  out.blocks_per_row = (cols + format.block_cols - 1) / format.block_cols;
  if (n == 1) {
    out.layout = Fp8ScaleLayout::kPerTensor;
  } else if (n == rows && (s.size() == 1 || (s.size() == 2 && s[1] == 1))) {
    out.layout = Fp8ScaleLayout::kPerChannel;
  } else if (s.size() == 2 && s[0] == brows && s[1] == out.blocks_per_row) {
    out.layout = Fp8ScaleLayout::kPerBlock;
  } else {
    return InvalidArgumentError(
        "{} has shape {}: the scale of {} {} must be [] or [1] (per tensor), [{}] or [{}, 1] (per output "
        "channel) or [{}, {}] (per block of {} x {}, quantization_config.weight_block_size)",
        scale.name, scale.ShapeString(), weight.name, weight.ShapeString(), rows, rows, brows,
        out.blocks_per_row, format.block_rows, format.block_cols);
  }
  out.values.resize(n);
  RETURN_IF_ERROR(cpu::DequantizeRow(scale.dtype, scale.data, out.values.data(), n));
  // The largest E4M3 code is 448: a scale whose product with it overflows would dequantise finite codes to
  // infinity.
  for (int64_t i = 0; i < n; ++i) {
    const float v = out.values[i];
    if (!std::isfinite(v) || v < 0.0f || !std::isfinite(v * 448.0f)) {
      return InvalidArgumentError(
          "{}[{}] is {}: a scale must be finite, >= 0 and small enough that 448 x scale fits in a "
          "float (the scale of {})",
          scale.name, i, v, weight.name);
    }
  }
  return out;
}

Status CheckFp8Codes(const TensorRef& weight, ThreadPool& pool) {
  const int64_t n = weight.numel(), cols = weight.cols();
  const uint8_t* q = weight.data;
  std::atomic<int64_t> nan_at{n};
  pool.ParallelFor(n, int64_t{1} << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if ((q[i] & 0x7f) == 0x7f) {
        int64_t cur = nan_at.load();
        while (i < cur && !nan_at.compare_exchange_weak(cur, i)) {
        }
        return;
      }
    }
  });
  if (const int64_t at = nan_at.load(); at < n) {
    return InvalidArgumentError(
        "{}: row {} column {} holds an E4M3 NaN code (0x{:02x}); an FP8 weight must be finite", weight.name,
        at / cols, at % cols, q[at]);
  }
  return OkStatus();
}

StatusOr<Fp8ScaleLayout> DequantizeFp8Weight(const TensorRef& weight, const TensorRef& scale,
                                             const Fp8CheckpointFormat& format, ThreadPool& pool, float* out) {
  ASSIGN_OR_RETURN(const Fp8Scales scales, ReadFp8Scales(weight, scale, format));
  RETURN_IF_ERROR(CheckFp8Codes(weight, pool));
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const std::array<float, 256>& table = cpu::Fp8E4M3Table();
  const uint8_t* q = weight.data;
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = table[q[r * cols + c]] * scales.at(r, c);
    }
  });
  return scales.layout;
}

void DequantizeFp8Rows(const uint8_t* codes, const float* row_scale, int64_t rows, int64_t cols, ThreadPool& pool,
                       float* out) {
  const std::array<float, 256>& table = cpu::Fp8E4M3Table();
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = table[codes[r * cols + c]] * row_scale[r];
    }
  });
}

}  // namespace stoke
