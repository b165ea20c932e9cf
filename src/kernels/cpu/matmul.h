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
// row r starts at byte r * RowBytes(wt, k) (no alignment needed). X and Y are fp32, row-major, dense (row
// strides k and n). Y must not alias X. Y is overwritten (not accumulated).
//
// Paths:
//  - quantised W: each X row is quantised once per call to 8-bit blocks of 32 (as llama.cpp does), then
//    exact integer block dot products (AVX2) scaled by the block scales. Results differ from
//    dequantised-W · X by the activation quantisation error (~0.6% relative L2 for Gaussian activations).
//    Row i of Y is bit-identical whatever m, the other rows and the pool: batching never changes a value.
//  - F32: a vectorised dot per output for m == 1, OpenBLAS sgemm on column tiles otherwise.
//  - F16/BF16: converted on the fly (m == 1) or a 64-row tile at a time into fp32 scratch, then sgemm.
//    These fp paths sum in different orders for m == 1 and m > 1, so their last bits can depend on m.
// The whole W is never dequantised. Work is split over output features on `pool`; MatMul sets OpenBLAS to
// one thread (once per process) so that BLAS threads do not compete with the pool.
// Errors: InvalidArgument for an unsupported dtype, k not a multiple of the block size, or m/k/n < 0.
Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool);

// Same, on ThreadPool::Default().
inline Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y) {
  return MatMul(x, m, k, w, wt, n, y, ThreadPool::Default());
}

}  // namespace stoke::cpu
