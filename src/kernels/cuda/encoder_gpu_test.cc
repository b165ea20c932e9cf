// The encoder kernels (encoder.h) against CPU references on random inputs, outputs poisoned (NaN) first:
// variable-length bidirectional attention vs cpu::EncoderAttention per sequence, the fused LayerNorms and the
// pooling vs straightforward host loops. Skipped when no GPU is present.
#include <cmath>
#include <cstdio>

#include "base/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gpu_test_util.h"

namespace stoke::cuda {
namespace {

using testing::DeviceBuffer;
using testing::FromBf16;
using testing::kTolBf16;
using testing::RandomFloats;
using testing::RoundBf16;
using testing::ToBf16;

// key_growth > 0 scales key row r of each sequence by 1 + key_growth r: the scores grow along the sequence,
// so the tiled kernels' running max moves by more than their lazy threshold (2^8) from key tile to key tile.
void CheckAttention(int heads, int hd, const std::vector<int32_t>& lens, uint32_t seed,
                    float key_growth = 0.f) {
  const int64_t hidden = int64_t{heads} * hd;
  std::vector<int32_t> cu(lens.size() + 1, 0);
  int max_len = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    cu[s + 1] = cu[s] + lens[s];
    max_len = std::max(max_len, lens[s]);
  }
  const int64_t t = cu.back();
  // Scores of a few units (values in [-2, 2]) so softmax is neither flat nor one-hot.
  auto qkv = RandomFloats(t * 3 * hidden, seed, -2.f, 2.f);
  for (size_t s = 0; s < lens.size() && key_growth > 0.f; ++s) {
    for (int64_t r = 0; r < lens[s]; ++r) {
      float* k = qkv.data() + (cu[s] + r) * 3 * hidden + hidden;
      for (int64_t i = 0; i < hidden; ++i) k[i] *= 1.f + key_growth * static_cast<float>(r);
    }
  }
  qkv = RoundBf16(qkv);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  std::vector<float> want(t * hidden);
  ThreadPool pool(1);
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t len = lens[s];
    std::vector<float> q(len * hidden), k(len * hidden), v(len * hidden), o(len * hidden);
    for (int64_t r = 0; r < len; ++r) {
      const float* row = qkv.data() + (cu[s] + r) * 3 * hidden;
      std::copy(row, row + hidden, q.begin() + r * hidden);
      std::copy(row + hidden, row + 2 * hidden, k.begin() + r * hidden);
      std::copy(row + 2 * hidden, row + 3 * hidden, v.begin() + r * hidden);
    }
    cpu::EncoderAttention(q.data(), k.data(), v.data(), len, heads, hd, scale, o.data(), pool);
    std::copy(o.begin(), o.end(), want.begin() + cu[s] * hidden);
  }
  DeviceBuffer<uint16_t> dqkv(ToBf16(qkv));
  DeviceBuffer<int32_t> dcu(cu);
  for (EncoderAttentionImpl impl : {EncoderAttentionImpl::kTensorCoreAuto,
                                    EncoderAttentionImpl::kTensorCoreWide, EncoderAttentionImpl::kTensorCore,
                                    EncoderAttentionImpl::kVectorized, EncoderAttentionImpl::kSimple}) {
    DeviceBuffer<uint16_t> out(t * hidden);  // poisoned
    STATUS_ASSERT(EncoderAttention(dqkv.bf16(), dcu.get(), static_cast<int>(lens.size()), max_len, heads, hd,
                                   scale, out.bf16(), nullptr, impl));
    char what[128];
    std::snprintf(what, sizeof(what), "encoder attention (%s) heads %d hd %d, %zu seqs up to %d",
                  impl == EncoderAttentionImpl::kSimple           ? "simple"
                  : impl == EncoderAttentionImpl::kTensorCore     ? "tensor core"
                  : impl == EncoderAttentionImpl::kTensorCoreWide ? "tensor core, 32 rows per warp"
                  : impl == EncoderAttentionImpl::kTensorCoreAuto ? "tensor core, rows per warp by size"
                                                                  : "vectorized",
                  heads, hd, lens.size(), max_len);
    EXPECT_CLOSE(FromBf16(out.Download()), want, kTolBf16, what);
  }
}

TEST(CudaEncoder, AttentionMatchesCpuPerSequence) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> lens = {1, 2, 15, 16, 17, 63, 64, 65, 128, 129, 200};
  CheckAttention(2, 64, lens, 1);
  CheckAttention(3, 32, lens, 2);
  CheckAttention(2, 96, lens, 3);
  CheckAttention(2, 128, lens, 4);
  CheckAttention(12, 64, {384, 7, 512}, 5);
  // Scores growing along the sequence (keys up to ~25x larger at 384): the running max keeps moving, so the
  // lazily rescaled accumulators must be rescaled right.
  CheckAttention(4, 64, {384, 100, 200}, 6, 1.f / 16);
  CheckAttention(2, 128, {300, 65}, 7, 1.f / 16);
  EXPECT_EQ(EncoderAttention(nullptr, nullptr, 1, 1, 1, 48, 1.f, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
  // 32 rows per warp doubles the accumulators: head_dim 128 refuses it (EncoderAttention then runs 16).
  EXPECT_EQ(EncoderAttentionTiled(nullptr, nullptr, 1, 1, 1, 128, 1.f, nullptr, nullptr, 32).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncoderAttentionTiled(nullptr, nullptr, 1, 1, 1, 64, 1.f, nullptr, nullptr, 24).code(),
            StatusCode::kInvalidArgument);
}

// kTensorCoreAuto's choice: 32 query rows per warp once the call has kWideTilesPerSm tiles of 128 queries per
// SM (BERT-large s384 from batch 32 on a 132-SM H100, BERT-base s128 from 128), else 16; head_dim 128
// always 16.
TEST(CudaEncoder, AutoAttentionWidensOnlyLargeCalls) {
  using I = EncoderAttentionImpl;
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 8, 384, 16, 64, 132), 16);    // 384 tiles
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 32, 384, 16, 64, 132), 32);   // 1536
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 32, 128, 12, 64, 132), 16);   // 384
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 128, 128, 12, 64, 132), 32);  // 1536
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 22, 384, 16, 64, 132), 32);   // 1056 = 8 x 132
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 21, 384, 16, 64, 132), 16);   // 1008
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreAuto, 256, 384, 8, 128, 132), 16);  // head_dim 128
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCoreWide, 1, 16, 1, 64, 132), 32);
  EXPECT_EQ(EncoderAttentionWarpRows(I::kTensorCore, 256, 384, 16, 64, 132), 16);
}

// Host reference of LayerNorm over one row, in double.
void LayerNormRow(std::vector<double>& x, const std::vector<float>& g, const std::vector<float>& b,
                  float eps) {
  const size_t n = x.size();
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  for (size_t i = 0; i < n; ++i) x[i] = (x[i] - mean) / std::sqrt(var + eps) * g[i] + b[i];
}

TEST(CudaEncoder, EmbeddingAndResidualLayerNorms) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 300, max_pos = 64, dim = 384, rows = 37;
  const float eps = 1e-12f;
  const auto word = RoundBf16(RandomFloats(vocab * dim, 11));
  const auto pos = RoundBf16(RandomFloats(max_pos * dim, 12));
  const auto type0 = RandomFloats(dim, 13), g = RandomFloats(dim, 14, 0.5f, 1.5f), b = RandomFloats(dim, 15);
  std::vector<int32_t> ids(rows), positions(rows);
  for (int64_t r = 0; r < rows; ++r) {
    ids[r] = static_cast<int32_t>((r * 131) % vocab);
    positions[r] = static_cast<int32_t>(r % max_pos);
  }
  std::vector<float> want(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x(dim);
    for (int64_t i = 0; i < dim; ++i)
      x[i] = double(word[ids[r] * dim + i]) + pos[positions[r] * dim + i] + type0[i];
    LayerNormRow(x, g, b, eps);
    for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = static_cast<float>(x[i]);
  }
  DeviceBuffer<uint16_t> dw(ToBf16(word)), dp(ToBf16(pos)), xb(rows * dim);
  DeviceBuffer<float> dt(type0), dg(g), db(b), x(rows * dim);
  DeviceBuffer<int32_t> di(ids), dpos(positions);
  STATUS_ASSERT(EmbeddingLayerNorm(dw.bf16(), vocab, dp.bf16(), max_pos, dt.get(), dg.get(), db.get(),
                                   di.get(), dpos.get(), rows, dim, eps, x.get(), xb.bf16(), nullptr));
  EXPECT_CLOSE(x.Download(), want, 1e-5, "embedding layernorm fp32");
  EXPECT_CLOSE(FromBf16(xb.Download()), want, kTolBf16, "embedding layernorm bf16 copy");

  // x = LN(y + bias + x) on the result.
  const auto y = RandomFloats(rows * dim, 16, -3.f, 3.f), bias = RandomFloats(dim, 17);
  const std::vector<float> x0 = x.Download();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> v(dim);
    for (int64_t i = 0; i < dim; ++i) v[i] = double(y[r * dim + i]) + bias[i] + x0[r * dim + i];
    LayerNormRow(v, g, b, eps);
    for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = static_cast<float>(v[i]);
  }
  DeviceBuffer<float> dy(y), dbias(bias);
  STATUS_ASSERT(BiasResidualLayerNorm(dy.get(), dbias.get(), x.get(), dg.get(), db.get(), rows, dim, eps,
                                      xb.bf16(), nullptr));
  EXPECT_CLOSE(x.Download(), want, 1e-5, "bias residual layernorm fp32");
  EXPECT_CLOSE(FromBf16(xb.Download()), want, kTolBf16, "bias residual layernorm bf16 copy");
}

// x = bf16(LN(y + x)) in place with bf16 y and x (the fused-epilogue path), at the hidden sizes of MiniLM,
// BERT-base, BERT-large and the largest it takes, 37 rows (not a multiple of the 4 rows a block); then the
// bf16 mean pooling against the fp32 one on the same values.
TEST(CudaEncoder, ResidualLayerNormBf16AndBf16Pooling) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 37;
  const float eps = 1e-12f;
  for (int64_t dim : {384, 768, 1024, 2048}) {
    const auto y = RoundBf16(RandomFloats(rows * dim, 21, -3.f, 3.f));
    const auto x0 = RoundBf16(RandomFloats(rows * dim, 22, -2.f, 2.f));
    const auto g = RandomFloats(dim, 23, 0.5f, 1.5f), b = RandomFloats(dim, 24);
    std::vector<float> want(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> v(dim);
      for (int64_t i = 0; i < dim; ++i) v[i] = double(y[r * dim + i]) + x0[r * dim + i];
      LayerNormRow(v, g, b, eps);
      for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = static_cast<float>(v[i]);
    }
    DeviceBuffer<uint16_t> dy(ToBf16(y)), dx(ToBf16(x0));
    DeviceBuffer<float> dg(g), db(b);
    STATUS_ASSERT(ResidualLayerNormBf16(dy.bf16(), dx.bf16(), dg.get(), db.get(), rows, dim, eps, nullptr));
    const std::vector<float> got = FromBf16(dx.Download());
    char what[64];
    std::snprintf(what, sizeof(what), "residual layernorm bf16, dim %lld", static_cast<long long>(dim));
    EXPECT_CLOSE(got, want, kTolBf16, what);

    const std::vector<int32_t> cu = {0, 1, 20, 37};
    DeviceBuffer<int32_t> dcu(cu);
    DeviceBuffer<float> xf(got), p16(3 * dim), p32(3 * dim);
    STATUS_ASSERT(MeanPoolNormalize(dx.bf16(), dcu.get(), 3, dim, p16.get(), nullptr));
    STATUS_ASSERT(MeanPoolNormalize(xf.get(), dcu.get(), 3, dim, p32.get(), nullptr));
    EXPECT_CLOSE(p16.Download(), p32.Download(), 1e-5, "bf16 pooling");
  }
  DeviceBuffer<uint16_t> d(8 * 1000);
  DeviceBuffer<float> dg(1000), db(1000);
  EXPECT_FALSE(ResidualLayerNormBf16(d.bf16(), d.bf16(), dg.get(), db.get(), 8, 1000 + 4, eps, nullptr).ok());
  EXPECT_FALSE(ResidualLayerNormBf16Supports(4096));
}

TEST(CudaEncoder, AddBiasAndMeanPoolNormalize) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 50, dim = 96;
  // Widths a multiple of 8 take the vectorised kernel, others the scalar one.
  for (const auto& [d, seed] : {std::pair<int64_t, uint32_t>{dim, 21}, {100, 24}}) {
    const auto x = RoundBf16(RandomFloats(rows * d, seed)), bias = RandomFloats(d, seed + 1);
    std::vector<float> want(rows * d);
    for (int64_t i = 0; i < rows * d; ++i) want[i] = x[i] + bias[i % d];
    DeviceBuffer<uint16_t> dx(ToBf16(x));
    DeviceBuffer<float> db(bias);
    STATUS_ASSERT(AddBias(dx.bf16(), db.get(), rows, d, nullptr));
    EXPECT_CLOSE(FromBf16(dx.Download()), want, kTolBf16, ("add bias, width " + std::to_string(d)).c_str());
  }

  const std::vector<int32_t> cu = {0, 1, 8, 8 + 33, 50};
  const auto act = RandomFloats(rows * dim, 23);
  std::vector<float> pooled(4 * dim);
  for (int s = 0; s < 4; ++s) {
    std::vector<double> m(dim, 0.0);
    for (int r = cu[s]; r < cu[s + 1]; ++r) {
      for (int64_t i = 0; i < dim; ++i) m[i] += act[r * dim + i];
    }
    double sq = 0;
    for (double& v : m) {
      v /= (cu[s + 1] - cu[s]);
      sq += v * v;
    }
    for (int64_t i = 0; i < dim; ++i) pooled[s * dim + i] = static_cast<float>(m[i] / std::sqrt(sq));
  }
  DeviceBuffer<float> da(act), out(4 * dim);
  DeviceBuffer<int32_t> dcu(cu);
  STATUS_ASSERT(MeanPoolNormalize(da.get(), dcu.get(), 4, dim, out.get(), nullptr));
  EXPECT_CLOSE(out.Download(), pooled, 1e-5, "mean pool + l2 normalise");
}

}  // namespace
}  // namespace stoke::cuda
