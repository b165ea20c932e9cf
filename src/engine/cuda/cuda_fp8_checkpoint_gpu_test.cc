// Pre-quantised FP8 checkpoints on CudaLlama (docs/precision.md): projections that arrive as E4M3 codes with
// one scale per row (LinearWeight::row_scale, as LoadLlamaWeights keeps a per-channel or per-tensor
// checkpoint) go to the device as they are. A per-channel checkpoint quantised from the bf16 weights by the
// CPU quantiser must run bit for bit as --quantization fp8 of those bf16 weights (the device quantiser is
// bit-exact with it); a per-tensor one must track the CPU engine on the same fp8 values. Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/cuda/cuda_llama.h"
#include "engine/cuda/cuda_llama_test_util.h"
#include "engine/model/llama.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

using namespace cuda_llama_test;  // NOLINT: the shared helpers (cuda_llama_test_util.h)

// `w`'s projections (qkv, o, gate_up, down) replaced by E4M3 codes with row scales: per channel (scale =
// row amax / 448, cpu::QuantizeKvRow) or per tensor (one amax / 448 for the matrix, repeated per row).
LlamaWeights ToFp8Codes(LlamaWeights w, bool per_tensor) {
  auto convert = [&](LinearWeight& lw) {
    if (lw.empty()) return;
    const int64_t rows = lw.rows, cols = lw.cols;
    std::vector<float> x(rows * cols);
    const size_t row_bytes = *RowBytes(lw.dtype, cols);
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(cpu::DequantizeRow(lw.dtype, static_cast<const uint8_t*>(lw.data) + r * row_bytes,
                                     x.data() + r * cols, cols)
                      .ok());
    }
    auto codes = std::make_unique<uint8_t[]>(rows * cols);
    auto scales = std::make_unique<uint8_t[]>(rows * sizeof(float));
    auto* s = reinterpret_cast<float*>(scales.get());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    for (int64_t r = 0; r < rows; ++r) {
      if (per_tensor) {
        s[r] = amax / 448.0f;
        for (int64_t c = 0; c < cols; ++c)
          codes[r * cols + c] = cpu::Fp8E4M3FromFloat(x[r * cols + c] * (448.0f / amax));
      } else {
        s[r] = cpu::QuantizeKvRow(x.data() + r * cols, static_cast<int>(cols), KvCacheDtype::kFp8,
                                  codes.get() + r * cols);
      }
    }
    lw = LinearWeight{codes.get(), DType::kF8E4M3, rows, cols, s};
    w.owned.push_back(std::move(codes));
    w.owned.push_back(std::move(scales));
  };
  ForEachProjection(w, convert);
  w.quantization = WeightQuantization::kFp8;
  return w;
}

CudaLlama::Options Fp8Options() {
  CudaLlama::Options o = TestOptions();
  o.quantization = WeightQuantization::kFp8;
  return o;
}

TEST(CudaFp8CheckpointTest, PerChannelCodesRunAsTheDevicesOwnFp8) {
  SKIP_WITHOUT_GPU();
  const TinyLlama m = MakeModel(31, /*tied=*/false, /*bias=*/true, /*layers=*/2);
  const int vocab = m.c.vocab_size;
  const Script script = MakeScript(vocab, 7);
  auto own = CudaLlama::Create(ToBf16Weights(m, true), Fp8Options());
  auto ck = CudaLlama::Create(ToFp8Codes(ToBf16Weights(m, true), /*per_tensor=*/false), Fp8Options());
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_EQ((*ck)->quantization_name(), "fp8");
  // The same device bytes: codes + a scale per row for the layers, bf16 embedding and lm_head.
  EXPECT_EQ((*ck)->weight_bytes(), (*own)->weight_bytes());
  auto want = RunScript(**own, script);
  auto got = RunScript(**ck, script);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
  // Bit for bit: the same codes and scales on the device.
  EXPECT_EQ(CompareLogits(*want, *got, vocab, &script).max_abs, 0.0)
      << "per-channel checkpoint codes vs --quantization fp8 of the same bf16 weights";
  EXPECT_GT((*ck)->graph_replays(), 0);
}

TEST(CudaFp8CheckpointTest, PerTensorCodesTrackTheCpuOnTheSameValues) {
  SKIP_WITHOUT_GPU();
  const TinyLlama m = MakeModel(32, /*tied=*/true, /*bias=*/false, /*layers=*/2);
  const int vocab = m.c.vocab_size;
  const Script script = MakeScript(vocab, 8);
  auto cpu = CpuLlama::Create(ToFp8Codes(ToBf16Weights(m, true), /*per_tensor=*/true));  // widened to fp32
  auto gpu = CudaLlama::Create(ToFp8Codes(ToBf16Weights(m, true), /*per_tensor=*/true), Fp8Options());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  auto want = RunScript(**cpu, script);
  auto got = RunScript(**gpu, script);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
  // The weights are the same fp8 values on both; the GPU adds bf16 activations (GEMV steps) and per-token fp8
  // activations (GEMM steps): the bound of CudaLlamaTest.Fp8WeightsTrackBf16.
  ExpectClose(CompareLogits(*want, *got, vocab, &script), 0.75, 0.9, "per-tensor checkpoint codes, cuda vs cpu");
}

TEST(CudaFp8CheckpointTest, CodesNeedFp8Weights) {
  SKIP_WITHOUT_GPU();
  const TinyLlama m = MakeModel(33, false, false, 2);
  auto bf16 = CudaLlama::Create(ToFp8Codes(ToBf16Weights(m, true), false), TestOptions());
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.status().message().find("need fp8 weights"), std::string::npos) << bf16.status().ToString();
}

}  // namespace
}  // namespace stoke
