// RMSNorm on the GPU: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight. Checked against
// cpu::RmsNorm.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace stoke::cuda {

// x, out: [rows, dim] fp32 device pointers (out may alias x); weight: [dim].
Status RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out,
               cudaStream_t stream);

}  // namespace stoke::cuda
