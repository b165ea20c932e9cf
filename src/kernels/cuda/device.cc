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
