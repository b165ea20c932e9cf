// The CUDA roofline probe for `stoke bench step` (StepBenchOptions::roofline): D2D copy bandwidth and bf16
// GEMM rates through the engine's BlasLtGemm. CUDA builds only (stoke_stepbench_cuda).
#pragma once

#include "tools/stepbench/stepbench.h"

namespace stoke::stepbench {

RooflineProbe CudaRooflineProbe();

}  // namespace stoke::stepbench
