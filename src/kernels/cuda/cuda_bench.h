// What the cuda_bench sections share (cuda_bench.cc: main and most sections; elementwise_bench.cc: the
// served step's small memory-bound kernels): a CUDA error check that exits, the iteration count and event
// timing. Each section prints JSON lines on stdout.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace stoke::cuda {

#define BENCH_CHECK(expr)                                                                        \
  do {                                                                                           \
    cudaError_t _e = (expr);                                                                     \
    if (_e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

inline int g_iters = 20;  // --quick: 3

// Mean milliseconds per call of fn over g_iters calls after 2 warm-ups, timed with events on `s`.
template <typename Fn>
float TimeMs(cudaStream_t s, Fn fn, int iters = 0) {
  if (iters <= 0) iters = g_iters;
  for (int i = 0; i < 2; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  for (int i = 0; i < iters; ++i) fn();
  cudaEventRecord(b, s);
  BENCH_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

// elementwise_bench.cc: SwiGLU, the fp8 activation quantiser and the RoPE + fp8 cache write, each in its
// one-value / block form against its --vector-elementwise form.
void ElementwiseBench(cudaStream_t s);

}  // namespace stoke::cuda
