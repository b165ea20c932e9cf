// The 8-bit KV cache's codes in the tiled attention kernels (decode_tiled.cu, prefill_flash.cu): what a cache
// holds, and codes widened to bf16 in shared memory (exactly: int8 and E4M3 values are bf16 values; the fp32
// scale per (slot, kv head) is applied to the scores (K) and the softmax weights (V), not to the codes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace stoke::cuda {

// What the cache holds: bf16 values, or 8-bit codes (int8 / fp8 E4M3) with one fp32 scale per (slot, kv
// head).
enum CacheKind { kCacheBf16 = 0, kCacheInt8 = 1, kCacheFp8 = 2 };

// 8-bit codes -> bf16, 16 at a time (exact).
template <int kCache>
__device__ __forceinline__ void WidenCodes(const uint4& in, __nv_bfloat16* out) {
  const uint8_t* b = reinterpret_cast<const uint8_t*>(&in);
  alignas(16) __nv_bfloat162 r[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float lo, hi;
    if constexpr (kCache == kCacheFp8) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(b[2 * i] | (b[2 * i + 1] << 8)), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      lo = f.x;
      hi = f.y;
    } else {
      lo = static_cast<float>(static_cast<int8_t>(b[2 * i]));
      hi = static_cast<float>(static_cast<int8_t>(b[2 * i + 1]));
    }
    r[i] = __floats2bfloat162_rn(lo, hi);
  }
  reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(r)[0];
  reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(r)[1];
}

}  // namespace stoke::cuda
