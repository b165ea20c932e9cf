// Token selection on the GPU, one block per row of logits: greedy argmax and a seeded sampler with
// temperature, top-k and top-p. The semantics are cpu Sampler's (engine/runner/sampler.h): NaN logits are
// never chosen, argmax ties go to the lowest id, top-k / top-p cut the best-first order (ties: lower id
// first), and the uniform draw is Sampler::Uniform(seed, step), so a row's sample depends only on its seed
// and step. The draw walks the kept tokens in id order (the CPU walks them best first): same distribution,
// but the same (seed, step) may pick a different token than the CPU sampler.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "api/sampling.h"
#include "base/status.h"

namespace stoke::cuda {

// out[r] = argmax(logits[r, :]); logits = [rows, vocab] fp32 with row stride ld (0: vocab), out = [rows]
// int32.
Status ArgmaxRows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t stream,
                  int64_t ld = 0);

// Per-row sampling parameters (a device array of `rows`): api/sampling.h's TokenSampling.
using RowSampling = TokenSampling;
// logits row stride ld (0: vocab).
Status SampleRows(const float* logits, int rows, int vocab, const RowSampling* params, int32_t* out,
                  cudaStream_t stream, int64_t ld = 0);

}  // namespace stoke::cuda
