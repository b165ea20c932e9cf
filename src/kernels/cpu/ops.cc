#include "kernels/cpu/ops.h"

namespace stoke::cpu {

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out) {}
void LayerNorm(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t dim, float eps,
               float* out) {}
void Add(const float* a, const float* b, int64_t n, float* out) {}
void AddBias(float* x, const float* bias, int64_t rows, int64_t dim) {}
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {}
void GeluErf(float* x, int64_t n) {}
void SoftmaxInPlace(float* x, int64_t n) {}
void LogSoftmax(const float* x, int64_t n, float* out) {}
void RopeNeox(float* x, const int32_t* positions, int64_t tokens, int heads, int head_dim,
              const float* inv_freq) {}
Status EmbeddingLookup(const void* table, DType t, int64_t vocab, int64_t dim, const int32_t* ids, int64_t n,
                       float* out) {
  return UnimplementedError("EmbeddingLookup: not implemented yet");
}

}  // namespace stoke::cpu
