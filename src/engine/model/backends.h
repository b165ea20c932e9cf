// The compute backends one stoke process may use: the CPU always, CUDA where this build compiled it and a GPU
// is present. Built once in main() (MakeBackends(), apps/stoke/make_backends.h: CpuBackends(), or
// engine/cuda's CudaBackends() in a CUDA build, as CMake picks) and passed down as a value to whatever loads
// a model (LoadDecoder, LoadBertOnDevice, LoadCnnOnDevice, NewSyntheticRunner, the server's model
// repository). No registries, no build macros in the call paths: a library below apps/ learns about CUDA only
// through this value, so the CPU-only libraries never link CUDA.
//
//   const Backends backends = CudaBackends();          // main(), CUDA build
//   LoadDecoder(path, options, backends);               // device "auto" -> cuda when backends.cuda_usable()
#pragma once

#include "engine/model/bert_backend.h"
#include "engine/model/cnn_backend.h"
#include "engine/model/factory.h"
#include "engine/model/synthetic.h"

namespace stoke {

struct Backends {
  DecoderBackend cuda_decoder;          // create == nullptr: this build has no CUDA decoder
  BertBackend cuda_bert;                // create == nullptr: no CUDA encoder
  SyntheticCudaBackend cuda_synthetic;  // create == nullptr: no CUDA synthetic runner
  CnnBackend cuda_cnn;                  // create == nullptr: no CUDA image-model (CNN) executor

  // This build compiled the CUDA backends in (whether or not a GPU is visible).
  bool cuda_compiled() const { return cuda_decoder.create != nullptr; }
  // Compiled in and a GPU is visible: what device "auto" resolves to "cuda" on.
  bool cuda_usable() const {
    return cuda_compiled() && (cuda_decoder.available == nullptr || cuda_decoder.available());
  }
};

// The CPU only (tests, CPU builds).
inline Backends CpuBackends() {
  return Backends{};
}

}  // namespace stoke
