// Owned CUDA resources for one model instance: a stream, timing events, pinned host staging buffers and a
// device arena. RAII wrappers that report errors as Status; no allocation on the per-step path once warmed
// up.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "base/status.h"

namespace stoke::device {

// A non-blocking stream (does not synchronise with the legacy default stream).
class Stream {
 public:
  static StatusOr<Stream> Create(int priority = 0);
  Stream() = default;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream();
  cudaStream_t get() const { return s_; }
  Status Synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// A timing event. Elapsed(a, b) is the GPU time between two recorded events, in milliseconds.
class Event {
 public:
  static StatusOr<Event> Create(bool timing = true);
  Event() = default;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  ~Event();
  cudaEvent_t get() const { return e_; }
  Status Record(cudaStream_t s) const;
  Status Synchronize() const;
  bool Done() const;  // non-blocking query
  static StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  cudaEvent_t e_ = nullptr;
};

// Page-locked host memory for async H2D/D2H copies (55 GB/s against ~16 pageable on the H200 host), handed
// out in power-of-two size classes and kept for reuse: Acquire returns a buffer of at least `bytes`, Release
// gives it back. Thread-safe (the net threads and the engine thread both stage data).
class PinnedHostPool {
 public:
  PinnedHostPool() = default;
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  struct Buffer {
    void* data = nullptr;
    size_t capacity = 0;
  };
  StatusOr<Buffer> Acquire(size_t bytes);
  void Release(Buffer b);
  size_t bytes_allocated() const;  // pinned bytes held (in use + free)

 private:
  static size_t ClassOf(size_t bytes);
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> free buffers
  size_t allocated_ = 0;
  std::vector<void*> all_;
};

// One cudaMalloc'd slab carved by a bump pointer (256-byte aligned): per-step scratch (attention workspace,
// activations) without cudaMalloc on the hot path. Reset() frees everything at once (after the step's work
// on the stream is complete).
class DeviceArena {
 public:
  static StatusOr<std::unique_ptr<DeviceArena>> Create(size_t capacity);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // ResourceExhausted (naming sizes) when the slab is full.
  StatusOr<void*> Allocate(size_t bytes);
  template <typename T>
  StatusOr<T*> AllocateArray(size_t n) {
    ASSIGN_OR_RETURN(void* p, Allocate(n * sizeof(T)));
    return static_cast<T*>(p);
  }
  void Reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }

  static constexpr size_t kAlignment = 256;

 private:
  DeviceArena() = default;
  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
};

}  // namespace stoke::device
