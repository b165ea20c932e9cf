#include "api/dtype.h"

#include <array>

namespace stoke {

const DTypeInfo& GetDTypeInfo(DType t) {
  static const std::array<DTypeInfo, 21> kInfo = {{
      {"F32", 1, 4, false},  {"F16", 1, 2, false},  {"BF16", 1, 2, false}, {"F64", 1, 8, false},
      {"I8", 1, 1, false},   {"U8", 1, 1, false},   {"I16", 1, 2, false},  {"U16", 1, 2, false},
      {"I32", 1, 4, false},  {"U32", 1, 4, false},  {"I64", 1, 8, false},  {"U64", 1, 8, false},
      {"BOOL", 1, 1, false}, {"Q4_0", 32, 18, true}, {"Q4_1", 32, 20, true}, {"Q5_0", 32, 22, true},
      {"Q5_1", 32, 24, true}, {"Q8_0", 32, 34, true}, {"Q4_K", 256, 144, true}, {"Q6_K", 256, 210, true},
      {"F8_E4M3", 1, 1, false},
  }};
  return kInfo[static_cast<size_t>(t)];
}

StatusOr<size_t> RowBytes(DType t, int64_t n) {
  const DTypeInfo& info = GetDTypeInfo(t);
  if (n < 0 || n % info.block_elems != 0) {
    return InvalidArgumentError("row of {} values is not a whole number of {} blocks ({} values each)", n,
                                info.name, info.block_elems);
  }
  return static_cast<size_t>(n / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

}  // namespace stoke
