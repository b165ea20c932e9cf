// Grow-only device and pinned host allocations for the CNN executor: a runner keeps the largest size any plan
// asked for (like CnnWorkspace on the CPU), so a steady stream of batches allocates nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.h"

namespace stoke::cnn::cuda {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  DeviceMemory(DeviceMemory&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }

  // Contents are lost when it grows.
  Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return OkStatus();
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr, bytes_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&p_, bytes));
    bytes_ = bytes;
    return OkStatus();
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedMemory {
 public:
  PinnedMemory() = default;
  ~PinnedMemory() {
    if (p_ != nullptr) cudaFreeHost(p_);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return OkStatus();
    if (p_ != nullptr) cudaFreeHost(p_);
    p_ = nullptr, bytes_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&p_, bytes));
    bytes_ = bytes;
    return OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace stoke::cnn::cuda
