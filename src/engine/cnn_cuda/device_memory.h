// Grow-only device and pinned host allocations for the CNN executor: a runner keeps the largest size any plan
// asked for (like CnnWorkspace on the CPU), so a steady stream of batches allocates nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.h"

namespace stoke::cnn::cuda {

// One grow-only buffer; `Space` says where it lives (static Alloc and Free with cudaMalloc's signatures).
template <typename Space>
class GrowOnlyBuffer {
 public:
  GrowOnlyBuffer() = default;
  ~GrowOnlyBuffer() {
    if (p_ != nullptr) Space::Free(p_);
  }
  GrowOnlyBuffer(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer& operator=(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer(GrowOnlyBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }

  // At least `bytes`; the contents are lost when it grows.
  Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return OkStatus();
    if (p_ != nullptr) Space::Free(p_);
    p_ = nullptr, bytes_ = 0;
    CUDA_RETURN_IF_ERROR(Space::Alloc(&p_, bytes));
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

struct DeviceSpace {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void Free(void* p) { cudaFree(p); }
};
struct PinnedHostSpace {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void Free(void* p) { cudaFreeHost(p); }
};

using DeviceMemory = GrowOnlyBuffer<DeviceSpace>;
using PinnedMemory = GrowOnlyBuffer<PinnedHostSpace>;

}  // namespace stoke::cnn::cuda
