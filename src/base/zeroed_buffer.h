// A zero-filled array whose memory pages are committed only when first written: an anonymous private mapping,
// which the kernel hands out as shared zero pages. A KV cache sized for its whole budget then costs memory as
// sequences fill it, not at allocation (a CPU `stoke serve` with the default 1 GiB budget held 1.1 GB of
// resident memory before its first request; std::vector's zero fill touches every page).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <utility>

namespace stoke {

template <typename T>
class ZeroedBuffer {
 public:
  ZeroedBuffer() = default;
  ~ZeroedBuffer() { Reset(); }
  ZeroedBuffer(const ZeroedBuffer&) = delete;
  ZeroedBuffer& operator=(const ZeroedBuffer&) = delete;
  ZeroedBuffer(ZeroedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ZeroedBuffer& operator=(ZeroedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  // Replaces the contents with n zeros. False (and empty) when the memory cannot be mapped.
  [[nodiscard]] bool Assign(size_t n) {
    Reset();
    if (n == 0) return true;
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<T*>(p);
    size_ = n;
    return true;
  }
  void Reset() {
    if (data_ != nullptr) munmap(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace stoke
