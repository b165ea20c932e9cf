// Warp-level tensor-core and async-copy helpers shared by the tiled attention kernels (prefill_flash.cu,
// decode_tiled.cu): cp.async into shared memory, mma.sync m16n8k16 (bf16 or fp16 in, fp32 accumulators) and
// ldmatrix.
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16, g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (g, 2t..2t+1) a1 = (g+8, 2t..) a2 = (g, 2t+8..) a3 = (g+8, 2t+8..)
//   B 16x8:  b0 = (k 2t..2t+1, n g) b1 = (k 2t+8..2t+9, n g)
//   C 16x8:  c0,c1 = (g, 2t..2t+1) c2,c3 = (g+8, 2t..2t+1)
// Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace stoke::cuda {

// bf16 elements of row padding in shared K/V/Q tiles: row starts shift by 16 bytes, so the 8 rows an
// ldmatrix (or a fragment's 32-bit loads) touches fall in different banks.
inline constexpr int kSmemRowPad = 8;

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (the source is not read).
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes));
}
// 4-byte async copy global -> shared (.ca: the only form below 16 bytes); src_bytes = 0 writes zeros.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.wait_group 0;\n" ::);
}
// Waits until at most kPending of this thread's most recent commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// d += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a · b, m16n8k16, fp16 inputs, fp32 accumulators (the same fragment layouts as Mma).
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i gets it (lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1).
__device__ __forceinline__ void LdMatrixX4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                           const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(SmemAddr(smem_row)));
}

// Four transposed 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i gets it.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(SmemAddr(smem_row)));
}

// 2^x on the special-function unit alone (ex2.approx.ftz.f32; 2^-inf = +0). exp2f wraps the same instruction
// in a range test and two multiplies for results below 2^-126: three more FP32 instructions per softmax
// weight, where a weight that small counts as 0 anyway. For exponents <= 0 (and lazily-rescaled ones <= 8).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ uint32_t Ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Two floats as a bf16 pair, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Two floats as an fp16 pair, the first in the low half.
__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace stoke::cuda
