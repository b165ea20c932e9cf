// The CUDA device as stoke sees it: presence, properties, and errors turned into Status.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <string>

#include "base/status.h"

namespace stoke::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int num_sms = 0;
  size_t total_memory = 0;
};

// Number of visible CUDA devices; 0 (not an error) when there is no driver or no GPU.
int DeviceCount();
StatusOr<DeviceInfo> GetDeviceInfo(int index);

// What `enqueue` puts on `stream`, captured (cudaStreamCaptureModeThreadLocal: other threads' allocations stay
// legal) and instantiated as a graph for cudaGraphLaunch; the caller owns it (cudaGraphExecDestroy). enqueue's
// error, or the capture's or instantiation's, comes back with the stream out of capture and CUDA's last error
// cleared, so the caller can fall back to launching the kernels eagerly.
StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream, const std::function<Status()>& enqueue);

}  // namespace stoke::cuda
