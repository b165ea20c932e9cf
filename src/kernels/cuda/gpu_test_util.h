// Helpers for the GPU-vs-CPU tests: device buffers poisoned with NaN, random inputs, bf16 rounding and the
// rel-L2 / max-abs comparison that every test reports. Tests call SKIP_WITHOUT_GPU() first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "base/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/device.h"

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (::stoke::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)

#define CUDA_ASSERT(expr)                                                  \
  do {                                                                     \
    const cudaError_t _e = (expr);                                         \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)
#define STATUS_ASSERT(expr)                  \
  do {                                       \
    const ::stoke::Status _st = (expr);      \
    ASSERT_TRUE(_st.ok()) << _st.ToString(); \
  } while (0)

namespace stoke::cuda::testing {

// A device array of n T's, filled with 0xFF bytes on creation: NaN for fp32 and bf16, -1 for integers, so an
// element the kernel forgot to write shows up.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ != nullptr) cudaMemset(ptr_, 0xFF, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Upload(const std::vector<T>& host) {
    cudaMemcpy(ptr_, host.data(), std::min(host.size(), n_) * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  T* get() const { return ptr_; }
  // The same memory seen as CUDA's bf16 (host vectors of bf16 are uint16_t bits).
  __nv_bfloat16* bf16() const { return reinterpret_cast<__nv_bfloat16*>(ptr_); }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Fp32ToBf16(v[i]);
  return o;
}
inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToFp32(v[i]);
  return o;
}
// v rounded to bf16 and back: the exact values a bf16 kernel sees.
inline std::vector<float> RoundBf16(const std::vector<float>& v) {
  return FromBf16(ToBf16(v));
}

struct Diff {
  double rel_l2 = 0;   // ||got - want|| / ||want||
  double max_abs = 0;  // max |got - want|
  size_t nan = 0;      // NaN in got (unwritten or broken)
};
inline Diff Compare(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (std::isnan(got[i])) {
      ++d.nan;
      continue;
    }
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

// Asserts rel-L2 < tol and no NaN, printing both figures either way (the log is the GPU run's record).
#define EXPECT_CLOSE(got, want, tol, what)                                                        \
  do {                                                                                            \
    const auto _d = ::stoke::cuda::testing::Compare((got), (want));                               \
    std::printf("  [%s] rel_l2=%.3e max_abs=%.3e nan=%zu (tol %.0e, n=%zu)\n", (what), _d.rel_l2, \
                _d.max_abs, _d.nan, static_cast<double>(tol), (want).size());                     \
    EXPECT_EQ(_d.nan, 0u) << (what) << ": NaN in output (unwritten elements?)";                   \
    EXPECT_LT(_d.rel_l2, (tol)) << (what) << ": max abs diff " << _d.max_abs;                     \
    EXPECT_EQ((got).size(), (want).size());                                                       \
  } while (0)

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;

// A decode GEMV of quantised weights against the product with the values they stand for (`w_deq`, [n, k]):
// m = 1, 2, 5, 8 rows of x (seeded seed + m), every warps-per-row choice at m = 1 (PDL on at `pdl_split`),
// fp32 and bf16 outputs of row stride ldy (the padding past n must not matter).
//   launch(x, m, y_f32, y_bf16, pdl, split) -> Status launches both outputs on `stream`.
template <typename Launch>
void ExpectGemvMatchesProduct(const std::vector<float>& w_deq, int64_t n, int64_t k, int64_t ldy, uint32_t seed,
                              int pdl_split, const std::string& name, cudaStream_t stream, Launch launch) {
  for (int64_t m : {1, 2, 5, 8}) {
    const auto x = RoundBf16(RandomFloats(m * k, seed + static_cast<uint32_t>(m)));
    std::vector<float> want(m * n);
    ASSERT_TRUE(cpu::MatMul(x.data(), m, k, w_deq.data(), DType::kF32, n, want.data()).ok());
    DeviceBuffer<uint16_t> dx(ToBf16(x));
    for (int split : m == 1 ? std::vector<int>{0, 1, 2, 4} : std::vector<int>{0}) {
      DeviceBuffer<float> yf(m * ldy);
      DeviceBuffer<uint16_t> yb(m * ldy);
      STATUS_ASSERT(launch(dx.bf16(), m, yf.get(), yb.bf16(), split == pdl_split, split));
      CUDA_ASSERT(cudaStreamSynchronize(stream));
      const auto gf = yf.Download();
      const auto gb = FromBf16(yb.Download());
      std::vector<float> got_f(m * n), got_b(m * n);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          got_f[r * n + c] = gf[r * ldy + c];
          got_b[r * n + c] = gb[r * ldy + c];
        }
      }
      const std::string what = name + " m=" + std::to_string(m) + " split=" + std::to_string(split);
      EXPECT_CLOSE(got_f, want, 1e-5, (what + " -> f32").c_str());
      EXPECT_CLOSE(got_b, want, kTolBf16, (what + " -> bf16").c_str());
    }
  }
}

}  // namespace stoke::cuda::testing
