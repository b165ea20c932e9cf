// The BERT encoder (engine/model/bert.h) on the GPU: bf16 weights and GEMMs (cuBLASLt, fp32 accumulation),
// fp32 residual stream, LayerNorm statistics, softmax and pooling. Same results as BertEncoder::Embed to bf16
// rounding (cosine >= 0.999 per sequence, cuda_bert_gpu_test.cc), same truncation and errors.
//
// CudaBertModel holds the weights, uploaded once and shared; each CudaBertRunner (one per serving instance)
// owns a non-blocking stream, a cuBLASLt handle + workspace, a device arena for activations (grown to the
// largest batch seen, up to BertDeviceOptions::max_batch_tokens) and draws pinned staging buffers from the
// model's pool, so N runners run N batches concurrently on N streams. A batch is not padded: sequences are
// concatenated (cu_seqlens), as on the CPU, so a sequence's embedding does not depend on its batch mates.
//
// Per batch: ids | positions | cu_seqlens staged in pinned memory -> one async H2D; embeddings + LayerNorm;
// per layer fused-QKV GEMM, bias, attention, output GEMM, bias + residual + LayerNorm, FFN GEMM, bias + GELU,
// GEMM, bias + residual + LayerNorm; mean pooling + L2 norm; async D2H of [batch, hidden] fp32. Events around
// the copies and the compute give EmbedTimes' h2d / compute / d2h.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "engine/model/bert.h"
#include "engine/model/bert_backend.h"

namespace stoke {

// Uploads `encoder`'s weights to options.gpu_index. Errors: no GPU, an unsupported shape (head_dim not 32,
// 64, 96 or 128; hidden or intermediate size not a multiple of 8), out of device memory.
StatusOr<std::shared_ptr<BertDeviceModel>> CreateCudaBert(std::shared_ptr<const BertEncoder> encoder,
                                                          const BertDeviceOptions& options);

// CreateCudaBert as a BertBackend (available = a CUDA GPU is visible), for Backends::cuda_bert
// (CudaBackends(), engine/cuda/cuda_backends.h).
BertBackend CudaBertBackend();

}  // namespace stoke
