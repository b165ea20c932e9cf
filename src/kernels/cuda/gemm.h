// bf16 GEMM through cuBLASLt with a per-shape algorithm chosen by measurement and remembered in a file.
//
//   y[m, n] = x[m, k] · w^T        x = [m, k] bf16, w = [n, k] bf16 row-major (PyTorch Linear layout),
//                                  y = [m, n] bf16 or fp32, fp32 accumulation. Checked against cpu::MatMul.
//
// The first Run of a shape (m, n, k, output type) asks cuBLASLt's heuristic for its top `candidates`
// algorithms, times each on the caller's buffers and stream (a warm-up and `timing_iters` runs) and keeps the
// fastest. Choices are kept in a JSON file keyed by GPU name + compute capability + CUDA runtime + cuBLASLt
// versions: a file written under another key (another architecture or library) is refused and rebuilt.
// Tuning synchronises the stream, so tune (Tune) before capturing a CUDA graph.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke::cuda {

struct GemmOptions {
  std::string cache_path;              // "" = keep choices in memory only
  int candidates = 8;                  // heuristic's top-N timed per shape (1 = take the heuristic's first)
  int timing_iters = 5;                // timed runs per candidate after one warm-up
  size_t workspace_bytes = 32u << 20;  // cuBLASLt workspace (32 MiB is what Hopper kernels ask for at most)
};

// One remembered choice: the algorithm (cublasLtMatmulAlgo_t's opaque words) and its measured time.
struct GemmCacheEntry {
  std::array<uint64_t, 8> algo{};
  float micros = 0.f;
};
using GemmCacheMap = std::map<std::string, GemmCacheEntry>;  // key: GemmShapeKey

// "NVIDIA H200|sm_90|cudart=13000|cublasLt=130000": what must match for a cached algorithm to be reused.
std::string GemmCacheKey(std::string_view gpu_name, int cc_major, int cc_minor, int cudart_version,
                         size_t cublaslt_version);
// "m=1,n=4096,k=4096,out=BF16".
std::string GemmShapeKey(int64_t m, int64_t n, int64_t k, DType out);
// The cache file's text; Parse returns FailedPrecondition naming both keys when the file's key differs,
// InvalidArgument when the text is not a cache file.
std::string SerializeGemmCache(std::string_view key, const GemmCacheMap& entries);
StatusOr<GemmCacheMap> ParseGemmCache(std::string_view text, std::string_view expected_key);

// What cuBLASLt does to the product before it is written (bias = [n] bf16, one value per output column):
//   kNone      y = x · w^T
//   kBias      y = x · w^T + bias
//   kGeluBias  y = gelu_tanh(x · w^T + bias): cuBLASLt's GELU is the tanh approximation, not erf's.
enum class GemmEpilogue { kNone, kBias, kGeluBias };

class BlasLtGemm {
 public:
  // Creates the cuBLASLt handle and workspace on the current device and loads options.cache_path if it exists
  // and matches this machine (otherwise starts empty and logs why).
  static StatusOr<std::unique_ptr<BlasLtGemm>> Create(const GemmOptions& options);
  ~BlasLtGemm();
  BlasLtGemm(const BlasLtGemm&) = delete;
  BlasLtGemm& operator=(const BlasLtGemm&) = delete;

  // out_type: DType::kBF16 or DType::kF32. Pointers 16-byte aligned; k and n multiples of 8 for bf16.
  // With an epilogue, `bias` is [n] bf16, 16-byte aligned; the algorithm is chosen (and cached) per shape
  // and epilogue.
  Status Run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, DType out_type, int64_t m, int64_t n,
             int64_t k, cudaStream_t stream, GemmEpilogue epilogue = GemmEpilogue::kNone,
             const __nv_bfloat16* bias = nullptr);
  // FP8 (--quantization fp8): y[i, j] = x_scale[i] · w_scale[j] · Σ_l e4m3(x[i, l]) · e4m3(w[j, l]) with
  // x = [m, k] and w = [n, k] fp8 E4M3 bytes and their fp32 scales per row on the device (cuBLASLt's
  // outer-vector scale mode: per token x per output channel; cuBLAS 12.9+ on Hopper). fp32 accumulation,
  // out_type kBF16 or kF32; k % 16 == 0, pointers 16-byte aligned. Algorithms chosen and cached as Run's.
  Status RunFp8(const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale, void* y,
                DType out_type, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
  // INT8 (--quantization int8, encoders): acc[i, j] = Σ_l x[i, l] · w[j, l] in int32, exact (|acc| <= 127² k),
  // x = [m, k] and w = [n, k] int8 row-major, acc = [m, n] int32 (cuBLASLt CUBLAS_COMPUTE_32I, the "TN" form
  // its int8 kernels take); k and n multiples of 4, pointers 16-byte aligned. The scales are applied after
  // (DequantizeInt8Gemm, int8.h). Algorithms chosen and cached as Run's.
  Status RunInt8(const int8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t n, int64_t k,
                 cudaStream_t stream);
  // Tunes (m, n, k, out) now on the given buffers, if not already known.
  Status Tune(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, DType out_type, int64_t m, int64_t n,
              int64_t k, cudaStream_t stream);
  // Writes the cache file (no-op without cache_path).
  Status Save() const;

  const std::string& cache_key() const { return key_; }
  const GemmCacheMap& entries() const { return entries_; }
  // How the cache file was found at Create: "none", "loaded N", or "refused: ..." / "unreadable: ...".
  const std::string& load_status() const { return load_status_; }

 private:
  BlasLtGemm() = default;
  struct Descs;
  Status Choose(const Descs& d, const std::string& shape, const void* x, const void* w, void* y,
                cudaStream_t stream, cublasLtMatmulAlgo_t* algo);

  GemmOptions options_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::string key_;
  std::string load_status_ = "none";
  GemmCacheMap entries_;
};

}  // namespace stoke::cuda
