// CudaLlama's step (cuda_llama.h): staging a step's inputs, the layers, logits and sampling on the stream,
// and the decode buckets replayed as CUDA graphs. Weights, scratch and the KV cache are set up in
// cuda_llama.cc.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/logging.h"
#include "engine/cuda/cuda_llama.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/sampling.h"

namespace stoke {

Status CudaLlama::ValidateInput(const StepInput& in) const {
  return ValidateStepInput(in, num_blocks_, block_size_, config_.vocab_size, /*device_sampling=*/true);
}

CudaLlama::Layout CudaLlama::MakeLayout(int64_t T, int64_t S, int64_t R, int64_t BT) {
  auto al = [](int64_t n) { return RoundUp(n, 64); };
  Layout l;
  l.tokens = 0;
  l.positions = l.tokens + al(T);
  l.slots = l.positions + al(T);
  l.rows = l.slots + al(T);
  l.cu = l.rows + al(R);
  l.start = l.cu + al(S + 1);
  l.ctx = l.start + al(S);
  l.prefill_cu = l.ctx + al(S);
  l.bt = l.prefill_cu + al(S + 1);
  l.total = l.bt + al(BT);
  return l;
}

CudaLlama::StepArgs CudaLlama::ArgsFor(const Layout& l, int64_t T, int S, int W) const {
  StepArgs a;
  a.T = T;
  a.S = S;
  a.W = W;
  a.tokens = d_ints_ + l.tokens;
  a.positions = d_ints_ + l.positions;
  a.slots = d_ints_ + l.slots;
  a.cu = d_ints_ + l.cu;
  a.start = d_ints_ + l.start;
  a.ctx = d_ints_ + l.ctx;
  a.prefill_cu = d_ints_ + l.prefill_cu;
  a.bt = d_ints_ + l.bt;
  return a;
}

Status CudaLlama::EnqueueLinear(const Linear& lin, const __nv_bfloat16* x, int64_t m, __nv_bfloat16* y,
                                cuda::BlasLtGemm& gemm) {
  if (lin.q != nullptr) {  // fp8 weights: the fp8 GEMV (bf16 activations), else per-token fp8 activations
    if (m <= options_.fp8_gemv_max_rows) {
      return cuda::Fp8Gemv(lin.q, lin.scale, lin.rows, lin.cols, x, m, y, lin.rows, PdlFor(m), stream_.get(),
                           options_.gemv_split);
    }
    RETURN_IF_ERROR(cuda::QuantizeRowsFp8(x, m, lin.cols, lin.cols, act_q_, act_scale_, 1.f, stream_.get(),
                                          options_.vector_elementwise));
    return gemm.RunFp8(act_q_, act_scale_, lin.q, lin.scale, y, DType::kBF16, m, lin.rows, lin.cols,
                       stream_.get());
  }
  if (lin.q8 != nullptr && m <= options_.gemv_max_rows) {  // GGUF Q8_0: the GEMV over the file's int8 values
    return cuda::Q8Gemv(lin.q8, lin.q8_d, lin.rows, lin.cols, x, m, y, lin.rows, PdlFor(m), stream_.get(),
                        options_.gemv_split);
  }
  if (m == 1 && !lin.quant.empty()) {
    for (const Linear::QuantPart& p : lin.quant) {
      RETURN_IF_ERROR(cuda::QuantGemv(p.type, p.raw, p.rows, lin.cols, x, y + p.row_offset, stream_.get(),
                                      /*rows_per_warp=*/0, options_.kquant_gemv));
    }
    return OkStatus();
  }
  if (m <= options_.gemv_max_rows) {
    return cuda::Bf16Gemv(lin.w, lin.rows, lin.cols, x, m, y, lin.rows, PdlFor(m), stream_.get(),
                          options_.gemv_split);
  }
  return gemm.Run(x, lin.w, y, DType::kBF16, m, lin.rows, lin.cols, stream_.get());
}

// Layer i's QKV split + RoPE + cache write and its attention, over the bf16 cache.
Status CudaLlama::EnqueueAttention(int i, const StepArgs& a) {
  const LlamaConfig& c = config_;
  const Layer& l = layers_[i];
  const cuda::DevicePagedKv<__nv_bfloat16>& kv = kv_layers_[i];
  RETURN_IF_ERROR(cuda::QkvRopeWriteKv(qkv_, l.qkv_bias, a.positions, a.slots, a.T, c.num_heads, inv_freq_,
                                       kv, q_, stream_.get(), options_.vector_elementwise, PdlFor(a.T)));
  return EnqueueAttentionKernels(a, kv);
}

// The same over the 8-bit cache (quantised on write, dequantised inside the attention kernels).
Status CudaLlama::EnqueueQuantAttention(int i, const StepArgs& a) {
  const LlamaConfig& c = config_;
  const Layer& l = layers_[i];
  const cuda::DevicePagedKvQuant& kv = kv_quant_layers_[i];
  RETURN_IF_ERROR(cuda::QkvRopeWriteKvQuant(qkv_, l.qkv_bias, a.positions, a.slots, a.T, c.num_heads,
                                            inv_freq_, kv, q_, stream_.get(), options_.vector_elementwise,
                                            PdlFor(a.T)));
  return EnqueueAttentionKernels(a, kv);
}

template <typename Kv>
Status CudaLlama::EnqueueAttentionKernels(const StepArgs& a, const Kv& kv) {
  const LlamaConfig& c = config_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cudaStream_t s = stream_.get();
  const int D = a.decode_seqs;
  const cuda::AttentionLaunchOptions& launch = PdlFor(a.T) ? attention_pdl_ : options_.attention;
  if (D > 0) {  // sequences [0, D): one token each, tokens [0, D)
    RETURN_IF_ERROR(cuda::PagedDecodeAttention(q_, a.bt, a.W, a.ctx, D, c.num_heads, a.max_ctx, scale, kv,
                                               decode_ws_, attn_, s, launch));
  }
  if (D == a.S) return OkStatus();
  // Sequences [D, S) with their tokens [D, T): q, out and the batch arrays from there on.
  const int64_t off = int64_t{D} * c.num_heads * c.head_dim;
  return cuda::PrefillAttention(q_ + off, D > 0 ? a.prefill_cu : a.cu, a.start + D, a.S - D, a.T - D,
                                a.bt + int64_t{D} * a.W, a.W, c.num_heads, scale, kv, attn_ + off, s, launch);
}

Status CudaLlama::EnqueueLayers(const StepArgs& a, cuda::BlasLtGemm& gemm) {
  const LlamaConfig& c = config_;
  const int64_t T = a.T, H = c.hidden_size, F = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  cudaStream_t s = stream_.get();
  const bool pdl = PdlFor(T);
  RETURN_IF_ERROR(cuda::EmbeddingGather(embedding_, c.vocab_size, H, a.tokens, T, x_, s));
  for (int i = 0; i < c.num_layers; ++i) {
    const Layer& l = layers_[i];
    RETURN_IF_ERROR(cuda::AddRmsNorm(i == 0 ? nullptr : proj_, x_, l.attn_norm, T, H, eps, h_, s, pdl));
    RETURN_IF_ERROR(EnqueueLinear(l.qkv, h_, T, qkv_, gemm));
    if (quant_kv()) {
      RETURN_IF_ERROR(EnqueueQuantAttention(i, a));
    } else {
      RETURN_IF_ERROR(EnqueueAttention(i, a));
    }
    RETURN_IF_ERROR(EnqueueLinear(l.o, attn_, T, proj_, gemm));
    RETURN_IF_ERROR(cuda::AddRmsNorm(proj_, x_, l.ffn_norm, T, H, eps, h_, s, pdl));
    if (T <= options_.fp8_gemv_max_rows && l.gate_up.q != nullptr) {
      RETURN_IF_ERROR(
          cuda::Fp8GemvSiluMul(l.gate_up.q, l.gate_up.scale, F, H, h_, T, act_, pdl, s, options_.gemv_split));
    } else if (T <= options_.gemv_max_rows && l.gate_up.q8 != nullptr) {
      RETURN_IF_ERROR(
          cuda::Q8GemvSiluMul(l.gate_up.q8, l.gate_up.q8_d, F, H, h_, T, act_, pdl, s, options_.gemv_split));
    } else if (T == 1 && KQuantSwiGlu(l.gate_up)) {  // GGUF Q4_K / Q6_K: both projections and SwiGLU in one
      const Linear::QuantPart& g = l.gate_up.quant[0];
      RETURN_IF_ERROR(cuda::QuantGemvSiluMul(g.type, g.raw, l.gate_up.quant[1].raw, F, H, h_, act_, s,
                                             /*rows_per_warp=*/0, options_.kquant_gemv));
    } else if (T <= options_.gemv_max_rows && (T > 1 || l.gate_up.quant.empty())) {
      RETURN_IF_ERROR(cuda::Bf16GemvSiluMul(l.gate_up.w, F, H, h_, T, act_, pdl, s, options_.gemv_split));
    } else {
      RETURN_IF_ERROR(EnqueueLinear(l.gate_up, h_, T, gu_, gemm));
      RETURN_IF_ERROR(cuda::SiluMulFused(gu_, T, F, act_, s, options_.vector_elementwise));
    }
    RETURN_IF_ERROR(EnqueueLinear(l.down, act_, T, proj_, gemm));  // the next layer adds it to x
  }
  return OkStatus();
}

Status CudaLlama::EnqueueLogits(const int32_t* rows, int64_t n, cuda::BlasLtGemm& gemm) {
  const LlamaConfig& c = config_;
  cudaStream_t s = stream_.get();
  const bool pdl = PdlFor(n);
  RETURN_IF_ERROR(
      cuda::GatherAddRmsNorm(x_, proj_, rows, n, c.hidden_size, final_norm_, c.rms_norm_eps, sel_, s, pdl));
  if (lm_head_.q != nullptr) {
    if (n <= options_.gemv_max_rows) {
      return cuda::Fp8Gemv(lm_head_.q, lm_head_.scale, vocab_pad_, c.hidden_size, sel_, n, logits_,
                           vocab_pad_, pdl, s, options_.gemv_split);
    }
    RETURN_IF_ERROR(cuda::QuantizeRowsFp8(sel_, n, c.hidden_size, c.hidden_size, act_q_, act_scale_, 1.f, s,
                                          options_.vector_elementwise));
    return gemm.RunFp8(act_q_, act_scale_, lm_head_.q, lm_head_.scale, logits_, DType::kF32, n, vocab_pad_,
                       c.hidden_size, s);
  }
  if (n == 1 && !lm_head_.quant.empty()) {  // GGUF Q4_1 / Q4_K / Q6_K: the fused-dequant GEMV, fp32 logits
    for (const Linear::QuantPart& p : lm_head_.quant) {
      RETURN_IF_ERROR(cuda::QuantGemv(p.type, p.raw, p.rows, c.hidden_size, sel_, logits_ + p.row_offset, s,
                                      /*rows_per_warp=*/0, options_.kquant_gemv));
    }
    return OkStatus();
  }
  if (n <= options_.gemv_max_rows && lm_head_.q8 != nullptr) {
    return cuda::Q8Gemv(lm_head_.q8, lm_head_.q8_d, vocab_pad_, c.hidden_size, sel_, n, logits_, vocab_pad_,
                        pdl, s, options_.gemv_split);
  }
  if (n <= options_.gemv_max_rows) {
    return cuda::Bf16Gemv(lm_head_.w, vocab_pad_, c.hidden_size, sel_, n, logits_, vocab_pad_, pdl, s,
                          options_.gemv_split);
  }
  return gemm.Run(sel_, lm_head_.w, logits_, DType::kF32, n, vocab_pad_, c.hidden_size, s);
}

Status CudaLlama::EnqueueSampling(int64_t n, const std::vector<std::pair<int64_t, TokenSampling>>& draws) {
  if (draws.empty()) return OkStatus();
  auto* params = static_cast<cuda::RowSampling*>(h_sample_buf_.data);
  for (int64_t i = 0; i < n; ++i) params[i] = TokenSampling{};  // unused rows: greedy
  for (const auto& [row, t] : draws) params[row] = t;
  cudaStream_t s = stream_.get();
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_sampling_, params, n * sizeof(cuda::RowSampling), cudaMemcpyHostToDevice, s));
  RETURN_IF_ERROR(cuda::SampleRows(logits_, static_cast<int>(n), config_.vocab_size, d_sampling_, d_tokens_,
                                   s, vocab_pad_));
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(SampledTokens(), d_tokens_, n * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  return OkStatus();
}

int32_t* CudaLlama::SampledTokens() const {
  return reinterpret_cast<int32_t*>(static_cast<uint8_t*>(h_sample_buf_.data) +
                                    kLogitsRows * sizeof(cuda::RowSampling));
}

Status CudaLlama::CopyLogitsOut(const std::vector<int64_t>& keep, float* dst) {
  float* host = static_cast<float*>(h_logits_buf_.data);
  if (!keep.empty()) {  // rows [0, last kept]: rows drawn on the device stay there
    const int64_t n = keep.back() + 1;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, logits_, n * vocab_pad_ * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream_.get()));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  const int64_t V = config_.vocab_size;
  for (size_t i = 0; i < keep.size(); ++i) {
    std::memcpy(dst + i * V, host + keep[i] * vocab_pad_, V * sizeof(float));
  }
  return OkStatus();
}

Status CudaLlama::Step(const StepInput& in, StepOutput* out) {
  RETURN_IF_ERROR(ValidateInput(in));
  out->logits.clear();
  out->tokens.clear();
  out->num_rows = 0;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  if (T == 0) return OkStatus();
  if (T > max_tokens_) {
    return InvalidArgumentError(
        "Step: {} tokens exceed the CUDA runner's scratch of {} tokens per step (sized at load from "
        "--max-num-batched-tokens / DecoderOptions::max_step_tokens)",
        T, max_tokens_);
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  const bool timed = in.time_device;
  if (timed && !step_events_ready_) {
    for (device::Event& e : step_events_) {
      ASSIGN_OR_RETURN(e, device::Event::Create(/*timing=*/true));
    }
    step_events_ready_ = true;
  }
  if (timed) RETURN_IF_ERROR(step_events_[0].Record(stream_.get()));
  bool handled = false;
  Status st = StepBucket(in, out, &handled);
  if (st.ok() && !handled) st = StepGeneral(in, out);
  // A step that failed half-way may still have copies in flight from the pinned staging buffers the next
  // step overwrites: drain the stream first.
  if (!st.ok()) cudaStreamSynchronize(stream_.get());
  if (st.ok() && timed) {  // the step synchronised its stream: the end event is done once recorded
    RETURN_IF_ERROR(step_events_[1].Record(stream_.get()));
    RETURN_IF_ERROR(step_events_[1].Synchronize());
    ASSIGN_OR_RETURN(float ms, device::Event::ElapsedMs(step_events_[0], step_events_[1]));
    out->device_ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }
  return st;
}

Status CudaLlama::StepGeneral(const StepInput& in, StepOutput* out) {
  const LlamaConfig& c = config_;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int S = static_cast<int>(in.sequences.size());
  const int bs = block_size_;
  std::vector<int32_t> rows;
  std::vector<const TokenSampling*> draw;  // per row: its device draw, or nullptr for a logits row
  int W = 1;
  // The leading one-token sequences (the scheduler puts a step's decodes first): the decode kernel's part.
  int D = 0, decode_ctx = 0;
  for (const StepSequence& seq : in.sequences) {
    const int end = seq.start_pos + seq.num_tokens;
    W = std::max(W, (end + bs - 1) / bs);
    if (seq.num_tokens == 1 && seq.token_begin == D && D == static_cast<int>(&seq - in.sequences.data())) {
      ++D;
      decode_ctx = std::max(decode_ctx, end);
    }
    if (seq.logits == StepSequence::Logits::kAll) {
      for (int32_t i = 0; i < seq.num_tokens; ++i) rows.push_back(seq.token_begin + i);
      draw.resize(rows.size(), nullptr);
    } else if (seq.logits == StepSequence::Logits::kLast) {
      rows.push_back(seq.token_begin + seq.num_tokens - 1);
      draw.push_back(nullptr);
    } else if (seq.logits == StepSequence::Logits::kToken) {
      rows.push_back(seq.token_begin + seq.num_tokens - 1);
      draw.push_back(&seq.sampling);
    }
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  const Layout l = MakeLayout(T, S, R, int64_t{S} * W);
  if (l.total > ints_capacity_) {
    return InvalidArgumentError(
        "Step: {} sequences x {} block-table entries exceed the CUDA staging capacity", S, W);
  }
  int32_t* h = static_cast<int32_t*>(h_ints_buf_.data);
  for (int s = 0; s < S; ++s) {
    const StepSequence& seq = in.sequences[s];
    for (int32_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t t = seq.token_begin + i;
      const int32_t pos = seq.start_pos + i;
      h[l.tokens + t] = in.token_ids[t];
      h[l.positions + t] = pos;
      h[l.slots + t] = seq.block_table[pos / bs] * bs + pos % bs;
    }
    h[l.cu + s] = seq.token_begin;
    h[l.start + s] = seq.start_pos;
    h[l.ctx + s] = seq.start_pos + seq.num_tokens;
    if (s >= D) h[l.prefill_cu + s - D] = seq.token_begin - D;
    const int need = (seq.start_pos + seq.num_tokens + bs - 1) / bs;
    int32_t* bt = h + l.bt + int64_t{s} * W;
    std::copy(seq.block_table.begin(), seq.block_table.begin() + need, bt);
    std::fill(bt + need, bt + W, 0);
  }
  h[l.cu + S] = static_cast<int32_t>(T);
  h[l.prefill_cu + S - D] = static_cast<int32_t>(T - D);
  std::copy(rows.begin(), rows.end(), h + l.rows);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_ints_, h, l.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.get()));

  StepArgs a = ArgsFor(l, T, S, W);
  // A decode step runs the decode kernel throughout, a mixed one for its decodes (options_.mixed_split), when
  // the split workspace fits; otherwise the prefill kernel takes every sequence.
  if ((D < S && !options_.mixed_split) || cuda::DecodeWorkspaceBytes(D, c.num_heads, c.head_dim, decode_ctx,
                                                                     options_.attention) > decode_ws_bytes_) {
    D = 0;
  }
  a.decode_seqs = D;
  a.max_ctx = decode_ctx;
  if (D > 0 && D < S) ++split_steps_;
  RETURN_IF_ERROR(EnqueueLayers(a, *gemm_heur_));
  if (R == 0) return stream_.Synchronize();

  const int64_t logit_rows = std::count(draw.begin(), draw.end(), nullptr);
  out->logits.resize(logit_rows * c.vocab_size);
  int64_t done = 0;
  std::vector<int64_t> keep;
  std::vector<std::pair<int64_t, TokenSampling>> draws;
  for (int64_t r0 = 0; r0 < R; r0 += kLogitsRows) {
    const int64_t n = std::min<int64_t>(kLogitsRows, R - r0);
    RETURN_IF_ERROR(EnqueueLogits(d_ints_ + l.rows + r0, n, *gemm_heur_));
    keep.clear();
    draws.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (draw[r0 + i] == nullptr) {
        keep.push_back(i);
      } else {
        draws.emplace_back(i, *draw[r0 + i]);
      }
    }
    RETURN_IF_ERROR(EnqueueSampling(n, draws));
    RETURN_IF_ERROR(CopyLogitsOut(keep, out->logits.data() + done * c.vocab_size));
    done += static_cast<int64_t>(keep.size());
    for (const auto& d : draws) out->tokens.push_back(SampledTokens()[d.first]);
  }
  out->num_rows = logit_rows;
  return OkStatus();
}

Status CudaLlama::StepBucket(const StepInput& in, StepOutput* out, bool* handled) {
  *handled = false;
  const LlamaConfig& c = config_;
  const int S = static_cast<int>(in.sequences.size());
  if (S > kLogitsRows) return OkStatus();
  int max_ctx = 0;
  for (const StepSequence& seq : in.sequences) {
    if (seq.num_tokens != 1) return OkStatus();
    max_ctx = std::max(max_ctx, seq.start_pos + 1);
  }
  int B = 1;
  while (B < S) B *= 2;
  if (B > max_tokens_) return OkStatus();
  const int bs = block_size_;
  const int64_t capacity = RoundUp(int64_t{num_blocks_} * bs, bs);
  int C = 0;
  for (int cls : kContextClasses) {
    const int cap = static_cast<int>(std::min<int64_t>(cls, capacity));
    if (max_ctx <= cap) {
      C = cap;
      break;
    }
  }
  if (C == 0) return OkStatus();
  const int W = (C + bs - 1) / bs;
  const Layout l = MakeLayout(B, B, 0, int64_t{B} * W);
  if (l.total > ints_capacity_) return OkStatus();
  if (cuda::DecodeWorkspaceBytes(B, c.num_heads, c.head_dim, C, options_.attention) > decode_ws_bytes_) {
    return OkStatus();
  }
  *handled = true;
  ++bucket_steps_;

  // Padding rows: token 0 at position 0, no cache write (slot -1), context 0 (attention output zeros).
  int32_t* h = static_cast<int32_t*>(h_ints_buf_.data);
  std::vector<int64_t> keep;
  std::vector<std::pair<int64_t, TokenSampling>> draws;
  for (int s = 0; s < B; ++s) {
    int32_t* bt = h + l.bt + int64_t{s} * W;
    if (s < S) {
      const StepSequence& seq = in.sequences[s];
      const int32_t pos = seq.start_pos;
      h[l.tokens + s] = in.token_ids[seq.token_begin];
      h[l.positions + s] = pos;
      h[l.slots + s] = seq.block_table[pos / bs] * bs + pos % bs;
      h[l.ctx + s] = pos + 1;
      const int need = (pos + 1 + bs - 1) / bs;
      std::copy(seq.block_table.begin(), seq.block_table.begin() + need, bt);
      std::fill(bt + need, bt + W, 0);
      if (seq.logits == StepSequence::Logits::kToken) {
        draws.emplace_back(s, seq.sampling);
      } else if (seq.logits != StepSequence::Logits::kNone) {
        keep.push_back(s);
      }
    } else {
      h[l.tokens + s] = 0;
      h[l.positions + s] = 0;
      h[l.slots + s] = -1;
      h[l.ctx + s] = 0;
      std::fill(bt, bt + W, 0);
    }
    h[l.cu + s] = s;
    h[l.start + s] = s < S ? in.sequences[s].start_pos : 0;
  }
  h[l.cu + B] = B;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_ints_, h, l.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.get()));

  StepArgs a = ArgsFor(l, B, B, W);
  a.decode_seqs = B;
  a.max_ctx = C;
  const std::pair<int, int> key{B, C};
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_.get()));
    ++graph_replays_;
  } else {
    RETURN_IF_ERROR(EnqueueLayers(a, *gemm_tuned_));
    RETURN_IF_ERROR(EnqueueLogits(d_row_ids_, B, *gemm_tuned_));
  }
  RETURN_IF_ERROR(EnqueueSampling(B, draws));
  out->logits.resize(keep.size() * c.vocab_size);
  RETURN_IF_ERROR(CopyLogitsOut(keep, out->logits.data()));
  out->num_rows = static_cast<int64_t>(keep.size());
  for (const auto& d : draws) out->tokens.push_back(SampledTokens()[d.first]);

  // The eager run above tuned this shape's GEMMs: capture it now for the next step of the same shape.
  if (options_.cuda_graphs && it == graphs_.end() && bucket_seen_.find(key) == bucket_seen_.end()) {
    Status st = CaptureBucket(key, a);
    bucket_seen_[key] = st.ok();
    if (!st.ok()) {
      LOG_WARN("cuda llama: capturing decode bucket {} (context {}) failed, it runs eagerly: {}", B, C,
               st.message());
    }
  }
  return OkStatus();
}

Status CudaLlama::CaptureBucket(std::pair<int, int> key, const StepArgs& a) {
  ASSIGN_OR_RETURN(cudaGraphExec_t exec, cuda::CaptureGraph(stream_.get(), [&]() -> Status {
                     RETURN_IF_ERROR(EnqueueLayers(a, *gemm_tuned_));
                     return EnqueueLogits(d_row_ids_, a.S, *gemm_tuned_);
                   }));
  graphs_[key] = exec;
  return OkStatus();
}

}  // namespace stoke
