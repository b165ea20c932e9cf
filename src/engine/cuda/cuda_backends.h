// The CUDA backends of this build as one Backends value (engine/model/backends.h): the decoder (CudaLlama),
// the BERT encoder (cuda_bert.h), the synthetic model's runner (engine/cuda_synthetic) and the image
// models' CNN executor (engine/cnn_cuda). Only CUDA builds
// link this folder; main() builds the value once (apps/stoke/backends/cuda.cc) and passes it down to the
// loaders (LoadDecoder, LoadBertOnDevice, NewSyntheticRunner). Nothing here touches the GPU: each backend's
// `available` asks for a device when a loader resolves "auto" or "cuda".
//
//   const Backends backends = CudaBackends();
//   ASSIGN_OR_RETURN(auto model, LoadDecoder(path, {.device = "auto"}, backends));
#pragma once

#include "engine/model/backends.h"

namespace stoke {

// The CPU plus every CUDA backend (each `available` = a CUDA GPU is visible).
Backends CudaBackends();

// The decoder backend alone: CudaLlama from DecoderOptions (gpu_index, memory fraction, CudaDecoderTuning).
DecoderBackend CudaDecoderBackend();

}  // namespace stoke
