// The KV cache's 16- and 8-bit storage on the CPU: the reference quantiser every backend matches
// (kernels/cuda/attention_quant.cu rounds the same way), and the paged layer the CPU engine stores it in.
//
// Scale granularity: one fp32 scale per (token slot, KV head), i.e. per head_dim values. A token's K (and V)
// row of one head is quantised on its own when it is written: no read-modify-write of a shared block, no
// calibration pass, and an outlier token costs precision only in its own row. The price is 4 bytes per
// head_dim values (6% at head_dim 64, 3% at 128). docs/precision.md compares this with per-block scales.
//   int8:     scale = amax / 127, q = clamp(rint(x · (127 / amax)), -127, 127), x' = q · scale
//   fp8 E4M3: scale = amax / 448, q = e4m3_rne_satfinite(x · (448 / amax)),    x' = e4m3(q) · scale
//   amax = 0 (an all-zero row): scale 0, q 0.
#pragma once

#include <array>
#include <cstdint>

#include "api/kv_cache_dtype.h"
#include "base/thread_pool.h"

namespace stoke::cpu {

// fp8 E4M3 (OCP: bias 7, no infinities, 0x7f/0xff NaN, largest finite 448): round-to-nearest-even,
// saturating to ±448 as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); NaN -> 0x7f.
uint8_t Fp8E4M3FromFloat(float x);
float Fp8E4M3ToFloat(uint8_t b);
// Fp8E4M3ToFloat of every code, built once: what the dequantising loops index.
const std::array<float, 256>& Fp8E4M3Table();

// Bytes one stored element takes: 2 (bf16) or 1 (int8, fp8). kAuto is not a storage type here (0).
int KvElementBytes(KvCacheDtype d);

// One row of n values (one token's K or V of one head) to `out` (n elements of KvElementBytes(d) bytes);
// returns the scale (1 for bf16).
float QuantizeKvRow(const float* x, int n, KvCacheDtype d, uint8_t* out);
// The inverse: out[i] = value(q[i]) · scale.
void DequantizeKvRow(const uint8_t* q, int n, float scale, KvCacheDtype d, float* out);

// Paged KV for one layer in 16 or 8 bits (the fp32 form is PagedKvLayer, attention.h):
//   k, v             = [num_blocks, block_size, num_kv_heads, head_dim] of KvElementBytes(dtype) bytes
//   k_scale, v_scale = [num_blocks, block_size, num_kv_heads] fp32 (int8 / fp8 only; null for bf16)
struct QuantPagedKvLayer {
  KvCacheDtype dtype = KvCacheDtype::kInt8;
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Tests only (no flag reaches it): dequantisation multiplies every scale by this. A value other than 1
  // is a deliberately broken quantiser, which the consistency gate must reject.
  float dequant_scale_multiplier = 1.0f;
};

// cpu::WriteKv for the quantised layer: token t's rows go to slot slots[t] (negative: skipped).
// k, v = [tokens, num_kv_heads, head_dim] fp32.
void WriteKv(const QuantPagedKvLayer& kv, const float* k, const float* v, const int32_t* slots,
             int64_t tokens);

// cpu::PagedAttention (same contract, attention.h) over a quantised layer: each (token, KV head) item
// dequantises the rows of its context into fp32 scratch and runs the fp32 kernel's arithmetic on them, so
// the result equals cpu::PagedAttention over a cache holding the dequantised values.
void PagedAttention(const float* q, int64_t n, int heads, int32_t start_pos, const int32_t* block_table,
                    const QuantPagedKvLayer& kv, float scale, float* out, ThreadPool& pool);

}  // namespace stoke::cpu
