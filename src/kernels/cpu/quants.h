// GGML block-quantised formats: block layouts (ggml-common.h), dequantisation to fp32 bit-exact with ggml's
// reference order, and ggml's reference quantisers for the 32-element formats. See
// shared/reference/model-formats.md §2. Blocks run along the innermost (contiguous) dimension of a tensor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "api/dtype.h"
#include "base/status.h"

namespace stoke::cpu {

inline constexpr int kQK = 32;     // values per block of the 32-element formats
inline constexpr int kQK_K = 256;  // values per super-block of the K formats
inline constexpr int kKScaleBytes = 12;

// All fp16 fields (d, m, dmin) are raw IEEE binary16 bits.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // low nibbles: values 0..15, high nibbles: 16..31
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j = 5th bit of value j (read as u32 LE)
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d;                    // super-block scale for the sub-block scales
  uint16_t dmin;                 // super-block scale for the sub-block mins
  uint8_t scales[kKScaleBytes];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 16 sub-blocks of 16
  uint16_t d;                 // last, unlike the other formats
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);

// Dequantises `n` consecutive values of type `t` (a row or several rows back to back) into fp32.
// Supports F32, F16, BF16 and every quantised DType; other DTypes (integers, F64) return InvalidArgument,
// as does n not a multiple of the block size. `src` needs no alignment.
Status DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// The per-format kernels behind DequantizeRow; n must be a multiple of the block size.
void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t n);
void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t n);
void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n);
void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t n);
void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n);
void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t n);
void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t n);

// ggml's reference quantisers (quantize_row_*_ref): identical bytes for identical input. n % 32 == 0;
// `dst` holds n / 32 blocks.
void QuantizeRowQ8_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ4_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ4_1(const float* x, void* dst, int64_t n);
void QuantizeRowQ5_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ5_1(const float* x, void* dst, int64_t n);

// Round-to-nearest encoders for the K formats (n % 256 == 0; `dst` holds n / 256 super-blocks). Not ggml's
// reference (which searches each sub-block's scale and min): valid blocks whose values are within about half
// a step of x, for tests and synthetic files; llama-quantize writes other bytes for the same input.
//   Q4_K: per 32 values, scale (max − min(0, min)) / 15 and min −min(0, min), both as 6-bit multiples of the
//         super-block's fp16 d and dmin; q = round((x + min) / scale) in [0, 15].
//   Q6_K: per 16 values, scale amax / 31 as an int8 multiple of the super-block's fp16 d; q = round(x /
//   scale)
//         in [-32, 31].
void QuantizeRowQ4_KSimple(const float* x, void* dst, int64_t n);
void QuantizeRowQ6_KSimple(const float* x, void* dst, int64_t n);

}  // namespace stoke::cpu
