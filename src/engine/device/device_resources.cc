#include "engine/device/device_resources.h"

#include <bit>

#include "kernels/cuda/cuda_check.h"

namespace stoke::device {

StatusOr<Stream> Stream::Create(int priority) {
  Stream s;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s.s_, cudaStreamNonBlocking, priority));
  return s;
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) cudaStreamDestroy(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}
Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}
Status Stream::Synchronize() const {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
  return OkStatus();
}

StatusOr<Event> Event::Create(bool timing) {
  Event e;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}
Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}
Status Event::Record(cudaStream_t s) const {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(e_, s));
  return OkStatus();
}
Status Event::Synchronize() const {
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_));
  return OkStatus();
}
bool Event::Done() const {
  return cudaEventQuery(e_) == cudaSuccess;
}
StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  float ms = 0;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.e_, end.e_));
  return ms;
}

size_t PinnedHostPool::ClassOf(size_t bytes) {
  return std::bit_ceil(std::max<size_t>(bytes, 4096));
}

StatusOr<PinnedHostPool::Buffer> PinnedHostPool::Acquire(size_t bytes) {
  const size_t cls = ClassOf(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return Buffer{p, cls};
    }
  }
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, cls, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhaustedError("pinned host allocation of {} bytes failed: {}", cls,
                                  cudaGetErrorString(err));
  }
  std::lock_guard<std::mutex> lock(mu_);
  allocated_ += cls;
  all_.push_back(p);
  return Buffer{p, cls};
}

void PinnedHostPool::Release(Buffer b) {
  if (b.data == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_[b.capacity].push_back(b.data);
}

size_t PinnedHostPool::bytes_allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

PinnedHostPool::~PinnedHostPool() {
  for (void* p : all_) cudaFreeHost(p);
}

StatusOr<std::unique_ptr<DeviceArena>> DeviceArena::Create(size_t capacity) {
  std::unique_ptr<DeviceArena> a(new DeviceArena());
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(capacity, 1));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhaustedError("device arena of {} bytes: {}", capacity, cudaGetErrorString(err));
  }
  a->base_ = static_cast<char*>(p);
  a->capacity_ = capacity;
  return a;
}

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);
}

StatusOr<void*> DeviceArena::Allocate(size_t bytes) {
  const size_t start = (used_ + kAlignment - 1) / kAlignment * kAlignment;
  if (start > capacity_ || bytes > capacity_ - start) {
    return ResourceExhaustedError("device arena full: {} bytes asked, {} of {} used", bytes, used_,
                                  capacity_);
  }
  used_ = start + bytes;
  high_water_ = std::max(high_water_, used_);
  return static_cast<void*>(base_ + start);
}

}  // namespace stoke::device
