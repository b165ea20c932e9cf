#include "api/kv_cache_dtype.h"

namespace stoke {

StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view name) {
  if (name == "auto") return KvCacheDtype::kAuto;
  if (name == "bf16") return KvCacheDtype::kBf16;
  if (name == "int8") return KvCacheDtype::kInt8;
  if (name == "fp8") return KvCacheDtype::kFp8;
  return InvalidArgumentError("--kv-cache-dtype '{}': expected auto, bf16, int8 or fp8", name);
}

std::string_view KvCacheDtypeName(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kBf16:
      return "bf16";
    case KvCacheDtype::kInt8:
      return "int8";
    case KvCacheDtype::kFp8:
      return "fp8";
  }
  return "?";
}

}  // namespace stoke
