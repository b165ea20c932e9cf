// The synthetic model (engine/model/synthetic.h) on a CUDA GPU: each runner (one per model instance) owns a
// non-blocking stream, four timing events, host staging buffers (pinned from a process-wide PinnedHostPool,
// or pageable from malloc, as the model's "buffers" says) and device buffers sized for its largest batch.
// Per batch: preprocess (CPU busy wait + copy into staging) -> H2D -> each kernel's launches (launch_us of
// host time before each) -> D2H -> postprocess (CPU busy wait + copy out). h2d / compute / d2h come from
// the events; preprocess / postprocess from the host clock.
//
//   Backends b = CpuBackends(); b.cuda_synthetic = CudaSyntheticBackend();   // CudaBackends() fills it too
//   ASSIGN_OR_RETURN(auto runner, NewSyntheticRunner(model, max_rows, b));    // "device": "cuda" or "auto"
//
// A configured kernel becomes SynthLaunch's (synthetic_kernels.h): `flops` as 8 independent FMA chains per
// thread, `bytes` as an in-place read + write of bytes/2 of the runner's device buffer (so `bytes` is the
// memory traffic, as on the CPU). Regions smaller than the L2 cache (50 MB on an H200) run from L2. A kernel
// with "tensor": true runs its `flops` as fp16 16x16x16 matrix multiply-adds (wmma, four independent
// accumulators per warp) on the tensor cores instead. "h2d_bytes_per_item" > input_bytes makes the H2D copy
// move that many bytes per row (the inputs packed first: an expanded, decoded tensor).
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "engine/model/synthetic.h"

namespace stoke {

// The CUDA runner as a SyntheticCudaBackend (available = a CUDA GPU is visible), for
// Backends::cuda_synthetic.
SyntheticCudaBackend CudaSyntheticBackend();

// A CUDA runner for `model` whatever its "device" key says (tests, benchmarks); buffers sized for max_rows.
StatusOr<std::unique_ptr<SyntheticRunner>> NewSyntheticCudaRunner(std::shared_ptr<const SyntheticModel> model,
                                                                  int64_t max_rows);

// How one launch of a configured kernel is shaped (256 threads per block).
struct SynthLaunchPlan {
  int blocks = 1;
  int64_t fma_iters = 0;       // per thread
  int64_t region_float4s = 0;  // bytes / 2 / 16
};
// Blocks grow with the work (>= 256 FMA iterations and >= 16 float4 per thread before adding one), up to
// max_blocks (a full GPU), and to cap_blocks when > 0 (the kernel's "blocks" key).
SynthLaunchPlan PlanSynthLaunch(double flops, double bytes, int cap_blocks, int max_blocks);

// A "tensor" kernel: each warp iteration is 4 wmma 16x16x16 multiply-adds = 4 * 2 * 16^3 FLOPs.
constexpr double kTensorFlopsPerWarpIter = 4.0 * 2 * 16 * 16 * 16;
struct SynthTensorPlan {
  int blocks = 0;
  int64_t iters = 0;  // per warp
};
// Blocks grow with the work (>= 64 iterations per warp before adding one), up to max_blocks / cap_blocks.
SynthTensorPlan PlanSynthTensor(double flops, int cap_blocks, int max_blocks);

}  // namespace stoke
