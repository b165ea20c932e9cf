// Registers the CUDA model backends with the CPU-only factories (engine/model/factory.h), so code that loads
// a model through LoadDecoder gets the GPU with DecoderOptions::device = "cuda" / "auto". Only CUDA builds
// link this folder; apps call RegisterCudaBackends() once at startup under STOKE_WITH_CUDA.
#pragma once

namespace stoke {

void RegisterCudaBackends();

}  // namespace stoke
