// The weights of a Llama-family decoder as the CPU model uses them, loaded from a GGUF file or an HF folder.
// Matrices stay in their file dtype (F32/F16/BF16/GGML quants) and are used in place where possible; Q/K of
// GGUF Llama files are un-permuted at load (model-formats.md §3) so one NeoX RoPE serves both formats, and
// Q/K/V and gate/up are concatenated into one matrix each when their dtypes agree, so a step runs one
// matmul per group.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "api/weight_quantization.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/llama_config.h"

namespace stoke {

class GgufFile;
class HfFolder;

// A row-major matrix [rows, cols] (PyTorch Linear layout [out, in]); quantised rows are GGML blocks.
struct LinearWeight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  // kF8E4M3 only (a pre-quantised FP8 checkpoint's projection, kept as its codes): W[r, :] = e4m3(data[r, :]) ·
  // row_scale[r]. Owned by the LlamaWeights. CpuLlama::Create widens such matrices to F32; CudaLlama uploads
  // the codes and scales as they are.
  const float* row_scale = nullptr;
  bool empty() const { return data == nullptr; }
};

struct LlamaLayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  // Either `qkv` ([(heads + 2 kv_heads) * head_dim, hidden]: Q rows, then K, then V) or q, k, v apart.
  LinearWeight qkv;
  LinearWeight q, k, v;         // [heads * hd, hidden], [kv * hd, hidden] x2; Q/K rows in HF half-split order
  std::vector<float> qkv_bias;  // empty or [(heads + 2 kv_heads) * head_dim], same order as qkv
  LinearWeight o;               // [hidden, heads * hd]
  std::vector<float> ffn_norm;  // [hidden]
  LinearWeight gate_up;         // [2 * ffn, hidden]: gate rows then up rows, or empty and gate/up apart
  LinearWeight gate, up;        // [ffn, hidden]
  LinearWeight down;            // [hidden, ffn]
};

struct LlamaWeights {
  LlamaConfig config;
  LinearWeight embedding;  // [vocab, hidden]
  std::vector<float> final_norm;
  LinearWeight lm_head;  // [vocab, hidden]; the embedding when tied
  std::vector<LlamaLayerWeights> layers;
  // Loaded from a GGUF file; and whether its Q/K rows were un-permuted (llama.cpp keeps them in the file's
  // adjacent-pair order, which its attention sums in: the CPU model's ggml-compatible numerics need it).
  bool from_gguf = false;
  bool gguf_qk_interleaved = false;
  // kFp8 once QuantizeLlamaWeightsFp8 (engine/model/weight_quant.h) has rounded the projections and lm_head
  // (CPU only: the CUDA engine quantises its own copies on the device), or when the file is a pre-quantised
  // FP8 checkpoint (below).
  WeightQuantization quantization = WeightQuantization::kNone;
  // A pre-quantised FP8 checkpoint (engine/model/fp8_checkpoint.h): its F8_E4M3 matrices, counted by the
  // layout of their scales (index: Fp8ScaleLayout). Projections with per-tensor or per-channel scales stay
  // codes with a scale per row (LinearWeight::row_scale); per-block ones, and an F8 embedding or lm_head, are
  // dequantised at load into F32. All zero for any other file.
  struct Fp8Checkpoint {
    std::string method;                      // quantization_config.quant_method, "" when absent
    std::array<int, 3> matrices = {0, 0, 0};  // per-tensor, per-channel, per-block
    int total() const { return matrices[0] + matrices[1] + matrices[2]; }
  } fp8_checkpoint;
  // Buffers the LinearWeights above may point into, and the mapped file(s) the others point into.
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  std::shared_ptr<const void> source;
};

// Loads weights from a GGUF file (blk.N.* names) / an HF folder (model.layers.N.* names). Missing or
// mis-shaped tensors give an error naming the tensor and the file.
StatusOr<LlamaWeights> LoadLlamaWeights(std::shared_ptr<const GgufFile> gguf);
StatusOr<LlamaWeights> LoadLlamaWeights(std::shared_ptr<const HfFolder> folder);

// Replaces every F8_E4M3 matrix kept as codes with row scales (a pre-quantised FP8 checkpoint's projections)
// by its fp32 values, in buffers `w` owns: the form CpuLlama multiplies. A no-op for any other weights.
Status WidenFp8Matrices(LlamaWeights* w, ThreadPool& pool);

// Row r of a GGUF Llama Q/K matrix holding `num_heads` heads of `head_dim` rows: the file row that holds
// HF row r. Within a head, HF row j * hd/2 + i is file row 2i + j (llama.cpp's converter permutation).
int64_t GgufQkSourceRow(int64_t hf_row, int head_dim);

// Concatenates the rows of `parts` (same dtype and cols) into one owned matrix; `row_map`, when given for a
// part, picks its source rows (row_map(r) = source row of output row r). Used for QKV / gate-up fusion.
struct RowSource {
  LinearWeight w;
  bool unpermute_qk = false;  // apply GgufQkSourceRow within each head of `head_dim` rows
  int head_dim = 0;
};
StatusOr<LinearWeight> ConcatRows(const std::vector<RowSource>& parts, LlamaWeights* owner);

}  // namespace stoke
