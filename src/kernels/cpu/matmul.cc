#include "kernels/cpu/matmul.h"

namespace stoke::cpu {

Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool) {
  return UnimplementedError("MatMul: not implemented yet");
}

}  // namespace stoke::cpu
