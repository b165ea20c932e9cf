// Comparison of secrets (API keys) whose running time does not depend on where the inputs first differ, so a
// client timing its attempts learns nothing about the key but, at most, its length.
#pragma once

#include <cstddef>
#include <string_view>

namespace stoke {

inline bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Walk the whole of `a` whatever `b` holds; a length difference is folded into the result, not returned
  // early.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(a[i]) ^ y;
  }
  // volatile: keep the compiler from turning the loop back into an early-exit memcmp.
  volatile unsigned char result = diff;
  return result == 0;
}

}  // namespace stoke
