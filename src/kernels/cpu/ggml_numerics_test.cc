// ggml-compatible numerics against scalar restatements of ggml's CPU order (bit-exact), against double
// precision (close), and for the splitting invariances the decoder relies on (bit-exact). The end-to-end
// comparison with llama.cpp itself is tests/golden/test_smollm2_golden.py.
#include "kernels/cpu/ggml_numerics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/quants.h"

namespace stoke::cpu::ggml {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

float H(float x) {
  return Fp16ToFp32(Fp32ToFp16(x));
}

// ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3))
float Tree8(const float* l) {
  return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3]));
}

// Scalar ggml: quantize_row_q8_1 then ggml_vec_dot_q4_1_q8_1 / _q8_0_q8_0 (AVX2 order) for one row pair.
float ScalarGgmlDot(DType wt, const uint8_t* wrow, const float* x, int64_t k) {
  float acc[8] = {};
  float summs = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int q[32], sum = 0;
    for (int i = 0; i < 32; ++i) sum += (q[i] = static_cast<int>(std::nearbyint(xb[i] * id)));
    const float da = H(d), sa = H(d * static_cast<float>(sum));
    int w[32];
    float dw = 0.0f, mw = 0.0f;
    if (wt == DType::kQ4_1) {
      BlockQ4_1 blk;
      std::memcpy(&blk, wrow + b * sizeof(BlockQ4_1), sizeof(blk));
      dw = Fp16ToFp32(blk.d);
      mw = Fp16ToFp32(blk.m);
      for (int i = 0; i < 16; ++i) w[i] = blk.qs[i] & 15, w[i + 16] = blk.qs[i] >> 4;
    } else {
      BlockQ8_0 blk;
      std::memcpy(&blk, wrow + b * sizeof(BlockQ8_0), sizeof(blk));
      dw = Fp16ToFp32(blk.d);
      for (int i = 0; i < 32; ++i) w[i] = blk.qs[i];
    }
    if (wt == DType::kQ4_1) summs = std::fma(mw, sa, summs);
    const float dd = dw * da;
    for (int l = 0; l < 8; ++l) {
      int p = 0;
      for (int j = 0; j < 4; ++j) p += w[4 * l + j] * q[4 * l + j];
      acc[l] = std::fma(dd, static_cast<float>(p), acc[l]);
    }
  }
  return Tree8(acc) + summs;
}

std::vector<uint8_t> QuantizeMatrix(DType wt, const std::vector<float>& w, int64_t n, int64_t k) {
  const size_t row_bytes = k / 32 * (wt == DType::kQ4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ8_0));
  std::vector<uint8_t> out(row_bytes * n);
  for (int64_t r = 0; r < n; ++r) {
    if (wt == DType::kQ4_1) {
      QuantizeRowQ4_1(w.data() + r * k, out.data() + r * row_bytes, k);
    } else {
      QuantizeRowQ8_0(w.data() + r * k, out.data() + r * row_bytes, k);
    }
  }
  return out;
}

TEST(GgmlNumericsTest, MatMulIsGgmlOrderBitForBit) {
  std::mt19937 rng(1);
  ThreadPool pool(3);
  for (DType wt : {DType::kQ4_1, DType::kQ8_0}) {
    const int64_t m = 6, k = 160, n = 21;  // n not a multiple of 8: a partial packed group
    const std::vector<float> wf = RandomFloats(n * k, rng, 0.05f);
    std::vector<float> x = RandomFloats(m * k, rng);
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block (d = 0)
    const std::vector<uint8_t> w = QuantizeMatrix(wt, wf, n, k);
    const size_t row_bytes = w.size() / n;
    std::vector<float> y(m * n, NAN);
    ASSERT_TRUE(MatMul(x.data(), m, k, w.data(), wt, n, y.data(), pool).ok());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        EXPECT_EQ(y[r * n + c], ScalarGgmlDot(wt, w.data() + c * row_bytes, x.data() + r * k, k))
            << GetDTypeInfo(wt).name << " row " << r << " col " << c;
      }
    }
    // One row at a time: the same bits.
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> one(n);
      ASSERT_TRUE(MatMul(x.data() + r * k, 1, k, w.data(), wt, n, one.data(), pool).ok());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), y.begin() + r * n));
    }
  }
  std::vector<float> y(4);
  EXPECT_FALSE(MatMul(y.data(), 1, 4, y.data(), DType::kQ4_K, 1, y.data(), pool).ok());
  EXPECT_FALSE(MatMul(y.data(), 1, 33, y.data(), DType::kQ8_0, 1, y.data(), pool).ok());
}

TEST(GgmlNumericsTest, RmsNormSumsSquaresInDouble) {
  std::mt19937 rng(2);
  const int64_t dim = 576;
  const std::vector<float> x = RandomFloats(2 * dim, rng, 3.0f), w = RandomFloats(dim, rng);
  std::vector<float> y(2 * dim);
  RmsNorm(x.data(), w.data(), 2, dim, 1e-5f, y.data());
  for (int r = 0; r < 2; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const float sq = x[r * dim + i] * x[r * dim + i];
      sum += sq;
    }
    const float mean = static_cast<float>(sum / dim);
    const float scale = 1.0f / std::sqrt(mean + 1e-5f);
    for (int64_t i = 0; i < dim; ++i) {
      const float s = x[r * dim + i] * scale;
      ASSERT_EQ(y[r * dim + i], s * w[i]) << i;
    }
  }
}

TEST(GgmlNumericsTest, ExpIsAccurateAndSaturates) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(0.0f);
  std::vector<float> y(x.size());
  ExpF(x.data(), static_cast<int64_t>(x.size()), y.data());
  for (size_t i = 0; i + 2 < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    if (want > 1e-37) {
      ASSERT_NEAR(y[i] / want, 1.0, 4e-7) << x[i];
    } else {
      ASSERT_LE(y[i], 1e-37f) << x[i];  // subnormal range: flushed or tiny
    }
  }
  EXPECT_EQ(y[x.size() - 2], 0.0f);
  EXPECT_EQ(y[x.size() - 1], 1.0f);
}

TEST(GgmlNumericsTest, SwiGluAndRopeAreClose) {
  std::mt19937 rng(3);
  const std::vector<float> g = RandomFloats(37, rng, 4.0f), u = RandomFloats(37, rng);
  std::vector<float> y(37);
  SwiGlu(g.data(), u.data(), 37, y.data());
  for (int i = 0; i < 37; ++i) {
    const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
    EXPECT_NEAR(y[i], want, 1e-6 * (1 + std::fabs(want))) << i;
  }
  const int heads = 2, hd = 8, tokens = 3;
  std::vector<float> x = RandomFloats(tokens * heads * hd, rng);
  const std::vector<float> x0 = x;
  const int32_t pos[tokens] = {0, 5, 1000};
  RopeParams p;
  p.freq_base = 10000.0f;
  Rope(x.data(), pos, tokens, heads, hd, p);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double ang = pos[t] * std::pow(10000.0, -2.0 * i / hd);
        const int a = (t * heads + h) * hd + i, b = a + hd / 2;
        EXPECT_NEAR(x[a], x0[a] * std::cos(ang) - x0[b] * std::sin(ang), 2e-3);  // fp32 angles at pos 1000
        EXPECT_NEAR(x[b], x0[a] * std::sin(ang) + x0[b] * std::cos(ang), 2e-3);
        if (pos[t] == 0) {
          EXPECT_EQ(x[a], x0[a]);
        }
      }
    }
  }
}

// Scalar ggml attention for query token i: the tinyBLAS order (tiny) or ggml_vec_dot_f16's.
std::vector<float> ScalarGgmlAttention(const std::vector<float>& q16,
                                       const std::vector<std::vector<float>>& k16,
                                       const std::vector<std::vector<float>>& v16, float scale, bool tiny) {
  const int hd = static_cast<int>(q16.size());
  const int64_t ctx = static_cast<int64_t>(k16.size());
  auto dot = [&](auto get_x, auto get_y, int64_t n) {
    if (tiny) {
      float l[8] = {};
      for (int64_t i = 0; i < n; ++i) l[i % 8] = std::fma(get_x(i), get_y(i), l[i % 8]);
      return Tree8(l);
    }
    float a[32] = {};
    const int64_t np = n / 32 * 32;
    for (int64_t i = 0; i < np; ++i) a[i % 32] = std::fma(get_x(i), get_y(i), a[i % 32]);
    float b[8];
    for (int l = 0; l < 8; ++l) b[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    const float t0 = b[0] + b[4], t1 = b[1] + b[5], t2 = b[2] + b[6], t3 = b[3] + b[7];
    double s = (t0 + t1) + (t2 + t3);
    for (int64_t i = np; i < n; ++i) s += static_cast<double>(get_x(i) * get_y(i));
    return static_cast<float>(s);
  };
  std::vector<float> s(ctx);
  for (int64_t t = 0; t < ctx; ++t) {
    s[t] = dot([&](int64_t c) { return q16[c]; }, [&](int64_t c) { return k16[t][c]; }, hd) * scale;
  }
  const float mx = *std::max_element(s.begin(), s.end());
  const int64_t ctx8 = (ctx + 7) / 8 * 8;
  std::vector<float> in(ctx8, 0.0f), e(ctx8);
  for (int64_t t = 0; t < ctx; ++t) in[t] = s[t] - mx;
  ExpF(in.data(), ctx8, e.data());
  std::fill(e.begin() + ctx, e.end(), 0.0f);  // masked: exp(-inf)
  double sum = 0;
  for (int64_t t0 = 0; t0 < ctx8; t0 += 8) sum += Tree8(e.data() + t0);
  const float inv = static_cast<float>(1.0 / sum);
  const int64_t padded = (ctx + 255) / 256 * 256;  // llama.cpp's KV view, zeros beyond ctx
  std::vector<float> p(padded, 0.0f);
  for (int64_t t = 0; t < ctx; ++t) p[t] = H(e[t] * inv);
  std::vector<float> out(hd);
  for (int c = 0; c < hd; ++c) {
    out[c] =
        dot([&](int64_t t) { return p[t]; }, [&](int64_t t) { return t < ctx ? v16[t][c] : 0.0f; }, padded);
  }
  return out;
}

struct AttnCase {
  int heads = 6, kv_heads = 2, hd = 64, bs = 4;
  int64_t len = 45;
  std::vector<float> q, k, v;  // [len, heads | kv_heads, hd], HF order
};

// Runs the whole sequence through the paged cache in chunks (sizes from `chunks`), block table `table`.
std::vector<float> RunPaged(const AttnCase& a, const std::vector<int64_t>& chunks,
                            const std::vector<int32_t>& table, bool interleave, ThreadPool& pool) {
  const int num_blocks = 32;
  const int64_t row = int64_t{a.kv_heads} * a.hd;
  std::vector<float> kc(num_blocks * a.bs * row, NAN), vc(num_blocks * a.bs * row, NAN);
  const PagedKvLayer kv{kc.data(), vc.data(), num_blocks, a.bs, a.kv_heads, a.hd};
  std::vector<float> out(a.len * a.heads * a.hd, NAN);
  int64_t start = 0;
  for (int64_t n : chunks) {
    std::vector<int32_t> slots(n);
    for (int64_t i = 0; i < n; ++i) slots[i] = table[(start + i) / a.bs] * a.bs + (start + i) % a.bs;
    WriteKv(kv, a.k.data() + start * row, a.v.data() + start * row, slots.data(), n, interleave);
    PagedAttention(a.q.data() + start * a.heads * a.hd, n, a.heads, static_cast<int32_t>(start), table.data(),
                   kv, 0.125f, interleave, out.data() + start * a.heads * a.hd, pool);
    start += n;
  }
  return out;
}

TEST(GgmlNumericsTest, AttentionIsGgmlOrderAndSplitInvariant) {
  std::mt19937 rng(4);
  ThreadPool pool(3);
  AttnCase a;
  a.q = RandomFloats(a.len * a.heads * a.hd, rng, 2.0f);
  a.k = RandomFloats(a.len * a.kv_heads * a.hd, rng, 2.0f);
  a.v = RandomFloats(a.len * a.kv_heads * a.hd, rng);
  std::vector<int32_t> table(12);
  std::iota(table.begin(), table.end(), 0);
  for (bool interleave : {false, true}) {
    // Prefill 40 tokens (tinyBLAS order), then 5 decodes (vec_dot_f16 order).
    const std::vector<float> got = RunPaged(a, {40, 1, 1, 1, 1, 1}, table, interleave, pool);
    const int hd = a.hd, half = hd / 2;
    auto gguf_order = [&](const float* src) {  // fp16-rounded, in llama.cpp's element order
      std::vector<float> o(hd);
      for (int e = 0; e < hd; ++e) o[interleave ? (e < half ? 2 * e : 2 * (e - half) + 1) : e] = H(src[e]);
      return o;
    };
    for (int64_t i : {0, 1, 7, 8, 39, 40, 44}) {
      for (int h : {0, 3, 5}) {
        const int kvh = h / (a.heads / a.kv_heads);
        std::vector<std::vector<float>> k16, v16;
        for (int64_t t = 0; t <= i; ++t) {
          k16.push_back(gguf_order(a.k.data() + (t * a.kv_heads + kvh) * hd));
          std::vector<float> vr(a.v.begin() + (t * a.kv_heads + kvh) * hd,
                                a.v.begin() + (t * a.kv_heads + kvh + 1) * hd);
          for (float& f : vr) f = H(f);
          v16.push_back(vr);
        }
        const std::vector<float> want =
            ScalarGgmlAttention(gguf_order(a.q.data() + (i * a.heads + h) * hd), k16, v16, 0.125f, i < 40);
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + (i * a.heads + h) * hd))
            << "token " << i << " head " << h << " interleave " << interleave;
      }
    }
    // Prefill chunks of >= 2 tokens and any block placement: the same bits.
    std::vector<int32_t> shuffled(32);
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    shuffled.resize(12);
    EXPECT_EQ(RunPaged(a, {3, 9, 2, 26, 1, 1, 1, 1, 1}, shuffled, interleave, pool), got);
  }
}

TEST(GgmlNumericsTest, AttentionIsCloseToExact) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  AttnCase a;
  a.hd = 20;  // not a multiple of 8: the scalar tails
  a.q = RandomFloats(a.len * a.heads * a.hd, rng);
  a.k = RandomFloats(a.len * a.kv_heads * a.hd, rng);
  a.v = RandomFloats(a.len * a.kv_heads * a.hd, rng);
  std::vector<int32_t> table(12);
  std::iota(table.begin(), table.end(), 0);
  const std::vector<float> got = RunPaged(a, {30, 1, 14}, table, false, pool);
  double num = 0, den = 0;
  const int group = a.heads / a.kv_heads;
  for (int64_t i = 0; i < a.len; ++i) {
    for (int h = 0; h < a.heads; ++h) {
      std::vector<double> s(i + 1);
      for (int64_t t = 0; t <= i; ++t) {
        double d = 0;
        for (int c = 0; c < a.hd; ++c)
          d += double{a.q[(i * a.heads + h) * a.hd + c]} * a.k[(t * a.kv_heads + h / group) * a.hd + c];
        s[t] = d * 0.125;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int c = 0; c < a.hd; ++c) {
        double o = 0;
        for (int64_t t = 0; t <= i; ++t) o += s[t] / sum * a.v[(t * a.kv_heads + h / group) * a.hd + c];
        const double g = got[(i * a.heads + h) * a.hd + c];
        num += (g - o) * (g - o);
        den += o * o;
      }
    }
  }
  EXPECT_LT(std::sqrt(num / den), 2e-3);  // fp16 K, V, Q and probabilities
}

}  // namespace
}  // namespace stoke::cpu::ggml
