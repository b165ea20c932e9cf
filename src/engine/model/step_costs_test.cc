#include "engine/model/step_costs.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/model/llama_test_util.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using testing::TinyLlama;

std::string EncodeQ4_1(const float* x, int64_t n) {
  std::string bytes(n / 32 * sizeof(cpu::BlockQ4_1), '\0');
  cpu::QuantizeRowQ4_1(x, bytes.data(), n);
  return bytes;
}
std::string EncodeQ5_0(const float* x, int64_t n) {
  std::string bytes(n / 32 * sizeof(cpu::BlockQ5_0), '\0');
  cpu::QuantizeRowQ5_0(x, bytes.data(), n);
  return bytes;
}

TEST(StepCostsTest, CudaDecodeReadsGemvBlockTypesAsStoredAndTheRestAsBf16) {
  for (DType t : {DType::kQ8_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K}) {
    EXPECT_TRUE(CudaGemvReadsBlocks(t));
  }
  for (DType t : {DType::kQ4_0, DType::kQ5_0, DType::kQ5_1, DType::kF32, DType::kBF16}) {
    EXPECT_FALSE(CudaGemvReadsBlocks(t));
  }
  // A GGUF file in Q4_1 (20 bytes per 32 values) with its ffn_down matrices in Q5_0 (22 bytes per 32), which
  // the CUDA decoder converts to bf16 at load.
  TinyLlama m(61);
  const fs::path dir = fs::path(::testing::TempDir()) / "stoke_step_costs_mixed";
  fs::create_directories(dir);
  const fs::path path = dir / "m.gguf";
  m.WriteGguf(path, /*Q4_1=*/3, &EncodeQ4_1, {{"ffn_down.weight", /*Q5_0=*/6, &EncodeQ5_0}});
  double params = 0, q4 = 0, q5 = 0;
  for (const auto& [name, shape] : m.shapes) {
    if (shape.size() != 2) continue;
    const double n = static_cast<double>(shape[0] * shape[1]);
    params += n;
    (name.find("down_proj") != std::string::npos ? q5 : q4) += n;
  }
  ASSERT_GT(q5, 0);
  auto stored = FileBytesPerParam(path.string());
  auto cuda = FileBytesPerParam(path.string(), /*cuda_decode=*/true);
  ASSERT_TRUE(stored.ok() && cuda.ok()) << stored.status().ToString() << cuda.status().ToString();
  EXPECT_DOUBLE_EQ(*stored, (q4 * 20 / 32 + q5 * 22 / 32) / params);
  EXPECT_DOUBLE_EQ(*cuda, (q4 * 20 / 32 + q5 * 2) / params);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stoke
