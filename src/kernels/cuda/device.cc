#include "kernels/cuda/device.h"

#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {

Status CudaError(const char* file, int line, const char* expr, cudaError_t err) {
  return InternalError("{}:{}: {} failed: {}", file, line, expr, cudaGetErrorString(err));
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream, const std::function<Status()>& enqueue) {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status st = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!st.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return st.ok() ? CudaError(__FILE__, __LINE__, "cudaStreamEndCapture", end) : st;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    return CudaError(__FILE__, __LINE__, "cudaGraphInstantiate", inst);
  }
  return exec;
}

StatusOr<DeviceInfo> GetDeviceInfo(int index) {
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.num_sms = prop.multiProcessorCount;
  info.total_memory = prop.totalGlobalMem;
  return info;
}

}  // namespace stoke::cuda
