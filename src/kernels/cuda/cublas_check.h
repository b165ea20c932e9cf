// cuBLAS / cuBLASLt status codes as Status, with the call site (as cuda_check.h does for the runtime). Both
// libraries share cublasStatus_t; the message comes from cuBLASLt, which stoke_kernels_cuda links.
#pragma once

#include <cublas_api.h>

#include "base/status.h"

namespace stoke::cuda {
Status CublasError(const char* file, int line, const char* expr, cublasStatus_t status);
}  // namespace stoke::cuda

#define CUBLAS_RETURN_IF_ERROR(expr)                                                                \
  do {                                                                                              \
    const cublasStatus_t _cublas_s = (expr);                                                        \
    if (_cublas_s != CUBLAS_STATUS_SUCCESS) {                                                       \
      return ::stoke::cuda::CublasError(__FILE__, __LINE__, #expr, _cublas_s);                      \
    }                                                                                               \
  } while (0)
