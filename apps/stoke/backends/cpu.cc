// CPU-only builds (no STOKE_HAVE_CUDA): the CPU and nothing else. See apps/stoke/make_backends.h.
#include "apps/stoke/make_backends.h"

namespace stoke {

Backends MakeBackends() {
  return CpuBackends();
}

stepbench::RooflineProbe MakeRooflineProbe() {
  return nullptr;
}

}  // namespace stoke
