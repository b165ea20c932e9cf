// One monotonic clock for the whole process, in nanoseconds. Injectable so schedulers and batchers can be
// tested on simulated time.
#pragma once

#include <chrono>
#include <cstdint>

namespace stoke {

using Nanos = int64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos Now() const = 0;
  // The real monotonic clock (steady_clock).
  static Clock* Real();
};

inline Nanos MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A clock tests move by hand.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Nanos start = 0) : now_(start) {}
  Nanos Now() const override { return now_; }
  void Advance(Nanos d) { now_ += d; }
  void Set(Nanos t) { now_ = t; }

 private:
  Nanos now_;
};

}  // namespace stoke
