// What this build can compute on, decided once by CMake rather than by #ifdefs in the call paths: exactly one
// of apps/stoke/backends/cpu.cc (CPU-only builds) and apps/stoke/backends/cuda.cc (STOKE_HAVE_CUDA) is
// compiled into stoke. main() calls MakeBackends() once and hands the value to every command (command.h).
#pragma once

#include "engine/model/backends.h"
#include "tools/stepbench/stepbench.h"

namespace stoke {

// CPU build: CpuBackends(). CUDA build: CudaBackends() (engine/cuda/cuda_backends.h); its backends ask for
// a GPU only when a loader resolves "auto" or "cuda", so this is cheap and safe on a machine without one.
Backends MakeBackends();

// `stoke bench step`'s device roofline probe: null in a CPU build, CudaRooflineProbe() in a CUDA build.
stepbench::RooflineProbe MakeRooflineProbe();

}  // namespace stoke
