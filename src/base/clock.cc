#include "base/clock.h"

namespace stoke {
namespace {
class RealClock final : public Clock {
 public:
  Nanos Now() const override { return MonotonicNanos(); }
};
}  // namespace

Clock* Clock::Real() {
  static RealClock clock;
  return &clock;
}

}  // namespace stoke
