// The CUDA device as stoke sees it: presence, properties, and errors turned into Status.
#pragma once

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

}  // namespace stoke::cuda
