#include "engine/model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "engine/model/llama_test_util.h"
#include "kernels/cpu/quants.h"

namespace stoke {
namespace {

using testing::RelErr;
using testing::TinyLlama;

double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

std::vector<int32_t> RandomIds(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = d(rng);
  return ids;
}

// Re-encodes every matrix as SmolLM2's GGUF does: Q4_1 in the layers, Q8_0 for the embedding and head.
void QuantizeLikeSmolLm2(LlamaWeights* w) {
  auto quantize = [w](LinearWeight* lw, DType t) {
    if (lw->empty()) return;
    const DTypeInfo& info = GetDTypeInfo(t);
    const size_t row_bytes = lw->cols / info.block_elems * info.block_bytes;
    auto buf = std::make_unique<uint8_t[]>(row_bytes * lw->rows);
    const auto* src = static_cast<const float*>(lw->data);
    for (int64_t r = 0; r < lw->rows; ++r) {
      if (t == DType::kQ4_1) {
        cpu::QuantizeRowQ4_1(src + r * lw->cols, buf.get() + r * row_bytes, lw->cols);
      } else {
        cpu::QuantizeRowQ8_0(src + r * lw->cols, buf.get() + r * row_bytes, lw->cols);
      }
    }
    *lw = LinearWeight{buf.get(), t, lw->rows, lw->cols};
    w->owned.push_back(std::move(buf));
  };
  const bool tied = w->lm_head.data == w->embedding.data;
  quantize(&w->embedding, DType::kQ8_0);
  if (tied) {
    w->lm_head = w->embedding;
  } else {
    quantize(&w->lm_head, DType::kQ8_0);
  }
  for (LlamaLayerWeights& l : w->layers) {
    for (LinearWeight* lw : {&l.qkv, &l.q, &l.k, &l.v, &l.o, &l.gate_up, &l.gate, &l.up, &l.down}) {
      quantize(lw, DType::kQ4_1);
    }
  }
}

std::unique_ptr<CpuLlama> MakeModel(const TinyLlama& m, bool fuse, int blocks = 64, int block_size = 4,
                                    bool ggml = false, bool interleaved = false, bool quantize = false) {
  LlamaWeights w = m.ToWeights(fuse);
  w.gguf_qk_interleaved = interleaved;
  if (ggml || quantize) QuantizeLikeSmolLm2(&w);
  auto model = CpuLlama::Create(std::move(w), nullptr, ggml);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE((*model)->AllocateKvCache(blocks, block_size).ok());
  return std::move(model).value();
}

// One sequence, identity block table, positions [start, start + n), logits as asked; poisons output first.
StepOutput RunSeq(CpuLlama& model, const std::vector<int32_t>& ids, int start, std::vector<int32_t> table,
                  StepSequence::Logits logits = StepSequence::Logits::kAll) {
  StepInput in;
  in.token_ids = ids;
  StepSequence s;
  s.token_begin = 0;
  s.num_tokens = static_cast<int32_t>(ids.size());
  s.start_pos = start;
  s.block_table = std::move(table);
  s.logits = logits;
  in.sequences.push_back(s);
  StepOutput out;
  out.logits.assign(7, NAN);
  Status st = model.Step(in, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

std::vector<int32_t> Iota(int n, int from = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(CpuLlamaTest, MatchesDoublePrecisionReference) {
  for (bool fuse : {true, false}) {
    for (bool tied : {false, true}) {
      for (bool bias : {false, true}) {
        TinyLlama m(7 + tied + 2 * bias, tied, bias);
        auto model = MakeModel(m, fuse);
        const std::vector<int32_t> ids = RandomIds(23, m.c.vocab_size, 11);
        StepOutput out = RunSeq(*model, ids, 0, Iota(8));
        ASSERT_EQ(out.num_rows, 23);
        EXPECT_LT(RelErr(out.logits, m.Reference(ids)), 2e-5)
            << "fuse " << fuse << " tied " << tied << " bias " << bias;
      }
    }
  }
}

TEST(CpuLlamaTest, ChunkedPrefillEqualsOneShot) {
  TinyLlama m(3);
  const std::vector<int32_t> ids = RandomIds(37, m.c.vocab_size, 5);
  auto one = MakeModel(m, true);
  const std::vector<float> full = RunSeq(*one, ids, 0, Iota(10)).logits;
  for (int chunk : {1, 3, 7, 16}) {
    auto model = MakeModel(m, true);
    std::vector<float> got;
    for (int b = 0; b < 37; b += chunk) {
      const int n = std::min(chunk, 37 - b);
      StepOutput o = RunSeq(*model, std::vector<int32_t>(ids.begin() + b, ids.begin() + b + n), b, Iota(10));
      ASSERT_EQ(o.num_rows, n);
      got.insert(got.end(), o.logits.begin(), o.logits.end());
    }
    EXPECT_LT(MaxAbsDiff(got.data(), full.data(), full.size()), 1e-4) << "chunk " << chunk;
  }
}

TEST(CpuLlamaTest, LogitsModesSelectRows) {
  TinyLlama m(4);
  const std::vector<int32_t> ids = RandomIds(9, m.c.vocab_size, 6);
  auto a = MakeModel(m, true);
  const std::vector<float> all = RunSeq(*a, ids, 0, Iota(3)).logits;
  auto b = MakeModel(m, true);
  StepOutput last = RunSeq(*b, ids, 0, Iota(3), StepSequence::Logits::kLast);
  ASSERT_EQ(last.num_rows, 1);
  EXPECT_LT(MaxAbsDiff(last.logits.data(), all.data() + 8 * m.c.vocab_size, m.c.vocab_size), 1e-5);
  auto c = MakeModel(m, true);
  StepOutput none = RunSeq(*c, ids, 0, Iota(3), StepSequence::Logits::kNone);
  EXPECT_EQ(none.num_rows, 0);
  EXPECT_TRUE(none.logits.empty());
}

// Three sequences at different positions in one step (a prefill chunk, a decode, a longer prefill) give
// the same logits as each run alone.
TEST(CpuLlamaTest, MixedBatchEqualsEachAlone) {
  TinyLlama m(9, /*tied=*/true, /*bias=*/true);
  const int vocab = m.c.vocab_size, bs = 4;
  const std::vector<int32_t> a = RandomIds(13, vocab, 1), b = RandomIds(6, vocab, 2),
                             c = RandomIds(20, vocab, 3);
  // Split points: a has 10 tokens in KV, then 3 more; b has 5, then 1 (decode); c starts fresh with 20.
  auto alone = [&](const std::vector<int32_t>& ids, int split) {
    auto model = MakeModel(m, true, 16, bs);
    RunSeq(*model, std::vector<int32_t>(ids.begin(), ids.begin() + split), 0, Iota(8));
    return RunSeq(*model, std::vector<int32_t>(ids.begin() + split, ids.end()), split, Iota(8)).logits;
  };
  const std::vector<float> ra = alone(a, 10), rb = alone(b, 5);
  std::vector<float> rc;
  {
    auto model = MakeModel(m, true, 16, bs);
    rc = RunSeq(*model, c, 0, Iota(8)).logits;
  }
  auto model = MakeModel(m, true, 32, bs);
  // Disjoint block ranges: a uses blocks 0..3, b 10..11, c 20..24.
  RunSeq(*model, std::vector<int32_t>(a.begin(), a.begin() + 10), 0, {0, 1, 2, 3});
  RunSeq(*model, std::vector<int32_t>(b.begin(), b.begin() + 5), 0, {10, 11});
  StepInput in;
  in.token_ids.insert(in.token_ids.end(), a.begin() + 10, a.end());
  in.token_ids.insert(in.token_ids.end(), b.begin() + 5, b.end());
  in.token_ids.insert(in.token_ids.end(), c.begin(), c.end());
  in.sequences = {StepSequence{0, 3, 10, {0, 1, 2, 3}, StepSequence::Logits::kAll},
                  StepSequence{3, 1, 5, {10, 11}, StepSequence::Logits::kAll},
                  StepSequence{4, 20, 0, {20, 21, 22, 23, 24}, StepSequence::Logits::kAll}};
  StepOutput out;
  ASSERT_TRUE(model->Step(in, &out).ok());
  ASSERT_EQ(out.num_rows, 24);
  EXPECT_LT(MaxAbsDiff(out.logits.data(), ra.data(), ra.size()), 1e-4);
  EXPECT_LT(MaxAbsDiff(out.logits.data() + 3 * vocab, rb.data(), rb.size()), 1e-4);
  EXPECT_LT(MaxAbsDiff(out.logits.data() + 4 * vocab, rc.data(), rc.size()), 1e-4);
}

TEST(CpuLlamaTest, PermutedBlockTablesGiveIdenticalLogits) {
  TinyLlama m(12);
  const std::vector<int32_t> ids = RandomIds(30, m.c.vocab_size, 8);
  // Prefill 17, then decode one at a time, through `table`.
  auto run = [&](const std::vector<int32_t>& table) {
    auto model = MakeModel(m, true, 40, 4);
    std::vector<float> got =
        RunSeq(*model, std::vector<int32_t>(ids.begin(), ids.begin() + 17), 0, table).logits;
    for (int p = 17; p < 30; ++p) {
      StepOutput o = RunSeq(*model, {ids[p]}, p, table, StepSequence::Logits::kLast);
      got.insert(got.end(), o.logits.begin(), o.logits.end());
    }
    return got;
  };
  const std::vector<float> ref = run(Iota(8));
  ASSERT_LT(RelErr(ref, m.Reference(ids)), 2e-5);
  std::mt19937 rng(99);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int32_t> pool = Iota(40);
    std::shuffle(pool.begin(), pool.end(), rng);
    // Same arithmetic in the same order whatever the physical blocks: bit-identical.
    EXPECT_EQ(run(std::vector<int32_t>(pool.begin(), pool.begin() + 8)), ref) << "trial " << trial;
  }
}

TEST(CpuLlamaTest, CopyKvBlockCopiesAllLayers) {
  TinyLlama m(13);
  const std::vector<int32_t> ids = RandomIds(9, m.c.vocab_size, 4);
  auto model = MakeModel(m, true, 8, 4);
  RunSeq(*model, std::vector<int32_t>(ids.begin(), ids.begin() + 8), 0, {0, 1});
  // Block 1 (positions 4..7) copied to 5: the decode of position 8 sees the same KV through either table.
  ASSERT_TRUE(model->CopyKvBlock(1, 5).ok());
  const std::vector<float> x = RunSeq(*model, {ids[8]}, 8, {0, 1, 2}).logits;
  const std::vector<float> y = RunSeq(*model, {ids[8]}, 8, {0, 5, 3}).logits;
  EXPECT_EQ(x, y);
  EXPECT_FALSE(model->CopyKvBlock(0, 8).ok());
}

TEST(CpuLlamaTest, RejectsBadStepInput) {
  TinyLlama m(14);
  auto model = CpuLlama::Create(m.ToWeights(true));
  ASSERT_TRUE(model.ok());
  StepInput in;
  in.token_ids = {1, 2, 3};
  in.sequences = {StepSequence{0, 3, 0, {0}, StepSequence::Logits::kLast}};
  StepOutput out;
  EXPECT_EQ((*model)->Step(in, &out).code(), StatusCode::kFailedPrecondition);  // no KV yet
  ASSERT_TRUE((*model)->AllocateKvCache(4, 2).ok());
  EXPECT_EQ((*model)->Step(in, &out).code(), StatusCode::kInvalidArgument);  // 3 tokens need 2 blocks
  in.sequences[0].block_table = {0, 4};
  EXPECT_EQ((*model)->Step(in, &out).code(), StatusCode::kInvalidArgument);  // block 4 out of range
  in.sequences[0].block_table = {0, 1};
  in.token_ids[1] = m.c.vocab_size;
  EXPECT_EQ((*model)->Step(in, &out).code(), StatusCode::kInvalidArgument);  // token out of range
  in.token_ids[1] = 5;
  in.sequences[0].num_tokens = 2;
  EXPECT_EQ((*model)->Step(in, &out).code(), StatusCode::kInvalidArgument);  // tokens not covered
  in.sequences[0].num_tokens = 3;
  in.sequences[0].logits = StepSequence::Logits::kToken;  // the CPU backend returns logits, never tokens
  EXPECT_FALSE((*model)->SamplesOnDevice());
  const Status st = (*model)->Step(in, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("SamplesOnDevice"), std::string::npos) << st.ToString();
  in.sequences[0].logits = StepSequence::Logits::kLast;
  EXPECT_TRUE((*model)->Step(in, &out).ok());
  EXPECT_EQ((*model)->kv_shape().num_blocks, 4);
  EXPECT_EQ((*model)->KvBytesPerToken(), 2 * 2 * 2 * 16 * 4);
}

TEST(CpuLlamaTest, CreateRejectsMismatchedWeights) {
  TinyLlama m(15);
  LlamaWeights w = m.ToWeights(true);
  w.layers[1].down.rows = 7;
  auto model = CpuLlama::Create(std::move(w));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("down"), std::string::npos);
}

// ggml-compatible numerics (Q4_1 / Q8_0 weights as SmolLM2's, fp16 KV, ggml's orders): close to the exact
// forward pass, and bit-identical
// however a sequence is chunked (chunks of >= 2 tokens, as llama.cpp's batches), batched or placed in the
// cache.
TEST(CpuLlamaTest, GgmlNumericsCloseToReferenceAndSplitInvariant) {
  for (bool interleaved : {false, true}) {
    TinyLlama m(21, /*tied=*/true, /*bias=*/true);
    const std::vector<int32_t> ids = RandomIds(37, m.c.vocab_size, 5);
    auto one = MakeModel(m, true, 64, 4, /*ggml=*/true, interleaved);
    ASSERT_TRUE(one->ggml_numerics());
    const std::vector<float> full = RunSeq(*one, ids, 0, Iota(10)).logits;
    // Against stoke's own numerics on the same Q4_1 / Q8_0 weights: fp16 KV and rounding-level differences.
    auto own = MakeModel(m, true, 64, 4, /*ggml=*/false, false, /*quantize=*/true);
    const std::vector<float> own_logits = RunSeq(*own, ids, 0, Iota(10)).logits;
    EXPECT_LT(RelErr(full, own_logits), 5e-2) << "interleaved " << interleaved;
    EXPECT_NE(own_logits, full);    // it is a different computation
    for (int chunk : {5, 7, 16}) {  // 37 = 7·5 + 2 = 5·7 + 2 = 2·16 + 5: no chunk of 1
      auto model = MakeModel(m, true, 64, 4, true, interleaved);
      std::vector<float> got;
      for (int b = 0; b < 37; b += chunk) {
        const int n = std::min(chunk, 37 - b);
        StepOutput o =
            RunSeq(*model, std::vector<int32_t>(ids.begin() + b, ids.begin() + b + n), b, Iota(10));
        got.insert(got.end(), o.logits.begin(), o.logits.end());
      }
      EXPECT_EQ(got, full) << "chunk " << chunk;
    }
  }
}

TEST(CpuLlamaTest, GgmlNumericsMixedBatchAndBlocksBitIdentical) {
  TinyLlama m(22);
  const int vocab = m.c.vocab_size;
  const std::vector<int32_t> a = RandomIds(13, vocab, 1), b = RandomIds(6, vocab, 2);
  // a: 10 tokens, then 3; b: 5, then a decode of 1. Alone, then together in one step on other blocks.
  auto alone = [&](const std::vector<int32_t>& ids, int split) {
    auto model = MakeModel(m, true, 16, 4, true);
    RunSeq(*model, std::vector<int32_t>(ids.begin(), ids.begin() + split), 0, Iota(8));
    return RunSeq(*model, std::vector<int32_t>(ids.begin() + split, ids.end()), split, Iota(8)).logits;
  };
  const std::vector<float> ra = alone(a, 10), rb = alone(b, 5);
  auto model = MakeModel(m, true, 32, 4, true);
  RunSeq(*model, std::vector<int32_t>(a.begin(), a.begin() + 10), 0, {7, 3, 30, 1});
  RunSeq(*model, std::vector<int32_t>(b.begin(), b.begin() + 5), 0, {12, 4});
  StepInput in;
  in.token_ids.insert(in.token_ids.end(), a.begin() + 10, a.end());
  in.token_ids.insert(in.token_ids.end(), b.begin() + 5, b.end());
  in.sequences = {StepSequence{0, 3, 10, {7, 3, 30, 1}, StepSequence::Logits::kAll},
                  StepSequence{3, 1, 5, {12, 4}, StepSequence::Logits::kAll}};
  StepOutput out;
  ASSERT_TRUE(model->Step(in, &out).ok());
  ASSERT_EQ(out.num_rows, 4);
  EXPECT_TRUE(std::equal(ra.begin(), ra.end(), out.logits.begin()));
  EXPECT_TRUE(std::equal(rb.begin(), rb.end(), out.logits.begin() + 3 * vocab));
}

}  // namespace
}  // namespace stoke
