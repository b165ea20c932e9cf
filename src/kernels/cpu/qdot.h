// Integer dot products between GGML weight blocks and 8-bit-quantised activations (llama.cpp's approach):
// each activation row is quantised once per MatMul call to blocks of 32 int8 with an fp32 scale, then every
// 32-element block product is an AVX2 u8×s8 multiply-add, scaled by the two block scales.
// Internal to kernels/cpu (MatMul uses it); exposed for tests and benchmarks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "api/dtype.h"

namespace stoke::cpu {

// Activation rows quantised to 8 bits: row r of k values (k % 32 == 0) has
//   qs[r * k + i]        int8 values, x ≈ d · q
//   d[r * k/32 + b]      scale of block b (amax / 127)
//   s[r * k/32 + b]      d · Σ q over block b (for formats with a per-block offset: Q4_0, Q4_1, Q5_0, Q5_1,
//   Q4_K)
struct QuantizedActs {
  const int8_t* qs;
  const float* d;
  const float* s;
  int64_t k;
};

// Quantises one row of k values (k % 32 == 0) into qs[k], d[k/32], s[k/32]. Round-to-nearest (ties to even).
void QuantizeActsRow(const float* x, int64_t k, int8_t* qs, float* d, float* s);

// True for the weight types with an integer kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K (the K-quants
// as 8 virtual 32-blocks per super-block, each with an exact fp32 scale; k % 256 == 0 for them).
bool HasQDot(DType wt);

inline constexpr int kQDotMaxRows = 4;  // activation rows per tile: 1..4
inline constexpr int kQDotCols = 4;     // weight rows (Y columns) per tile

// One register tile: y[r * ldy + c] = Σ_i W_c[i] · X_r[i] for r < mr and c < ncols (1..4), where W_c is the
// weight row of k values (GGML blocks) at w + c * w_stride bytes and X_r the activation row r of `x`.
// Each block's integer dot product is exact; the float work per (row, column) is a fixed sequence of FMAs in
// block order, so a result is bit-identical whatever the tile shape, the column's position in the tile and
// the thread: splitting a MatMul differently (m = 1 vs m = 128, any pool) never changes a value.
using QDotTileFn = void (*)(const uint8_t* w, size_t w_stride, int ncols, const QuantizedActs& x, float* y,
                            int64_t ldy);

// The kernel for (wt, mr); nullptr when !HasQDot(wt) or mr is out of range.
QDotTileFn GetQDotTile(DType wt, int mr);

// The m > 1 path for the unsigned 4/5-bit formats: 8 weight rows are unpacked once per call to one byte per
// value and interleaved 4 values at a time, so one u8×s8 multiply-add covers 8 columns (one per 32-bit lane)
// and no horizontal reduction is left. Same integer sums, same FMA sequence: bit-identical to QDotTileFn.
inline constexpr int kPackCols = 8;

// 8 packed weight rows of k values (k % 32 == 0), in caller-owned memory (PackedColsSize gives the sizes):
//   q      [k/32 blocks][8 chunks][8 columns][4 values]  uint8: the value, or |value| for signed formats
//   qsign  same layout, int8: the signed value (signed formats only: Q6_K, Q8_0)
//   d      [k/32][8] block scales; off [k/32][8] block offsets (x = d · q + off), fp32
//   hs     [k/32][2][16] int16: Q6_K's sub-block scales of the low / high 16 values, each column's twice
struct PackedCols {
  uint8_t* q;
  int8_t* qsign;
  float* d;
  float* off;
  int16_t* hs;
  int64_t k;
};

// Element counts of the PackedCols arrays for k values: q and qsign k · 8, d and off k/32 · 8, hs k/32 · 32.
struct PackedColsSize {
  explicit PackedColsSize(int64_t k) : q(k * 8), f(k / 32 * 8), hs(k / 32 * 32) {}
  int64_t q, f, hs;
};

// True for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K (unsigned values) and Q6_K, Q8_0 (signed).
bool HasPackedQDot(DType wt);

// Packs ncols (1..8) weight rows at w + c * w_stride; columns >= ncols repeat the last row.
void PackCols(DType wt, const uint8_t* w, size_t w_stride, int ncols, const PackedCols& out);

// y[r * ldy + c] for r < mr (1..4), c < ncols, from packed weights and activation rows.
using PackedTileFn = void (*)(const PackedCols& w, const QuantizedActs& x, float* y, int64_t ldy, int ncols);
PackedTileFn GetPackedTile(DType wt, int mr);

}  // namespace stoke::cpu
