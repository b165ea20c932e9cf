// fp8 E4M3 weights on the GPU (--quantization fp8): the per-row quantiser against the CPU reference
// (bit-exact), the fp8 GEMV and its SwiGLU form against the product of the dequantised weights, and the
// cuBLASLt FP8 GEMM (per-token x per-channel scales) against the product of both dequantised operands.
// Skipped when no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gpu_test_util.h"
#include "kernels/cuda/quant.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectGemvMatchesProduct;
using testing::FromBf16;
using testing::kTolBf16;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

// The CPU reference of rows x cols values (already bf16-exact): bytes, scales and the dequantised values.
struct Fp8Ref {
  std::vector<uint8_t> q;
  std::vector<float> scale, deq;
};
Fp8Ref QuantizeOnCpu(const std::vector<float>& x, int64_t rows, int64_t cols) {
  Fp8Ref r;
  r.q.resize(rows * cols);
  r.scale.resize(rows);
  r.deq.resize(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    r.scale[i] = cpu::QuantizeKvRow(x.data() + i * cols, static_cast<int>(cols), KvCacheDtype::kFp8,
                                    r.q.data() + i * cols);
    for (int64_t j = 0; j < cols; ++j) r.deq[i * cols + j] = cpu::Fp8E4M3ToFloat(r.q[i * cols + j]) * r.scale[i];
  }
  return r;
}

// Rows with very different ranges (x100 .. x0.01), one all-zero row: per-row scales must follow each row.
std::vector<float> RaggedRows(int64_t rows, int64_t cols, uint32_t seed) {
  auto v = RandomFloats(rows * cols, seed);
  for (int64_t i = 0; i < rows; ++i) {
    const float f = i == 3 ? 0.f : (i % 5 == 0 ? 100.f : (i % 5 == 1 ? 0.01f : 1.f));
    for (int64_t j = 0; j < cols; ++j) v[i * cols + j] *= f;
  }
  return RoundBf16(v);
}

TEST(CudaFp8, QuantizeRowsIsBitExactWithTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 37, cols = 4112, ldx = 4128;
  const auto x = RaggedRows(rows, cols, 41);
  std::vector<float> padded(rows * ldx, 7.f);  // the stride's padding must not count
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) padded[i * ldx + j] = x[i * cols + j];
  const Fp8Ref want = QuantizeOnCpu(x, rows, cols);
  DeviceBuffer<uint16_t> dx(ToBf16(padded));
  DeviceBuffer<uint8_t> dq(rows * cols);
  DeviceBuffer<float> ds(rows);
  STATUS_ASSERT(QuantizeRowsFp8(dx.bf16(), rows, cols, ldx, dq.get(), ds.get(), 1.f, nullptr));
  const auto q = dq.Download();
  const auto s = ds.Download();
  int64_t bad_q = 0, bad_s = 0;
  for (int64_t i = 0; i < rows * cols; ++i) bad_q += q[i] != want.q[i];
  for (int64_t i = 0; i < rows; ++i) bad_s += s[i] != want.scale[i];
  std::printf("  [fp8 quantize] %lld rows x %lld: %lld bytes and %lld scales differ from the CPU\n",
              static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(bad_q),
              static_cast<long long>(bad_s));
  EXPECT_EQ(bad_q, 0);
  EXPECT_EQ(bad_s, 0);
  EXPECT_EQ(s[3], 0.f);  // the zero row
  // 8 values per access (--vector-elementwise): cols and ldx are multiples of 8 here, the same bytes; a
  // stride of 4125 (not a multiple of 8) takes the one-value kernel, the same bytes again.
  for (const int64_t stride : {ldx, int64_t{4125}}) {
    std::vector<float> p2(rows * stride, -3.f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) p2[i * stride + j] = x[i * cols + j];
    DeviceBuffer<uint16_t> dx2(ToBf16(p2));
    STATUS_ASSERT(QuantizeRowsFp8(dx2.bf16(), rows, cols, stride, dq.get(), ds.get(), 1.f, nullptr,
                                  /*vec8=*/true));
    EXPECT_EQ(dq.Download(), want.q) << "vec8 quantise, ldx " << stride;
    EXPECT_EQ(ds.Download(), want.scale) << "vec8 quantise, ldx " << stride;
  }

  // The broken quantiser's multiplier scales every scale; the dequantiser undoes the quantiser.
  STATUS_ASSERT(QuantizeRowsFp8(dx.bf16(), rows, cols, ldx, dq.get(), ds.get(), 1.5f, nullptr));
  const auto s15 = ds.Download();
  EXPECT_EQ(s15[0], want.scale[0] * 1.5f);
  STATUS_ASSERT(QuantizeRowsFp8(dx.bf16(), rows, cols, ldx, dq.get(), ds.get(), 1.f, nullptr));
  DeviceBuffer<uint16_t> dy(rows * cols);
  STATUS_ASSERT(DequantizeRowsFp8(dq.get(), ds.get(), rows, cols, dy.bf16(), nullptr));
  EXPECT_CLOSE(FromBf16(dy.Download()), RoundBf16(want.deq), 1e-6, "fp8 dequantize");
}

TEST(CudaFp8, GemvMatchesDequantisedProductForOneToEightRowsAndEverySplit) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1003, k = 8208, ldy = 1011;
  const auto w = RaggedRows(n, k, 51);
  const Fp8Ref ref = QuantizeOnCpu(w, n, k);
  DeviceBuffer<uint8_t> dq(ref.q);
  DeviceBuffer<float> ds(ref.scale);
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreate(&stream));
  // split 0 (what the decoder runs, with PDL here): the CUDA-core kernel's auto rule at m = 1, the tensor-core
  // kernel at m = 2, 5, 8; split 1, 2, 4 (m = 1): the CUDA-core kernel.
  ExpectGemvMatchesProduct(
      ref.deq, n, k, ldy, 52, /*pdl_split=*/0, "fp8 gemv", stream,
      [&](const __nv_bfloat16* x, int64_t m, float* yf, __nv_bfloat16* yb, bool pdl, int split) {
        Status st = Fp8Gemv(dq.get(), ds.get(), n, k, x, m, yf, ldy, pdl, stream, split);
        if (!st.ok()) return st;
        return Fp8Gemv(dq.get(), ds.get(), n, k, x, m, yb, ldy, false, stream, split);
      });
  EXPECT_FALSE(Fp8Gemv(dq.get(), ds.get(), n, 4104, nullptr, 1, static_cast<float*>(nullptr), n, false, stream).ok())
      << "k % 16 != 0 must be refused";
  EXPECT_FALSE(Fp8Gemv(dq.get(), nullptr, n, k, nullptr, 1, static_cast<float*>(nullptr), n, false, stream).ok())
      << "missing scales must be refused";
  cudaStreamDestroy(stream);
}

// The tensor-core kernel (m = 2-8) converts x to fp16: values beyond its range are clamped to +-65,504, so
// the product is that of the clamped x, finite (an inf would turn into NaN in every later token).
TEST(CudaFp8, TensorCoreGemvClampsActivationsBeyondFp16) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 48, k = 512, m = 3;
  const auto w = RaggedRows(n, k, 71);
  const Fp8Ref ref = QuantizeOnCpu(w, n, k);
  auto x = RoundBf16(RandomFloats(m * k, 72));
  x[5] = 1.0e6f;  // bf16-exact: 999,424
  x[k + 77] = -3.0e5f;
  x = RoundBf16(x);
  std::vector<float> clamped = x;
  for (float& v : clamped) v = std::min(std::max(v, -65504.f), 65504.f);
  std::vector<float> want(m * n);
  ASSERT_TRUE(cpu::MatMul(clamped.data(), m, k, ref.deq.data(), DType::kF32, n, want.data()).ok());
  DeviceBuffer<uint8_t> dq(ref.q);
  DeviceBuffer<float> ds(ref.scale);
  DeviceBuffer<uint16_t> dx(ToBf16(x));
  DeviceBuffer<float> dy(m * n);
  STATUS_ASSERT(Fp8Gemv(dq.get(), ds.get(), n, k, dx.bf16(), m, dy.get(), n, false, nullptr, /*split=*/0));
  const auto got = dy.Download();
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  EXPECT_CLOSE(got, want, 1e-3, "fp8 tensor-core gemv, clamped x");
}

TEST(CudaFp8, SiluMulGemvMatchesDequantisedProduct) {
  SKIP_WITHOUT_GPU();
  const int64_t inter = 520, k = 1040;
  const auto w = RaggedRows(2 * inter, k, 61);
  const Fp8Ref ref = QuantizeOnCpu(w, 2 * inter, k);
  DeviceBuffer<uint8_t> dq(ref.q);
  DeviceBuffer<float> ds(ref.scale);
  for (int64_t m : {1, 3, 8}) {
    const auto x = RoundBf16(RandomFloats(m * k, 62));
    std::vector<float> gu(m * 2 * inter), want(m * inter);
    ASSERT_TRUE(cpu::MatMul(x.data(), m, k, ref.deq.data(), DType::kF32, 2 * inter, gu.data()).ok());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < inter; ++c) {
        const float g = Bf16ToFp32(Fp32ToBf16(gu[r * 2 * inter + c]));
        const float u = Bf16ToFp32(Fp32ToBf16(gu[r * 2 * inter + inter + c]));
        want[r * inter + c] = g / (1.f + std::exp(-g)) * u;
      }
    }
    DeviceBuffer<uint16_t> dx(ToBf16(x)), dy(m * inter);
    // split 0 (with PDL): the tensor-core kernel at m = 3 and 8, the CUDA-core one at m = 1; split 1: CUDA-core.
    for (int split : {0, 1}) {
      STATUS_ASSERT(
          Fp8GemvSiluMul(dq.get(), ds.get(), inter, k, dx.bf16(), m, dy.bf16(), split == 0, nullptr, split));
      EXPECT_CLOSE(FromBf16(dy.Download()), want, kTolBf16,
                   ("fp8 gemv silu*up m=" + std::to_string(m) + " split=" + std::to_string(split)).c_str());
    }
  }
}

TEST(CudaFp8, GemmWithPerTokenAndPerChannelScalesMatchesDequantisedProduct) {
  SKIP_WITHOUT_GPU();
  auto gemm = BlasLtGemm::Create(GemmOptions{});
  ASSERT_TRUE(gemm.ok()) << gemm.status().ToString();
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 1024, 4096}, {37, 512, 272}, {256, 2048, 1024}}) {
    const auto x = RaggedRows(m, k, 71), w = RaggedRows(n, k, 72);
    const Fp8Ref rx = QuantizeOnCpu(x, m, k), rw = QuantizeOnCpu(w, n, k);
    std::vector<float> want(m * n);
    ASSERT_TRUE(cpu::MatMul(rx.deq.data(), m, k, rw.deq.data(), DType::kF32, n, want.data()).ok());
    // The activations are quantised on the device, as the decoder does every step.
    DeviceBuffer<uint16_t> dx(ToBf16(x));
    DeviceBuffer<uint8_t> dxq(m * k), dwq(rw.q);
    DeviceBuffer<float> dxs(m), dws(rw.scale), yf(m * n);
    DeviceBuffer<uint16_t> yb(m * n);
    STATUS_ASSERT(QuantizeRowsFp8(dx.bf16(), m, k, k, dxq.get(), dxs.get(), 1.f, nullptr));
    STATUS_ASSERT((*gemm)->RunFp8(dxq.get(), dxs.get(), dwq.get(), dws.get(), yb.get(), DType::kBF16, m, n, k, nullptr));
    STATUS_ASSERT((*gemm)->RunFp8(dxq.get(), dxs.get(), dwq.get(), dws.get(), yf.get(), DType::kF32, m, n, k, nullptr));
    const std::string what = "fp8 gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    // Hopper's FP8 tensor cores accumulate with fewer than fp32's mantissa bits between cuBLASLt's fp32
    // promotions: measured rel_l2 1.1e-4 to 1.2e-4 against the exact product of the dequantised operands.
    EXPECT_CLOSE(yf.Download(), want, 1e-3, (what + " -> f32").c_str());
    EXPECT_CLOSE(FromBf16(yb.Download()), want, kTolBf16, (what + " -> bf16").c_str());
  }
}

}  // namespace
}  // namespace stoke::cuda
