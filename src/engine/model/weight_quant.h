// --quantization fp8 on the CPU: the decoder's projection matrices rounded to fp8 E4M3 at load, with one fp32
// scale per output channel (row of W), and held dequantised as fp32, so CpuLlama multiplies exactly the
// values the CUDA engine's fp8 weights stand for. It costs memory (fp32) rather than saving it: the CPU form
// exists to run the output-consistency gate and to check the arithmetic (docs/precision.md).
//
// Per row r of W [rows, cols] (PyTorch Linear layout [out, in]), as cpu::QuantizeKvRow's fp8 branch:
//   amax = max |W[r, :]|;  scale = amax / 448;  q = e4m3_rne_satfinite(W[r, :] · (448 / amax))
//   W'[r, :] = e4m3(q) · scale   (fp32; an all-zero row stays zero)
// Rows of GGUF quantised types (Q4_1, Q8_0, ...), F16 and BF16 are first widened with cpu::DequantizeRow.
#pragma once

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/llama_weights.h"

namespace stoke {

struct Fp8WeightOptions {
  ThreadPool* pool = nullptr;  // null = ThreadPool::Default()
  // Tests only (no flag reaches it): every dequantised row is multiplied by scale · this. A value other than
  // 1 is a deliberately broken quantiser, which the consistency gate must reject.
  float testing_scale_multiplier = 1.0f;
  // The lm_head too (off: it keeps the checkpoint's precision, as the FP8 checkpoints of vLLM / TensorRT-LLM
  // keep it in bf16). Measured on SmolLM2-135M (docs/precision.md): the fp8 layers alone pass the gate, the
  // fp8 lm_head alone passes, both together fail it. No flag reaches it; tests turn it on.
  bool quantize_lm_head = false;
};

// The fp8 round trip above of one [rows, cols] matrix of `dtype` at `data` (rows of RowBytes(dtype, cols)
// bytes: F32, F16, BF16 or a GGUF quantised type) into `out` [rows, cols] fp32, on `pool`; every dequantised
// row is multiplied by its scale · scale_multiplier (1 but in tests). The row quantiser of the decoder's
// weights (below) and of the BERT encoder's (BertEncoder::QuantizeWeightsFp8).
// InvalidArgument for a type cpu::DequantizeRow cannot widen.
Status RoundTripFp8Rows(DType dtype, const void* data, int64_t rows, int64_t cols, float scale_multiplier,
                        ThreadPool& pool, float* out);

// Replaces q/k/v (or the fused qkv), o, gate/up (or gate_up), down of every layer (and the lm_head with
// quantize_lm_head) with F32 matrices holding their fp8 round trip, in buffers `w` owns (buffers only the old
// matrices used are freed). The embedding is left as it is: a tied lm_head gets its own quantised copy.
// Sets w->quantization = kFp8.
// FailedPrecondition when `w` is already quantised; InvalidArgument for a weight type it cannot widen.
Status QuantizeLlamaWeightsFp8(LlamaWeights* w, const Fp8WeightOptions& options = {});

}  // namespace stoke
