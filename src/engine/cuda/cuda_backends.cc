#include "engine/cuda/cuda_backends.h"

#include <memory>

#include "engine/cnn_cuda/cuda_cnn.h"
#include "engine/cuda/cuda_bert.h"
#include "engine/cuda/cuda_llama.h"
#include "engine/cuda_synthetic/synthetic_gpu.h"
#include "engine/model/factory.h"
#include "kernels/cuda/device.h"

namespace stoke {
namespace {

StatusOr<std::unique_ptr<DecoderModel>> CreateCudaDecoder(LlamaWeights weights, const DecoderOptions& o) {
  CudaLlama::Options co;
  co.gpu_index = o.gpu_index;
  co.gpu_memory_fraction = o.gpu_memory_fraction;
  co.max_step_tokens = o.max_step_tokens;
  co.cuda_graphs = o.cuda_graphs;
  co.gemm_cache_path = o.cuda.gemm_cache_path;
  co.gemv_max_rows = o.cuda.gemv_max_rows;
  co.fp8_gemv_max_rows = o.cuda.fp8_gemv_max_rows;
  co.gemv_split = o.cuda.gemv_split;
  co.pdl = o.cuda.pdl == "on"    ? CudaLlama::Options::Pdl::kOn
           : o.cuda.pdl == "off" ? CudaLlama::Options::Pdl::kOff
                                 : CudaLlama::Options::Pdl::kAuto;
  co.attention.decode_min_partition = o.cuda.decode_min_partition;
  co.attention.decode_partition = o.cuda.decode_partition;
  co.attention.decode_pipeline = o.cuda.decode_pipeline;
  co.attention.decode_tiled = o.cuda.decode_attention != "warp";
  co.attention.decode_tiled_fragments = o.cuda.decode_attention != "tiled-smem";
  co.attention.decode_stages = o.cuda.decode_stages;
  co.attention.prefill_force_warp = o.cuda.prefill_attention == "warp";
  co.mixed_split = o.cuda.mixed_attention != "prefill";
  co.vector_elementwise = o.cuda.vector_elementwise;
  co.kquant_gemv = o.cuda.kquant_gemv == "int8"   ? cuda::KGemvMath::kInt8Activations
                   : o.cuda.kquant_gemv == "fp32" ? cuda::KGemvMath::kFp32
                                                  : cuda::KGemvMath::kAuto;
  co.kv_cache_dtype = o.kv_cache.dtype;
  co.quantization = o.quantization;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaLlama> model, CudaLlama::Create(std::move(weights), co));
  return std::unique_ptr<DecoderModel>(std::move(model));
}

bool CudaAvailable() {
  return cuda::DeviceCount() > 0;
}

}  // namespace

DecoderBackend CudaDecoderBackend() {
  return {.create = &CreateCudaDecoder, .available = &CudaAvailable};
}

Backends CudaBackends() {
  return {.cuda_decoder = CudaDecoderBackend(),
          .cuda_bert = CudaBertBackend(),
          .cuda_synthetic = CudaSyntheticBackend(),
          .cuda_cnn = cnn::cuda::CudaCnnBackend()};
}

}  // namespace stoke
