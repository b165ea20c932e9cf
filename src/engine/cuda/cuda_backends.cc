#include "engine/cuda/cuda_backends.h"

#include "engine/cuda/cuda_bert.h"

namespace stoke {

void RegisterCudaBackends() {
  RegisterCudaBert();
}

}  // namespace stoke
