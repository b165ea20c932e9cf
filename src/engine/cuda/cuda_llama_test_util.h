// Shared by the CudaLlama GPU tests (cuda_llama_gpu_test.cc, cuda_fp8_checkpoint_gpu_test.cc): a random Llama with
// GPU-friendly shapes (hidden 256, 4 heads over 2 KV heads of 64, vocab 1024), its bf16 form, the step script
// (prefill chunks, a mixed step, batched decodes in CUDA graph buckets, a single-token GEMV step, a reused
// prefix, CopyKvBlock, Logits kNone/kLast/kAll) and the logit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "engine/cuda/cuda_llama.h"
#include "engine/loader/gguf_reader.h"
#include "engine/model/llama.h"
#include "engine/model/llama_test_util.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/device.h"

namespace stoke::cuda_llama_test {

namespace fs = std::filesystem;
using testing::TinyLlama;

#define SKIP_WITHOUT_GPU()                                                            \
  do {                                                                                \
    if (::stoke::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipped"; \
  } while (0)

// A random Llama with GPU-friendly shapes; weights scaled by 1/sqrt(fan_in) so activations stay O(1) and
// logits have a spread of a few units (top-1 margins well above bf16 noise).
inline TinyLlama MakeModel(uint32_t seed, bool tied, bool bias, int layers) {
  TinyLlama m(seed, tied, bias, layers);  // default shapes; replaced below
  m.w.clear();
  m.shapes.clear();
  LlamaConfig& c = m.c;
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_position = 4096;
  std::mt19937 rng(seed * 7919u + 1);
  const int64_t H = c.hidden_size, F = c.intermediate_size, qd = c.num_heads * c.head_dim,
                kvd = c.num_kv_heads * c.head_dim;
  const float sh = 1.0f / std::sqrt(static_cast<float>(H));
  m.Add("model.embed_tokens.weight", {c.vocab_size, H}, rng, 0.25f);
  m.Add("model.norm.weight", {H}, rng, 0.1f, 1.0f);
  if (!tied) m.Add("lm_head.weight", {c.vocab_size, H}, rng, 3.0f * sh);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.Add(p + "input_layernorm.weight", {H}, rng, 0.1f, 1.0f);
    m.Add(p + "post_attention_layernorm.weight", {H}, rng, 0.1f, 1.0f);
    m.Add(p + "self_attn.q_proj.weight", {qd, H}, rng, 1.2f * sh);
    m.Add(p + "self_attn.k_proj.weight", {kvd, H}, rng, 1.2f * sh);
    m.Add(p + "self_attn.v_proj.weight", {kvd, H}, rng, sh);
    if (bias) {
      m.Add(p + "self_attn.q_proj.bias", {qd}, rng, 0.1f);
      m.Add(p + "self_attn.k_proj.bias", {kvd}, rng, 0.1f);
      m.Add(p + "self_attn.v_proj.bias", {kvd}, rng, 0.1f);
    }
    m.Add(p + "self_attn.o_proj.weight", {H, qd}, rng, 0.5f / std::sqrt(static_cast<float>(qd)));
    m.Add(p + "mlp.gate_proj.weight", {F, H}, rng, sh);
    m.Add(p + "mlp.up_proj.weight", {F, H}, rng, sh);
    m.Add(p + "mlp.down_proj.weight", {H, F}, rng, 0.5f / std::sqrt(static_cast<float>(F)));
  }
  return m;
}

// The same weights rounded to bf16 and stored as BF16 (an HF bf16 checkpoint as loaded).
// Calls fn(LinearWeight&) on each of the layers' projections, fused or not (the unused ones are empty).
template <typename Fn>
void ForEachProjection(LlamaWeights& w, Fn fn) {
  for (LlamaLayerWeights& l : w.layers) {
    for (LinearWeight* lw : {&l.qkv, &l.q, &l.k, &l.v, &l.o, &l.gate_up, &l.gate, &l.up, &l.down}) fn(*lw);
  }
}

inline LlamaWeights ToBf16Weights(const TinyLlama& m, bool fuse) {
  LlamaWeights w = m.ToWeights(fuse);
  auto convert = [&](LinearWeight& lw) {
    if (lw.empty() || lw.dtype != DType::kF32) return;
    const int64_t n = lw.rows * lw.cols;
    auto buf = std::make_unique<uint8_t[]>(n * 2);
    const float* src = static_cast<const float*>(lw.data);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = Fp32ToBf16(src[i]);
      std::memcpy(buf.get() + 2 * i, &b, 2);
    }
    lw.data = buf.get();
    lw.dtype = DType::kBF16;
    w.owned.push_back(std::move(buf));
  };
  const bool tied = w.lm_head.data == w.embedding.data;
  convert(w.embedding);
  if (tied) {
    w.lm_head = w.embedding;
  } else {
    convert(w.lm_head);
  }
  ForEachProjection(w, convert);
  return w;
}

inline std::string EncodeQ8_0(const float* x, int64_t n) {
  std::string bytes(n / 32 * sizeof(cpu::BlockQ8_0), '\0');
  cpu::QuantizeRowQ8_0(x, bytes.data(), n);
  return bytes;
}
inline std::string EncodeQ4_1(const float* x, int64_t n) {
  std::string bytes(n / 32 * sizeof(cpu::BlockQ4_1), '\0');
  cpu::QuantizeRowQ4_1(x, bytes.data(), n);
  return bytes;
}

inline std::string EncodeQ4_K(const float* x, int64_t n) {
  std::string bytes(n / 256 * sizeof(cpu::BlockQ4_K), '\0');
  cpu::QuantizeRowQ4_KSimple(x, bytes.data(), n);
  return bytes;
}
inline std::string EncodeQ6_K(const float* x, int64_t n) {
  std::string bytes(n / 256 * sizeof(cpu::BlockQ6_K), '\0');
  cpu::QuantizeRowQ6_KSimple(x, bytes.data(), n);
  return bytes;
}

inline StatusOr<LlamaWeights> LoadGgufWeights(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path));
  return LoadLlamaWeights(std::shared_ptr<const GgufFile>(std::move(gguf)));
}

inline CudaLlama::Options TestOptions(bool graphs = true) {
  CudaLlama::Options o;
  o.cuda_graphs = graphs;
  o.gemm_candidates = 1;  // deterministic algorithm choice: instances agree bit for bit
  o.max_step_tokens = 512;
  return o;
}

// ---- the step script ----

inline StepSequence Seq(int32_t begin, int32_t n, int32_t start, std::vector<int32_t> table,
                 StepSequence::Logits logits = StepSequence::Logits::kLast) {
  StepSequence s;
  s.token_begin = begin;
  s.num_tokens = n;
  s.start_pos = start;
  s.block_table = std::move(table);
  s.logits = logits;
  return s;
}

struct Script {
  std::vector<StepInput> steps;
  std::vector<std::string> names;
};

// Block size 16, 64 blocks. A: 40-token prompt in blocks {0, 1, 2}; B: 70 tokens in blocks {3..7}, two
// chunks; C: shares A's first two blocks (32 cached positions) and computes 20 more in {10, 11}; D: a fork of
// A after CopyKvBlock(2 -> 20), which runs before step `kCopyBefore`.
inline constexpr int kBlocks = 64, kBlockSize = 16;
inline constexpr size_t kCopyBefore = 10;

inline Script MakeScript(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  auto ids = [&](int n) {
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = tok(rng);
    return v;
  };
  const std::vector<int32_t> A = {0, 1, 2}, B = {3, 4, 5, 6, 7}, C = {0, 1, 10, 11}, D = {0, 1, 20};
  using L = StepSequence::Logits;
  Script s;
  auto add = [&](std::string name, std::vector<int32_t> tokens, std::vector<StepSequence> seqs) {
    s.steps.push_back(StepInput{std::move(tokens), std::move(seqs)});
    s.names.push_back(std::move(name));
  };
  add("A prefill 40 (last)", ids(40), {Seq(0, 40, 0, A)});
  add("B chunk 1 of 32 (all)", ids(32), {Seq(0, 32, 0, B, L::kAll)});
  {  // mixed: A decodes at 40, B computes its second chunk (38 tokens, none of them wanted but the last)
    std::vector<int32_t> t = ids(39);
    add("mixed: A decode + B chunk 2 of 38", t, {Seq(0, 1, 40, A), Seq(1, 38, 32, B)});
  }
  int a_pos = 41, b_pos = 70;
  for (int i = 0; i < 5; ++i) {  // bucket 2: eager + capture, then replays
    add("decode A+B", ids(2), {Seq(0, 1, a_pos++, A), Seq(1, 1, b_pos++, B)});
  }
  add("decode A alone (1 token: GEMV)", ids(1), {Seq(0, 1, a_pos++, A)});  // A at 46
  add("decode A alone again", ids(1), {Seq(0, 1, a_pos++, A)});            // A at 47: block 2 full
  add("C: 20 tokens after A's 32-token prefix (all)", ids(20), {Seq(0, 20, 32, C, L::kAll)});
  // kCopyBefore = 10: CopyKvBlock(2, 20) runs here; D = A's positions 0..41 then its own token at 42.
  add("D fork of A at 42 (after CopyKvBlock)", ids(1), {Seq(0, 1, 42, D)});
  add("decode A, B, C, D (+ kNone row)", ids(4),
      {Seq(0, 1, 48, {0, 1, 2, 8}), Seq(1, 1, b_pos++, B), Seq(2, 1, 52, C, L::kNone), Seq(3, 1, 43, D)});
  add("decode A, B, C, D again", ids(4),
      {Seq(0, 1, 49, {0, 1, 2, 8}), Seq(1, 1, b_pos++, B), Seq(2, 1, 53, C), Seq(3, 1, 44, D)});
  add("decode A, B, C, D third", ids(4),
      {Seq(0, 1, 50, {0, 1, 2, 8}), Seq(1, 1, b_pos++, B), Seq(2, 1, 54, C), Seq(3, 1, 45, D)});
  {  // 9 decodes (bucket 16) over fresh single-block sequences in blocks 30..38, each with a 1-token prompt
    std::vector<StepSequence> seqs;
    for (int i = 0; i < 9; ++i) seqs.push_back(Seq(i, 1, 0, {30 + i}));
    add("9 one-token sequences (bucket 16)", ids(9), seqs);
  }
  // mixed: three decodes ahead of a fresh 35-token prompt (E in blocks 40..42, every row wanted)
  add("mixed: A, B, D decode + E prefill 35 (all)", ids(38),
      {Seq(0, 1, 51, {0, 1, 2, 8}), Seq(1, 1, b_pos++, B), Seq(2, 1, 46, D),
       Seq(3, 35, 0, {40, 41, 42}, L::kAll)});
  return s;
}

inline StatusOr<std::vector<StepOutput>> RunScript(DecoderModel& model, const Script& s) {
  RETURN_IF_ERROR(model.AllocateKvCache(kBlocks, kBlockSize));
  std::vector<StepOutput> outs(s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (i == kCopyBefore) RETURN_IF_ERROR(model.CopyKvBlock(2, 20));
    RETURN_IF_ERROR(model.Step(s.steps[i], &outs[i]));
  }
  return outs;
}

struct Agreement {
  double max_abs = 0, mean_abs = 0, std = 0;
  int rows = 0, confident = 0, top1_agree = 0;
};

inline Agreement CompareLogits(const std::vector<StepOutput>& want, const std::vector<StepOutput>& got, int vocab,
                        const Script* s = nullptr) {
  Agreement a;
  double sum_abs = 0, sum = 0, sum2 = 0;
  int64_t n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].num_rows, want[i].num_rows) << "step " << i;
    EXPECT_EQ(got[i].logits.size(), want[i].logits.size()) << "step " << i;
    if (got[i].logits.size() != want[i].logits.size()) continue;
    double step_max = 0;
    for (int64_t r = 0; r < want[i].num_rows; ++r) {
      const float* w = want[i].logits.data() + r * vocab;
      const float* g = got[i].logits.data() + r * vocab;
      int best = 0, second = -1;
      for (int v = 0; v < vocab; ++v) {
        const double d = std::fabs(static_cast<double>(g[v]) - w[v]);
        EXPECT_FALSE(std::isnan(g[v])) << "step " << i << " row " << r;
        step_max = std::max(step_max, d);
        sum_abs += d;
        sum += w[v];
        sum2 += static_cast<double>(w[v]) * w[v];
        ++n;
        if (v > 0 && w[v] > w[best]) best = v;
      }
      for (int v = 0; v < vocab; ++v) {
        if (v != best && (second < 0 || w[v] > w[second])) second = v;
      }
      const int got_best = static_cast<int>(std::max_element(g, g + vocab) - g);
      ++a.rows;
      if (w[best] - w[second] > 0.1) {
        ++a.confident;
        if (got_best == best) ++a.top1_agree;
      }
    }
    a.max_abs = std::max(a.max_abs, step_max);
    if (s != nullptr)
      std::printf("    step %2zu %-46s rows %3lld max|diff| %.4f\n", i, s->names[i].c_str(),
                  static_cast<long long>(want[i].num_rows), step_max);
  }
  if (n > 0) {
    a.mean_abs = sum_abs / n;
    const double mean = sum / n;
    a.std = std::sqrt(std::max(0.0, sum2 / n - mean * mean));
  }
  return a;
}

inline void ExpectClose(const Agreement& a, double max_rel, double top1_min, const char* what) {
  std::printf("  [%s] rows %d, logit std %.3f, max|diff| %.4f (%.3f std), mean|diff| %.5f, top-1 %d/%d\n",
              what, a.rows, a.std, a.max_abs, a.max_abs / a.std, a.mean_abs, a.top1_agree, a.confident);
  EXPECT_GT(a.rows, 0) << what;
  EXPECT_LT(a.max_abs, max_rel * a.std) << what;
  EXPECT_GE(a.top1_agree, top1_min * a.confident) << what;
}

// CPU vs CUDA over the script: CPU from `cpu_weights`, CUDA from `gpu_weights` (the same model). q8_linears
// >= 0: that many projections (lm_head included) decode from their GGUF Q8_0 values; quant_linears >= 0: that
// many run the fused-dequant QuantGemv in 1-token steps. `options`: the CUDA side's (TestOptions() if null).
inline void CheckAgainstCpu(LlamaWeights cpu_weights, LlamaWeights gpu_weights, double max_rel,
                            double top1_min, const char* what, int64_t q8_linears = -1,
                            int64_t quant_linears = -1, const CudaLlama::Options* options = nullptr) {
  const int vocab = cpu_weights.config.vocab_size;
  auto cpu = CpuLlama::Create(std::move(cpu_weights));
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto gpu = CudaLlama::Create(std::move(gpu_weights), options != nullptr ? *options : TestOptions());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const Script script = MakeScript(vocab, 5);
  auto want = RunScript(**cpu, script);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = RunScript(**gpu, script);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::printf("  %s on %s\n", what, (*gpu)->device_name().c_str());
  ExpectClose(CompareLogits(*want, *got, vocab, &script), max_rel, top1_min, what);
  EXPECT_GT((*gpu)->bucket_steps(), 0);
  EXPECT_GT((*gpu)->graph_replays(), 0) << "the repeated decode shape should replay a CUDA graph";
  if (q8_linears >= 0) {
    EXPECT_EQ((*gpu)->q8_linears(), q8_linears);
  }
  if (quant_linears >= 0) {
    EXPECT_EQ((*gpu)->quant_gemv_linears(), quant_linears) << what;
  }
}

inline fs::path TempDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("stoke_cuda_llama_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace stoke::cuda_llama_test
