// The CUDA roofline probe for `stoke bench step`: D2D copy bandwidth (cudaMemcpyAsync of 1 GiB, read + write
// counted, as cuda_bench does) and bf16 GEMM rates through the same BlasLtGemm the engine uses (tuned first).
// Passed to RunStepBench through StepBenchOptions::roofline (apps/stoke/backends/cuda.cc).
#include "tools/stepbench/cuda/roofline_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "tools/stepbench/stepbench.h"

namespace stoke::stepbench {
namespace {

// Frees device pointers and destroys the stream/events on every exit path.
struct Scope {
  std::vector<void*> ptrs;
  cudaStream_t stream = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  ~Scope() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (void* p : ptrs) cudaFree(p);
    if (a != nullptr) cudaEventDestroy(a);
    if (b != nullptr) cudaEventDestroy(b);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  StatusOr<void*> Alloc(size_t bytes) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return cuda::CudaError(__FILE__, __LINE__, "cudaMalloc", e);
    ptrs.push_back(p);
    return p;
  }
};

// Mean ms per call over `iters` calls after 2 warm-ups, timed with events on the stream.
template <typename Fn>
StatusOr<double> TimeMs(Scope& sc, int iters, Fn fn) {
  for (int i = 0; i < 2; ++i) RETURN_IF_ERROR(fn());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(sc.a, sc.stream));
  for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(fn());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(sc.b, sc.stream));
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(sc.b));
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, sc.a, sc.b));
  return static_cast<double>(ms) / iters;
}

StatusOr<DeviceRoofline> MeasureCuda(int gpu, const std::vector<GemmShape>& shapes,
                                     const std::string& gemm_cache_path) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, gpu));
  DeviceRoofline r;
  r.device = prop.name;
  {
    Scope sc;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&sc.stream, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&sc.a));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&sc.b));
    const size_t bytes = size_t{1} << 30;
    ASSIGN_OR_RETURN(void* src, sc.Alloc(bytes));
    ASSIGN_OR_RETURN(void* dst, sc.Alloc(bytes));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src, 1, bytes, sc.stream));
    ASSIGN_OR_RETURN(
        double ms, TimeMs(sc, 10, [&]() -> Status {
          CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, sc.stream));
          return OkStatus();
        }));
    r.copy_bytes = static_cast<int64_t>(bytes);
    r.copy_ms = ms;
    r.d2d_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
  }
  cuda::GemmOptions opt;
  opt.cache_path = gemm_cache_path;
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::BlasLtGemm> gemm, cuda::BlasLtGemm::Create(opt));
  for (const GemmShape& sh : shapes) {
    if (sh.m <= 0 || sh.n <= 0 || sh.k <= 0 || sh.n % 8 != 0 || sh.k % 8 != 0) {
      return InvalidArgumentError("roofline probe: GEMM {} m={} n={} k={} (n, k must be multiples of 8)",
                                  sh.name, sh.m, sh.n, sh.k);
    }
    Scope sc;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&sc.stream, cudaStreamNonBlocking));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&sc.a));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&sc.b));
    ASSIGN_OR_RETURN(void* x, sc.Alloc(static_cast<size_t>(sh.m * sh.k) * 2));
    ASSIGN_OR_RETURN(void* w, sc.Alloc(static_cast<size_t>(sh.n * sh.k) * 2));
    ASSIGN_OR_RETURN(void* y, sc.Alloc(static_cast<size_t>(sh.m * sh.n) * 2));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(x, 0x3c, static_cast<size_t>(sh.m * sh.k) * 2, sc.stream));  // ~0.011
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(w, 0x3c, static_cast<size_t>(sh.n * sh.k) * 2, sc.stream));
    auto* xb = static_cast<const __nv_bfloat16*>(x);
    auto* wb = static_cast<const __nv_bfloat16*>(w);
    RETURN_IF_ERROR(gemm->Tune(xb, wb, y, DType::kBF16, sh.m, sh.n, sh.k, sc.stream));
    const double flop = 2.0 * sh.m * sh.n * sh.k;
    const int iters = flop > 1e12 ? 10 : 30;
    ASSIGN_OR_RETURN(double ms, TimeMs(sc, iters, [&]() -> Status {
                       return gemm->Run(xb, wb, y, DType::kBF16, sh.m, sh.n, sh.k, sc.stream);
                     }));
    r.gemms.push_back({sh, ms, flop / (ms * 1e-3) / 1e12});
  }
  (void)gemm->Save();
  return r;
}

}  // namespace

RooflineProbe CudaRooflineProbe() {
  return &MeasureCuda;
}
}  // namespace stoke::stepbench
