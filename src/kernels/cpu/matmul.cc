#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/qdot.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu {
namespace {

// Below this many multiply-adds per chunk, waking another thread costs more than it saves.
constexpr int64_t kMinMacsPerChunk = int64_t{1} << 16;
// Output features per BLAS tile (fp32, fp16, bf16) and per converted fp16/bf16 scratch tile.
constexpr int64_t kTileN = 16;
constexpr int64_t kScratchRows = 64;
// Integer path blocking: kNBlock weight rows × kMBlock X rows of results per scratch tile (8 KB).
constexpr int64_t kNBlock = 32;
constexpr int64_t kMBlock = 64;
// From this many X rows on, the integer path uses packed weights (packing 8 rows costs about as
// much as computing 2-4 X rows against them unpacked).
constexpr int64_t kPackedMinRows = 5;

// Sum of 8 lanes in a fixed order.
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

int64_t Grain(int64_t macs_per_unit) {
  return std::max<int64_t>(1, kMinMacsPerChunk / std::max<int64_t>(1, macs_per_unit));
}

// Parallelism comes from our pool; OpenBLAS threads would fight it for the same cores.
void UseSingleThreadedBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Y[:, n0:n0+rows] = X · Wt^T with Wt = [rows, k] fp32; Y has row stride ldy.
void SgemmTile(const float* x, int64_t m, int64_t k, const float* wt, int64_t rows, float* y, int64_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(rows),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), wt, static_cast<int>(k), 0.0f, y,
              static_cast<int>(ldy));
}

// fp32 W: a vectorised dot per output for one row (sgemv is bandwidth-bound; our pool splits n), OpenBLAS
// sgemm on column tiles otherwise.
void MatMulF32(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, ThreadPool& pool) {
  if (m == 1) {
    pool.ParallelFor(n, Grain(k), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) y[j] = Dot(x, w + j * k, k);
    });
    return;
  }
  UseSingleThreadedBlas();
  const int64_t tiles = (n + kTileN - 1) / kTileN;
  pool.ParallelFor(tiles, Grain(m * k * kTileN), [&](int64_t b, int64_t e) {
    const int64_t n0 = b * kTileN, n1 = std::min(n, e * kTileN);
    SgemmTile(x, m, k, w + n0 * k, n1 - n0, y + n0, n);
  });
}

inline uint16_t LoadU16(const uint16_t* p) {  // GGUF tensors may sit at odd addresses
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// fp16/bf16 row -> fp32 (F16C / shift), 8 at a time.
void HalfRowToF32(DType t, const uint16_t* src, float* dst, int64_t k) {
  int64_t i = 0;
  if (t == DType::kF16) {
    for (; i + 8 <= k; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    }
    for (; i < k; ++i) dst[i] = _cvtsh_ss(LoadU16(src + i));
  } else {
    for (; i + 8 <= k; i += 8) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; ++i) {
      const uint32_t bits = static_cast<uint32_t>(LoadU16(src + i)) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  }
}

// Σ x[i] · W[i] with W fp16/bf16, converted on the fly.
float DotHalf(DType t, const float* x, const uint16_t* w, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256 w0, w1;
    const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
    const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8));
    if (t == DType::kF16) {
      w0 = _mm256_cvtph_ps(h0);
      w1 = _mm256_cvtph_ps(h1);
    } else {
      w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
      w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
    }
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), w0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), w1, acc1);
  }
  float tail[16];
  const int64_t rest = k - i;  // < 16
  HalfRowToF32(t, w + i, tail, rest);
  float sum = Hsum(_mm256_add_ps(acc0, acc1));
  for (int64_t r = 0; r < rest; ++r) sum += x[i + r] * tail[r];
  return sum;
}

// F16/BF16 W: converted on the fly for one row (a dot per output); otherwise kScratchRows weight rows at a
// time into a per-thread fp32 scratch, then sgemm.
void MatMulHalf(const float* x, int64_t m, int64_t k, const uint16_t* w, DType wt, int64_t n, float* y,
                ThreadPool& pool) {
  if (m == 1) {
    pool.ParallelFor(n, Grain(k), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) y[j] = DotHalf(wt, x, w + j * k, k);
    });
    return;
  }
  UseSingleThreadedBlas();
  const int64_t tiles = (n + kTileN - 1) / kTileN;
  pool.ParallelFor(tiles, Grain(m * k * kTileN), [&](int64_t b, int64_t e) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(kScratchRows * k));
    for (int64_t n0 = b * kTileN, n_end = std::min(n, e * kTileN); n0 < n_end; n0 += kScratchRows) {
      const int64_t rows = std::min(kScratchRows, n_end - n0);
      for (int64_t r = 0; r < rows; ++r) HalfRowToF32(wt, w + (n0 + r) * k, scratch.data() + r * k, k);
      SgemmTile(x, m, k, scratch.data(), rows, y + n0, n);
    }
  });
}

// Integer path with packed weights (every integer type; m >= kPackedMinRows): each thread packs 8
// weight rows at a time into a per-thread scratch (k · 8 bytes + scales) and sweeps all X rows over them.
void MatMulPacked(const int8_t* qs, const float* ds, const float* ss, int64_t m, int64_t k, const uint8_t* w,
                  DType wt, size_t row_bytes, int64_t n, float* y, ThreadPool& pool) {
  const int64_t nb = k / kQK;
  PackedTileFn fns[kQDotMaxRows];
  for (int mr = 1; mr <= kQDotMaxRows; ++mr) fns[mr - 1] = GetPackedTile(wt, mr);
  const int64_t groups = (n + kPackCols - 1) / kPackCols;
  pool.ParallelFor(groups, Grain(kPackCols * k * m), [&](int64_t b, int64_t e) {
    thread_local std::vector<uint8_t> packed_q;
    thread_local std::vector<float> packed_f;
    thread_local std::vector<int16_t> packed_hs;
    const PackedColsSize size(k);
    packed_q.resize(static_cast<size_t>(2 * size.q));
    packed_f.resize(static_cast<size_t>(2 * size.f));
    packed_hs.resize(static_cast<size_t>(size.hs));
    const PackedCols pc{packed_q.data(),  reinterpret_cast<int8_t*>(packed_q.data() + size.q),
                        packed_f.data(),  packed_f.data() + size.f,
                        packed_hs.data(), k};
    float ybuf[kMBlock * kPackCols];
    for (int64_t g = b; g < e; ++g) {
      const int64_t n0 = g * kPackCols;
      const int cols = static_cast<int>(std::min<int64_t>(kPackCols, n - n0));
      PackCols(wt, w + n0 * row_bytes, row_bytes, cols, pc);
      for (int64_t m0 = 0; m0 < m; m0 += kMBlock) {
        const int64_t rows = std::min(kMBlock, m - m0);
        for (int64_t r = 0; r < rows; r += kQDotMaxRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kQDotMaxRows, rows - r));
          const int64_t row = m0 + r;
          const QuantizedActs acts{qs + row * k, ds + row * nb, ss + row * nb, k};
          fns[mr - 1](pc, acts, ybuf + r * kPackCols, kPackCols, kPackCols);
        }
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(y + (m0 + r) * n + n0, ybuf + r * kPackCols, cols * sizeof(float));
        }
      }
    }
  });
}

// Integer path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K): quantise X once, then register tiles of up to 4 X
// rows × 4 W rows; each thread owns a range of W row pairs and sweeps all X rows over them, kMBlock rows at a
// time.
void MatMulQDot(const float* x, int64_t m, int64_t k, const uint8_t* w, DType wt, size_t row_bytes, int64_t n,
                float* y, ThreadPool& pool) {
  const int64_t nb = k / kQK;
  thread_local std::vector<int8_t> qs;
  thread_local std::vector<float> ds, ss;
  qs.resize(static_cast<size_t>(m * k));
  ds.resize(static_cast<size_t>(m * nb));
  ss.resize(static_cast<size_t>(m * nb));
  int8_t* qsp = qs.data();
  float* dsp = ds.data();
  float* ssp = ss.data();
  pool.ParallelFor(m, Grain(8 * k), [&](int64_t b, int64_t e) {  // ~8 ops per value
    for (int64_t r = b; r < e; ++r) QuantizeActsRow(x + r * k, k, qsp + r * k, dsp + r * nb, ssp + r * nb);
  });

  if (m >= kPackedMinRows && HasPackedQDot(wt)) {
    MatMulPacked(qsp, dsp, ssp, m, k, w, wt, row_bytes, n, y, pool);
    return;
  }
  QDotTileFn fns[kQDotMaxRows];
  for (int mr = 1; mr <= kQDotMaxRows; ++mr) fns[mr - 1] = GetQDotTile(wt, mr);
  // Threads own blocks of kNBlock weight rows. A block's rows (kNBlock · row_bytes, ~12 KB for Q4_1 at
  // k = 576) stay in L1 while every X row sweeps over them; results go to a contiguous scratch tile first,
  // because Y rows n floats apart map to a handful of L1 sets when n is a multiple of a large power of two.
  const int64_t nblocks = (n + kNBlock - 1) / kNBlock;
  pool.ParallelFor(nblocks, Grain(kNBlock * k * m), [&](int64_t b, int64_t e) {
    float ybuf[kMBlock * kNBlock];
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t n0 = blk * kNBlock;
      const int64_t cols = std::min(kNBlock, n - n0);
      for (int64_t m0 = 0; m0 < m; m0 += kMBlock) {
        const int64_t rows = std::min(kMBlock, m - m0);
        for (int64_t c = 0; c < cols; c += kQDotCols) {
          const int nr = static_cast<int>(std::min<int64_t>(kQDotCols, cols - c));
          const uint8_t* wj = w + (n0 + c) * row_bytes;
          for (int64_t r = 0; r < rows; r += kQDotMaxRows) {
            const int mr = static_cast<int>(std::min<int64_t>(kQDotMaxRows, rows - r));
            const int64_t row = m0 + r;
            const QuantizedActs acts{qsp + row * k, dsp + row * nb, ssp + row * nb, k};
            fns[mr - 1](wj, row_bytes, nr, acts, ybuf + r * kNBlock + c, kNBlock);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(y + (m0 + r) * n + n0, ybuf + r * kNBlock, cols * sizeof(float));
        }
      }
    }
  });
}

}  // namespace

Status MatMul(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
              ThreadPool& pool) {
  if (m < 0 || k < 0 || n < 0) return InvalidArgumentError("MatMul: negative shape m={} k={} n={}", m, k, n);
  const DTypeInfo& info = GetDTypeInfo(wt);
  const bool supported = wt == DType::kF32 || wt == DType::kF16 || wt == DType::kBF16 || info.quantized;
  if (!supported) return InvalidArgumentError("MatMul: unsupported weight dtype {}", info.name);
  if (k % info.block_elems != 0) {
    return InvalidArgumentError("MatMul: k={} is not a multiple of the {} block size {}", k, info.name,
                                info.block_elems);
  }
  if (m == 0 || n == 0) return OkStatus();
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return OkStatus();
  }
  const auto* wb = static_cast<const uint8_t*>(w);
  const size_t row_bytes = static_cast<size_t>(k / info.block_elems) * info.block_bytes;
  if (wt == DType::kF32) {
    MatMulF32(x, m, k, static_cast<const float*>(w), n, y, pool);
    return OkStatus();
  }
  if (HasQDot(wt)) {
    MatMulQDot(x, m, k, wb, wt, row_bytes, n, y, pool);
    return OkStatus();
  }
  if (wt == DType::kF16 || wt == DType::kBF16) {
    MatMulHalf(x, m, k, static_cast<const uint16_t*>(w), wt, n, y, pool);
    return OkStatus();
  }
  return InvalidArgumentError("MatMul: no kernel for weight dtype {}", info.name);
}

}  // namespace stoke::cpu
