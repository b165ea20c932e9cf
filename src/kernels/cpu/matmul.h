// Y = X · W^T on the CPU for every weight type a model file can hold: the reference for the GPU GEMMs and
// the CPU backend's compute.
#pragma once

#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"
#include "base/thread_pool.h"

namespace stoke::cpu {

// Y[m, n] = X[m, k] · W^T, W = [n, k] row-major (PyTorch Linear layout: one row of k values per output
// feature). W may be F32, F16, BF16 or GGML-quantised (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K); quantised
// rows are GGML blocks along k, so k must be a multiple of the block size (32, or 256 for K-quants), and
// row r starts at byte r * RowBytes(wt, k). X and Y are fp32, row-major, dense (row stride k and n).
// Y must not alias X. Y is overwritten (not accumulated).
// Quantised paths quantise each X row once per call to 8-bit blocks (as llama.cpp does), so results differ
// from dequantised-W · X by the activation quantisation error (~1e-3 relative). Never dequantises the whole
// W. Work is split over output features n (and tiles of X rows for m > 1) on `pool`. Errors: InvalidArgument
// for an unsupported dtype, k not a multiple of the block size, or m/k/n < 0.
Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool);

// Same, on ThreadPool::Default().
inline Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y) {
  return MatMul(x, m, k, w, wt, n, y, ThreadPool::Default());
}

}  // namespace stoke::cpu
