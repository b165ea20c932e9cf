// CUDA builds (STOKE_HAVE_CUDA): the CPU plus the CUDA decoder, encoder and synthetic runner. See
// apps/stoke/make_backends.h.
#include "apps/stoke/make_backends.h"
#include "engine/cuda/cuda_backends.h"
#include "tools/stepbench/cuda/roofline_cuda.h"

namespace stoke {

Backends MakeBackends() {
  return CudaBackends();
}

stepbench::RooflineProbe MakeRooflineProbe() {
  return stepbench::CudaRooflineProbe();
}

}  // namespace stoke
