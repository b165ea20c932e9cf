// PagedAttention against dense causal attention in double, through randomly permuted block tables, with GQA
// and chunked prefill; EncoderAttention against dense bidirectional attention.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace stoke::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> RandomFloats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Query token i (q = [n, heads, hd]) at position start + i attends to keys [0, start + i] (causal) or to all
// `len` keys (causal == false). k, v = [len, kv_heads, hd].
std::vector<double> DenseAttention(const std::vector<float>& q, int64_t n, int heads, int64_t start,
                                   const std::vector<float>& k, const std::vector<float>& v, int64_t len,
                                   int kv_heads, int hd, double scale, bool causal) {
  std::vector<double> out(n * heads * hd, 0.0);
  const int group = heads / kv_heads;
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / group;
      const int64_t ctx = causal ? start + i + 1 : len;
      std::vector<double> s(ctx);
      for (int64_t p = 0; p < ctx; ++p) {
        double d = 0;
        for (int c = 0; c < hd; ++c)
          d += double{q[(i * heads + h) * hd + c]} * k[(p * kv_heads + kvh) * hd + c];
        s[p] = d * scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t p = 0; p < ctx; ++p) {
        for (int c = 0; c < hd; ++c)
          out[(i * heads + h) * hd + c] += s[p] / sum * v[(p * kv_heads + kvh) * hd + c];
      }
    }
  }
  return out;
}

struct PagedCase {
  int heads, kv_heads, head_dim, block_size;
  int64_t start_pos, n;
};

class PagedAttentionTest : public ::testing::TestWithParam<PagedCase> {};

TEST_P(PagedAttentionTest, MatchesDenseCausal) {
  const PagedCase c = GetParam();
  std::mt19937 rng(c.block_size * 1000 + c.start_pos * 10 + c.n);
  const int64_t total = c.start_pos + c.n;
  const int64_t logical_blocks = (total + c.block_size - 1) / c.block_size;
  const int num_blocks =
      static_cast<int>(logical_blocks) + 5;  // spare blocks stay NaN: reading them fails the test
  // A random permutation of the physical blocks: logical block j lives in physical block table[j].
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> table(perm.begin(), perm.begin() + logical_blocks);

  const int64_t slot_floats = int64_t{c.kv_heads} * c.head_dim;
  std::vector<float> kcache(num_blocks * c.block_size * slot_floats, kNaN);
  std::vector<float> vcache(kcache.size(), kNaN);
  const PagedKvLayer kv{kcache.data(), vcache.data(), num_blocks, c.block_size, c.kv_heads, c.head_dim};

  const std::vector<float> k = RandomFloats(total * slot_floats, rng),
                           v = RandomFloats(total * slot_floats, rng);
  const std::vector<float> q = RandomFloats(c.n * c.heads * c.head_dim, rng);
  std::vector<int32_t> slots(total);
  for (int64_t p = 0; p < total; ++p) slots[p] = table[p / c.block_size] * c.block_size + p % c.block_size;
  // The earlier chunk (the prefix), then this chunk's own keys, as the engine does; a -1 slot is skipped.
  WriteKv(kv, k.data(), v.data(), slots.data(), c.start_pos);
  std::vector<int32_t> chunk_slots(slots.begin() + c.start_pos, slots.end());
  chunk_slots.push_back(-1);
  std::vector<float> kpad(k.begin() + c.start_pos * slot_floats, k.end()),
      vpad(v.begin() + c.start_pos * slot_floats, v.end());
  kpad.resize(kpad.size() + slot_floats, kNaN);
  vpad.resize(vpad.size() + slot_floats, kNaN);
  WriteKv(kv, kpad.data(), vpad.data(), chunk_slots.data(), c.n + 1);

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> out(q.size(), kNaN);
  ThreadPool pool(2);
  PagedAttention(q.data(), c.n, c.heads, static_cast<int32_t>(c.start_pos), table.data(), kv, scale,
                 out.data(), pool);
  const std::vector<double> want =
      DenseAttention(q, c.n, c.heads, c.start_pos, k, v, total, c.kv_heads, c.head_dim, scale, true);
  EXPECT_LT(RelL2(out, want), 1e-5);

  // Chunking does not matter: the same queries one token at a time give the same values.
  for (int64_t i = 0; i < c.n; i += std::max<int64_t>(1, c.n / 3)) {
    std::vector<float> one(c.heads * c.head_dim, kNaN);
    PagedAttention(q.data() + i * c.heads * c.head_dim, 1, c.heads, static_cast<int32_t>(c.start_pos + i),
                   table.data(), kv, scale, one.data(), pool);
    for (size_t e = 0; e < one.size(); ++e)
      EXPECT_EQ(one[e], out[i * c.heads * c.head_dim + e]) << "token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Values(
                             // SmolLM2: 9 query heads over 3 KV heads, head_dim 64.
                             PagedCase{9, 3, 64, 16, 0, 1}, PagedCase{9, 3, 64, 16, 0, 37},
                             PagedCase{9, 3, 64, 16, 40, 13}, PagedCase{9, 3, 64, 16, 100, 1},
                             PagedCase{9, 3, 64, 7, 0, 20}, PagedCase{9, 3, 64, 7, 23, 9},
                             PagedCase{9, 3, 64, 7, 70, 1},
                             // MHA, odd head_dim (no full 8-lane vector tail) and one-slot blocks.
                             PagedCase{4, 4, 20, 1, 5, 6}, PagedCase{8, 2, 128, 16, 16, 16},
                             // GQA groups above 4 query heads run in chunks of 4: 8 = 4 + 4, 5 = 4 + 1.
                             PagedCase{8, 1, 64, 16, 10, 5}, PagedCase{10, 2, 32, 16, 3, 4}));

TEST(EncoderAttentionTest, MatchesDenseBidirectional) {
  std::mt19937 rng(77);
  for (int64_t len : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{130}}) {
    const int heads = 12, hd = 32;
    const std::vector<float> q = RandomFloats(len * heads * hd, rng), k = RandomFloats(len * heads * hd, rng),
                             v = RandomFloats(len * heads * hd, rng);
    const float scale = 1.0f / std::sqrt(float{hd});
    std::vector<float> out(q.size(), kNaN);
    ThreadPool pool(2);
    EncoderAttention(q.data(), k.data(), v.data(), len, heads, hd, scale, out.data(), pool);
    const std::vector<double> want = DenseAttention(q, len, heads, 0, k, v, len, heads, hd, scale, false);
    EXPECT_LT(RelL2(out, want), 1e-5) << len;
  }
}

}  // namespace
}  // namespace stoke::cpu
