// CUDA runtime errors as Status, with the call site. The message is built in a host-compiled .cc file:
// fmt's compile-time format checks do not survive nvcc.
#pragma once

#include <cuda_runtime.h>

#include "base/status.h"

namespace stoke::cuda {
Status CudaError(const char* file, int line, const char* expr, cudaError_t err);
}  // namespace stoke::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                     \
    cudaError_t _e = (expr);                                                               \
    if (_e != cudaSuccess) return ::stoke::cuda::CudaError(__FILE__, __LINE__, #expr, _e); \
  } while (0)
