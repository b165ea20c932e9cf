// The element type of the paged KV cache (--kv-cache-dtype), shared by the CPU and CUDA kernels, the engine
// and the CLI. docs/precision.md says how each is stored and why.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace stoke {

enum class KvCacheDtype : uint8_t {
  kAuto,  // the backend's native precision: fp32 on the CPU, bf16 on CUDA
  kBf16,  // 16-bit, no scale
  kInt8,  // symmetric int8 with one fp32 scale per (token slot, KV head): q = rint(x · 127 / amax)
  kFp8,   // fp8 E4M3 with one fp32 scale per (token slot, KV head): q = e4m3(x · 448 / amax)
};

// "auto", "bf16", "int8", "fp8"; anything else is InvalidArgument naming the value.
StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view name);
std::string_view KvCacheDtypeName(KvCacheDtype d);
// True for the 8-bit types, which carry a scale per (slot, KV head).
inline bool KvCacheDtypeIsQuantized(KvCacheDtype d) {
  return d == KvCacheDtype::kInt8 || d == KvCacheDtype::kFp8;
}

}  // namespace stoke
