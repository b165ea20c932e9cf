// CudaLlama (cuda_llama.h): creation, weight upload, scratch and the KV cache. The step (staging, layers,
// logits, sampling, decode buckets and their CUDA graphs) is in cuda_llama_step.cc.
#include "engine/cuda/cuda_llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/half.h"
#include "base/logging.h"
#include "engine/model/step_costs.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decoder_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/sampling.h"

namespace stoke {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// Memory kept free beyond the weights/scratch in use at load: CUDA graphs, cuBLASLt's lazy allocations,
// fragmentation.
constexpr int64_t kReserveBytes = 512 * kMiB;
// Block-table entries the staging buffers hold per step (sequences x width): 4 M int32 = 16 MiB.
constexpr int64_t kBlockTableCapacity = int64_t{1} << 22;
// Upper bound of the split-K workspace of PagedDecodeAttention; a decode step needing more runs through
// PrefillAttention instead (same result, slower at long contexts).
constexpr size_t kDecodeWorkspaceCap = size_t{128} << 20;
constexpr int64_t kVocabAlign = 16;  // lm_head rows padded (cuBLASLt wants n % 8 == 0)

Status CheckMatrix(const LinearWeight& w, int64_t rows, int64_t cols, const char* what) {
  if (w.empty() || w.rows != rows || w.cols != cols) {
    return InvalidArgumentError("cuda llama weights: {} is [{}, {}], expected [{}, {}]", what, w.rows, w.cols,
                                rows, cols);
  }
  return OkStatus();
}

Status CheckWeights(const LlamaWeights& w) {
  const LlamaConfig& c = w.config;
  RETURN_IF_ERROR(c.Validate());
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    return InvalidArgumentError(
        "--device cuda: head_dim {} is not supported by the CUDA attention kernels "
        "(64, 128, 256); use --device cpu",
        c.head_dim);
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return InvalidArgumentError("--device cuda: hidden {} and intermediate {} sizes must be multiples of 8",
                                c.hidden_size, c.intermediate_size);
  }
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  RETURN_IF_ERROR(CheckMatrix(w.embedding, c.vocab_size, H, "embedding"));
  RETURN_IF_ERROR(CheckMatrix(w.lm_head, c.vocab_size, H, "lm_head"));
  if (static_cast<int64_t>(w.final_norm.size()) != H) {
    return InvalidArgumentError("cuda llama weights: final norm has {} values, expected {}",
                                w.final_norm.size(), H);
  }
  if (static_cast<int>(w.layers.size()) != c.num_layers) {
    return InvalidArgumentError("cuda llama weights: {} layers, config says {}", w.layers.size(),
                                c.num_layers);
  }
  for (const LlamaLayerWeights& l : w.layers) {
    if (static_cast<int64_t>(l.attn_norm.size()) != H || static_cast<int64_t>(l.ffn_norm.size()) != H) {
      return InvalidArgumentError("cuda llama weights: norm size differs from hidden {}", H);
    }
    if (!l.qkv.empty()) {
      RETURN_IF_ERROR(CheckMatrix(l.qkv, qd + 2 * kvd, H, "qkv"));
    } else {
      RETURN_IF_ERROR(CheckMatrix(l.q, qd, H, "q"));
      RETURN_IF_ERROR(CheckMatrix(l.k, kvd, H, "k"));
      RETURN_IF_ERROR(CheckMatrix(l.v, kvd, H, "v"));
    }
    if (!l.qkv_bias.empty() && static_cast<int64_t>(l.qkv_bias.size()) != qd + 2 * kvd) {
      return InvalidArgumentError("cuda llama weights: qkv bias has {} values, expected {}",
                                  l.qkv_bias.size(), qd + 2 * kvd);
    }
    RETURN_IF_ERROR(CheckMatrix(l.o, H, qd, "o"));
    if (!l.gate_up.empty()) {
      RETURN_IF_ERROR(CheckMatrix(l.gate_up, 2 * F, H, "gate_up"));
    } else {
      RETURN_IF_ERROR(CheckMatrix(l.gate, F, H, "gate"));
      RETURN_IF_ERROR(CheckMatrix(l.up, F, H, "up"));
    }
    RETURN_IF_ERROR(CheckMatrix(l.down, H, F, "down"));
  }
  return OkStatus();
}

// Rows [r0, r0 + n) of `w` as bf16 bits (exact conversions; quants dequantised as cpu::DequantizeRow).
Status ToBf16Rows(const LinearWeight& w, int64_t r0, int64_t n, std::vector<float>* tmp, uint16_t* dst) {
  ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(w.dtype, w.cols));
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + r0 * row_bytes;
  const int64_t count = n * w.cols;
  switch (w.dtype) {
    case DType::kBF16:
      std::memcpy(dst, src, count * sizeof(uint16_t));
      return OkStatus();
    case DType::kF32: {
      for (int64_t i = 0; i < count; ++i) {
        float f;
        std::memcpy(&f, src + i * 4, 4);
        dst[i] = Fp32ToBf16(f);
      }
      return OkStatus();
    }
    case DType::kF16: {
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + i * 2, 2);
        dst[i] = Fp32ToBf16(Fp16ToFp32(h));
      }
      return OkStatus();
    }
    default:
      tmp->resize(count);
      RETURN_IF_ERROR(cpu::DequantizeRow(w.dtype, src, tmp->data(), count));
      for (int64_t i = 0; i < count; ++i) dst[i] = Fp32ToBf16((*tmp)[i]);
      return OkStatus();
  }
}

}  // namespace

CudaLlama::CudaLlama(const Options& options) : options_(options) {
  // --pdl: the decode attention kernel and its merge too, in the steps PdlFor() picks.
  options_.attention.pdl = false;
  attention_pdl_ = options_.attention;
  attention_pdl_.pdl = true;
}

StatusOr<std::unique_ptr<CudaLlama>> CudaLlama::Create(LlamaWeights weights, const Options& options) {
  if (!(options.gpu_memory_fraction > 0.0 && options.gpu_memory_fraction <= 1.0)) {
    return InvalidArgumentError("--gpu-memory-fraction {} must be in (0, 1]", options.gpu_memory_fraction);
  }
  if (options.max_step_tokens < 1) {
    return InvalidArgumentError("cuda llama: max_step_tokens {} must be positive", options.max_step_tokens);
  }
  const int count = cuda::DeviceCount();
  if (options.gpu_index < 0 || options.gpu_index >= count) {
    return FailedPreconditionError("--device cuda: GPU {} not visible ({} CUDA devices)", options.gpu_index,
                                   count);
  }
  if (options.gemv_max_rows < 0 || options.gemv_max_rows > cuda::kGemvMaxRows) {
    return InvalidArgumentError("--gemv-max-rows {} must be in [0, {}]", options.gemv_max_rows,
                                cuda::kGemvMaxRows);
  }
  if (options.fp8_gemv_max_rows < 0 || options.fp8_gemv_max_rows > cuda::kGemvMaxRows) {
    return InvalidArgumentError("--fp8-gemv-max-rows {} must be in [0, {}]", options.fp8_gemv_max_rows,
                                cuda::kGemvMaxRows);
  }
  if (options.gemv_split != 0 && options.gemv_split != 1 && options.gemv_split != 2 &&
      options.gemv_split != 4 && options.gemv_split != 8) {
    return InvalidArgumentError("--gemv-split {} must be 0 (auto), 1, 2, 4 or 8", options.gemv_split);
  }
  if (options.attention.decode_min_partition < 1 || options.attention.decode_min_partition > 512) {
    return InvalidArgumentError("--decode-min-partition {} must be in [1, 512]",
                                options.attention.decode_min_partition);
  }
  if (options.attention.decode_partition < options.attention.decode_min_partition ||
      options.attention.decode_partition > 65536) {
    return InvalidArgumentError("--decode-partition {} must be in [--decode-min-partition {}, 65536]",
                                options.attention.decode_partition, options.attention.decode_min_partition);
  }
  if (options.attention.decode_stages < 2 || options.attention.decode_stages > 4) {
    return InvalidArgumentError("--decode-stages {} must be 2, 3 or 4", options.attention.decode_stages);
  }
  RETURN_IF_ERROR(CheckWeights(weights));
  if (options.quantization == WeightQuantization::kFp8) {
    const LlamaConfig& c = weights.config;
    if (c.hidden_size % 16 != 0 || c.intermediate_size % 16 != 0 || (c.num_heads * c.head_dim) % 16 != 0) {
      return InvalidArgumentError(
          "--quantization fp8: hidden {}, intermediate {} and q dim {} must be multiples of 16 (the FP8 "
          "GEMM's alignment)",
          c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim);
    }
  }
  std::unique_ptr<CudaLlama> m(new CudaLlama(options));
  RETURN_IF_ERROR(m->Init(std::move(weights)));
  return m;
}

Status CudaLlama::Init(LlamaWeights weights) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(options_.gpu_index));
  device_name_ = fmt::format("cuda:{} ({})", options_.gpu_index, info.name);
  config_ = weights.config;
  ASSIGN_OR_RETURN(stream_, device::Stream::Create());
  cuda::GemmOptions tuned;
  tuned.cache_path = options_.gemm_cache_path;
  tuned.candidates = std::max(1, options_.gemm_candidates);
  ASSIGN_OR_RETURN(gemm_tuned_, cuda::BlasLtGemm::Create(tuned));
  cuda::GemmOptions heur;
  heur.candidates = 1;
  ASSIGN_OR_RETURN(gemm_heur_, cuda::BlasLtGemm::Create(heur));

  RETURN_IF_ERROR(UploadWeights(weights));
  weights = LlamaWeights();  // drop the host copies (mapped file, owned buffers)
  RETURN_IF_ERROR(AllocateScratch());
  CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // every upload and dequantisation done

  size_t free_bytes = 0, total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t in_use = static_cast<int64_t>(total_bytes - free_bytes);
  const int64_t allowed =
      static_cast<int64_t>(options_.gpu_memory_fraction * static_cast<double>(total_bytes));
  kv_budget_bytes_ = allowed - in_use - kReserveBytes;
  if (kv_budget_bytes_ <= 0) {
    return ResourceExhaustedError(
        "--device cuda: {} MiB of {} are in use after loading (weights {} MiB, scratch {} MiB), leaving no "
        "KV "
        "cache room under --gpu-memory-fraction {} (minus a {} MiB reserve)",
        in_use / kMiB, total_bytes / kMiB, weight_bytes_ / kMiB,
        static_cast<int64_t>(arena_->capacity()) / kMiB, options_.gpu_memory_fraction, kReserveBytes / kMiB);
  }
  LOG_INFO(
      "cuda llama: {}: weights {} {:.1f} MiB, scratch {:.1f} MiB for steps of up to {} tokens, "
      "KV budget {:.1f} MiB (gpu memory fraction {} of {:.1f} GiB), cuda graphs {}, "
      "GEMV up to {} tokens (warps per row {}; fp8 weights: up to {}), PDL {}, decode partition {}..{}, "
      "decode pipeline {}, decode "
      "attention {} ({} stages), prefill attention {}, mixed-step attention {}, K-quant GEMV {}, vector "
      "elementwise {}",
      device_name_, fp8_weights() ? "fp8" : "bf16", weight_bytes_ / double(kMiB),
      arena_->capacity() / double(kMiB), max_tokens_, kv_budget_bytes_ / double(kMiB),
      options_.gpu_memory_fraction, total_bytes / double(kMiB << 10), options_.cuda_graphs ? "on" : "off",
      options_.gemv_max_rows,
      options_.gemv_split == 0 ? std::string("auto") : std::to_string(options_.gemv_split),
      options_.fp8_gemv_max_rows,
      options_.pdl == Options::Pdl::kOn    ? "on"
      : options_.pdl == Options::Pdl::kOff ? "off"
                                           : "auto (GEMV steps)",
      options_.attention.decode_min_partition, options_.attention.decode_partition,
      options_.attention.decode_pipeline ? "on" : "off",
      !options_.attention.decode_tiled            ? "warp"
      : options_.attention.decode_tiled_fragments ? "tiled"
                                                  : "tiled-smem",
      options_.attention.decode_stages, options_.attention.prefill_force_warp ? "warp" : "auto",
      options_.mixed_split ? "split" : "prefill", cuda::KGemvMathName(options_.kquant_gemv),
      options_.vector_elementwise ? "on" : "off");
  return OkStatus();
}

CudaLlama::~CudaLlama() {
  cudaSetDevice(options_.gpu_index);
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  ReleaseGraphs();
  if (bucket_steps_ > 0) {
    LOG_INFO("cuda llama: {} decode steps through buckets, {} CUDA graphs, {} replays", bucket_steps_,
             graphs_.size(), graph_replays_);
  }
  if (gemm_tuned_ != nullptr) {
    if (Status s = gemm_tuned_->Save(); !s.ok())
      LOG_WARN("cuda llama: GEMM cache not saved: {}", s.message());
  }
  if (kv_ != nullptr) cudaFree(kv_);
  for (void* p : allocations_) cudaFree(p);
  pinned_.Release(h_ints_buf_);
  pinned_.Release(h_logits_buf_);
}

void CudaLlama::ReleaseGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  bucket_seen_.clear();
}

StatusOr<void*> CudaLlama::DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 256));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhaustedError("--device cuda: cannot allocate {} MiB of weights on {}: {}", bytes / kMiB,
                                  device_name_, cudaGetErrorString(err));
  }
  allocations_.push_back(p);
  weight_bytes_ += static_cast<int64_t>(bytes);
  return p;
}

// Host -> device on the step stream, then waits: `src` may be reused at once, and the copy is ordered before
// every later kernel on the stream (a plain cudaMemcpy from pageable memory runs on the legacy stream, which
// a non-blocking stream does not wait for).
Status CudaLlama::Upload(void* dst, const void* src, size_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  return OkStatus();
}

StatusOr<float*> CudaLlama::UploadFloats(const std::vector<float>& v) {
  ASSIGN_OR_RETURN(void* p, DeviceAlloc(v.size() * sizeof(float)));
  RETURN_IF_ERROR(Upload(p, v.data(), v.size() * sizeof(float)));
  return static_cast<float*>(p);
}

StatusOr<CudaLlama::Linear> CudaLlama::UploadLinear(const std::vector<const LinearWeight*>& parts,
                                                    int64_t pad_rows_to, bool gemv_copy) {
  if (parts.front()->dtype == DType::kF8E4M3) return UploadFp8Linear(parts, pad_rows_to);
  Linear lin;
  lin.cols = parts.front()->cols;
  // fp8 weights never take the GGUF GEMV paths (they are re-quantised from the bf16 copy). Q8_0 matrices (the
  // padded lm_head too) keep their 8-bit values for the GEMV; Q4_1, Q4_K and Q6_K (and Q8_0 parts fused with
  // them) keep their raw blocks for the 1-token QuantGemv (the lm_head's padding rows are not computed: the
  // sampler and the logits copy read only the vocabulary's columns).
  bool q8 = gemv_copy && !fp8_weights(), gemv = gemv_copy && !fp8_weights();
  for (const LinearWeight* p : parts) {
    if (p->cols != lin.cols) return InvalidArgumentError("cuda llama: fused parts differ in columns");
    lin.rows += p->rows;
    q8 = q8 && p->dtype == DType::kQ8_0;
    gemv = gemv && CudaGemvReadsBlocks(p->dtype);  // one list with the step-cost model
  }
  const int64_t alloc_rows = RoundUp(lin.rows, pad_rows_to);
  ASSIGN_OR_RETURN(void* wp, DeviceAlloc(alloc_rows * lin.cols * sizeof(uint16_t)));
  lin.w = static_cast<__nv_bfloat16*>(wp);
  if (alloc_rows > lin.rows) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(lin.w + lin.rows * lin.cols, 0,
                                         (alloc_rows - lin.rows) * lin.cols * sizeof(uint16_t),
                                         stream_.get()));
  }
  if (q8) {
    ASSIGN_OR_RETURN(void* qp, DeviceAlloc(alloc_rows * lin.cols));
    ASSIGN_OR_RETURN(void* dp, DeviceAlloc(alloc_rows * (lin.cols / 32) * sizeof(__half)));
    lin.q8 = static_cast<int8_t*>(qp);
    lin.q8_d = static_cast<__half*>(dp);
  }
  int64_t offset = 0;
  std::vector<uint16_t> host;
  std::vector<float> tmp;
  for (const LinearWeight* p : parts) {
    __nv_bfloat16* dst = lin.w + offset * lin.cols;
    if (q8 || gemv) {
      // The raw blocks go to the device; the bf16 copy is dequantised from them there.
      ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(p->dtype, p->cols));
      const size_t bytes = row_bytes * p->rows;
      ASSIGN_OR_RETURN(void* raw, DeviceAlloc(bytes));
      RETURN_IF_ERROR(Upload(raw, p->data, bytes));
      RETURN_IF_ERROR(cuda::DequantizeToBf16(p->dtype, raw, p->rows * p->cols, dst, stream_.get()));
      if (q8) {
        // The last part carries the padding rows (zeroed).
        const int64_t part_alloc = offset + p->rows == lin.rows ? alloc_rows - offset : p->rows;
        RETURN_IF_ERROR(cuda::RepackQ8_0(raw, p->rows, p->cols, part_alloc, lin.q8 + offset * lin.cols,
                                         lin.q8_d + offset * (lin.cols / 32), stream_.get()));
        CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
        DeviceFree(raw, bytes);
      } else {
        lin.quant.push_back(Linear::QuantPart{p->dtype, raw, p->rows, offset});
      }
    } else {
      // Host conversion in ~32 MiB row chunks.
      const int64_t chunk = std::max<int64_t>(1, (int64_t{32} << 20) / (p->cols * 4));
      for (int64_t r = 0; r < p->rows; r += chunk) {
        const int64_t n = std::min(chunk, p->rows - r);
        host.resize(n * p->cols);
        RETURN_IF_ERROR(ToBf16Rows(*p, r, n, &tmp, host.data()));
        RETURN_IF_ERROR(Upload(dst + r * p->cols, host.data(), host.size() * sizeof(uint16_t)));
      }
    }
    offset += p->rows;
  }
  if (lin.q8 != nullptr) ++q8_linears_;
  if (!lin.quant.empty()) ++quant_gemv_linears_;
  return lin;
}

void CudaLlama::DeviceFree(void* p, size_t bytes) {
  auto it = std::find(allocations_.begin(), allocations_.end(), p);
  if (it == allocations_.end()) return;
  allocations_.erase(it);
  cudaFree(p);
  weight_bytes_ -= static_cast<int64_t>(bytes);
}

StatusOr<CudaLlama::Linear> CudaLlama::UploadFp8Linear(const std::vector<const LinearWeight*>& parts,
                                                       int64_t pad_rows_to) {
  if (!fp8_weights()) {
    return FailedPreconditionError(
        "cuda llama: an FP8 checkpoint's matrices need fp8 weights (LoadDecoder sets --quantization fp8 for one)");
  }
  Linear lin;
  lin.cols = parts.front()->cols;
  for (const LinearWeight* p : parts) {
    if (p->dtype != DType::kF8E4M3 || p->row_scale == nullptr || p->cols != lin.cols) {
      return InvalidArgumentError("cuda llama: fused parts differ in type or columns (F8_E4M3 with row scales)");
    }
    lin.rows += p->rows;
  }
  const int64_t alloc_rows = RoundUp(lin.rows, pad_rows_to);
  ASSIGN_OR_RETURN(void* q, DeviceAlloc(alloc_rows * lin.cols));
  ASSIGN_OR_RETURN(void* sc, DeviceAlloc(alloc_rows * sizeof(float)));
  lin.q = static_cast<uint8_t*>(q);
  lin.scale = static_cast<float*>(sc);
  if (alloc_rows > lin.rows) {  // padding rows: code 0 and scale 0
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(lin.q + lin.rows * lin.cols, 0, (alloc_rows - lin.rows) * lin.cols, stream_.get()));
    CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(lin.scale + lin.rows, 0, (alloc_rows - lin.rows) * sizeof(float), stream_.get()));
  }
  int64_t offset = 0;
  for (const LinearWeight* p : parts) {
    RETURN_IF_ERROR(Upload(lin.q + offset * lin.cols, p->data, p->rows * p->cols));
    RETURN_IF_ERROR(Upload(lin.scale + offset, p->row_scale, p->rows * sizeof(float)));
    offset += p->rows;
  }
  return lin;
}

Status CudaLlama::QuantizeLinearFp8(Linear* lin, int64_t alloc_rows, bool free_bf16) {
  if (lin->q != nullptr && lin->w == nullptr) return OkStatus();  // uploaded as fp8 codes (UploadFp8Linear)
  ASSIGN_OR_RETURN(void* q, DeviceAlloc(alloc_rows * lin->cols));
  ASSIGN_OR_RETURN(void* sc, DeviceAlloc(alloc_rows * sizeof(float)));
  lin->q = static_cast<uint8_t*>(q);
  lin->scale = static_cast<float*>(sc);
  RETURN_IF_ERROR(cuda::QuantizeRowsFp8(lin->w, alloc_rows, lin->cols, lin->cols, lin->q, lin->scale,
                                        options_.fp8_scale_multiplier, stream_.get()));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  if (free_bf16) {
    DeviceFree(lin->w, alloc_rows * lin->cols * sizeof(uint16_t));
    lin->w = nullptr;
  }
  lin->quant.clear();
  return OkStatus();
}

Status CudaLlama::UploadWeights(const LlamaWeights& w) {
  const LlamaConfig& c = config_;
  vocab_pad_ = RoundUp(c.vocab_size, kVocabAlign);
  const bool tied = w.lm_head.data == w.embedding.data && w.lm_head.dtype == w.embedding.dtype;
  ASSIGN_OR_RETURN(Linear emb, UploadLinear({&w.embedding}, kVocabAlign, /*gemv_copy=*/tied));
  embedding_ = emb.w;
  if (tied) {
    lm_head_ = emb;  // tied (fp8: the lm_head gets its own bytes; the embedding stays bf16 for the gather)
    if (fp8_weights() && options_.fp8_lm_head)
      RETURN_IF_ERROR(QuantizeLinearFp8(&lm_head_, vocab_pad_, /*free_bf16=*/false));
  } else {
    ASSIGN_OR_RETURN(lm_head_, UploadLinear({&w.lm_head}, kVocabAlign));
    if (fp8_weights() && options_.fp8_lm_head)
      RETURN_IF_ERROR(QuantizeLinearFp8(&lm_head_, vocab_pad_, /*free_bf16=*/true));
  }
  ASSIGN_OR_RETURN(final_norm_, UploadFloats(w.final_norm));
  ASSIGN_OR_RETURN(inv_freq_, UploadFloats(RopeInverseFrequencies(c)));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const LlamaLayerWeights& lw = w.layers[i];
    Layer& l = layers_[i];
    ASSIGN_OR_RETURN(l.attn_norm, UploadFloats(lw.attn_norm));
    ASSIGN_OR_RETURN(l.ffn_norm, UploadFloats(lw.ffn_norm));
    if (!lw.qkv_bias.empty()) {
      ASSIGN_OR_RETURN(l.qkv_bias, UploadFloats(lw.qkv_bias));
    }
    if (!lw.qkv.empty()) {
      ASSIGN_OR_RETURN(l.qkv, UploadLinear({&lw.qkv}, 1));
    } else {
      ASSIGN_OR_RETURN(l.qkv, UploadLinear({&lw.q, &lw.k, &lw.v}, 1));
    }
    ASSIGN_OR_RETURN(l.o, UploadLinear({&lw.o}, 1));
    if (!lw.gate_up.empty()) {
      ASSIGN_OR_RETURN(l.gate_up, UploadLinear({&lw.gate_up}, 1));
    } else {
      ASSIGN_OR_RETURN(l.gate_up, UploadLinear({&lw.gate, &lw.up}, 1));
    }
    ASSIGN_OR_RETURN(l.down, UploadLinear({&lw.down}, 1));
    if (fp8_weights()) {
      for (Linear* lin : {&l.qkv, &l.o, &l.gate_up, &l.down})
        RETURN_IF_ERROR(QuantizeLinearFp8(lin, lin->rows, /*free_bf16=*/true));
    }
  }
  return OkStatus();
}

Status CudaLlama::AllocateScratch() {
  const LlamaConfig& c = config_;
  const int64_t T = options_.max_step_tokens, H = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = int64_t{c.num_heads} * c.head_dim, kvd = int64_t{c.num_kv_heads} * c.head_dim;
  max_tokens_ = static_cast<int>(T);
  const int longest = kContextClasses[std::size(kContextClasses) - 1];
  decode_ws_bytes_ = std::min(
      kDecodeWorkspaceCap,
      std::max<size_t>(cuda::DecodeWorkspaceBytes(static_cast<int>(std::min<int64_t>(T, kLogitsRows)),
                                                  c.num_heads, c.head_dim, longest, options_.attention),
                       256));
  ints_capacity_ = 8 * RoundUp(T + 1, 64) + kBlockTableCapacity;
  // fp8 weights: the FP8 GEMMs' per-token activation bytes (the widest GEMM input: hidden, q dim or ffn; the
  // lm_head's up to kLogitsRows rows).
  const int64_t act_rows = std::max<int64_t>(T, kLogitsRows), act_cols = std::max({H, qd, F});
  const std::vector<size_t> sizes = {static_cast<size_t>(T * H * 4),                     // x
                                     static_cast<size_t>(T * H * 2),                     // h
                                     static_cast<size_t>(T * (qd + 2 * kvd) * 2),        // qkv
                                     static_cast<size_t>(T * qd * 2),                    // q
                                     static_cast<size_t>(T * qd * 2),                    // attn
                                     static_cast<size_t>(T * H * 2),                     // proj
                                     static_cast<size_t>(T * 2 * F * 2),                 // gate|up
                                     static_cast<size_t>(T * F * 2),                     // act
                                     static_cast<size_t>(kLogitsRows * H * 2),           // sel
                                     static_cast<size_t>(kLogitsRows * vocab_pad_ * 4),  // logits
                                     decode_ws_bytes_,
                                     static_cast<size_t>(ints_capacity_ * 4),
                                     static_cast<size_t>(kLogitsRows * 4),                          // row ids
                                     static_cast<size_t>(kLogitsRows * sizeof(cuda::RowSampling)),  // draws
                                     static_cast<size_t>(kLogitsRows * 4),                          // tokens
                                     static_cast<size_t>(fp8_weights() ? act_rows * act_cols : 0),  // act q
                                     static_cast<size_t>(fp8_weights() ? act_rows * 4 : 0)};  // act scales
  size_t capacity = 0;
  for (size_t s : sizes)
    capacity += (s + device::DeviceArena::kAlignment - 1) / device::DeviceArena::kAlignment *
                device::DeviceArena::kAlignment;
  ASSIGN_OR_RETURN(arena_, device::DeviceArena::Create(capacity));
  ASSIGN_OR_RETURN(x_, arena_->AllocateArray<float>(T * H));
  ASSIGN_OR_RETURN(h_, arena_->AllocateArray<__nv_bfloat16>(T * H));
  ASSIGN_OR_RETURN(qkv_, arena_->AllocateArray<__nv_bfloat16>(T * (qd + 2 * kvd)));
  ASSIGN_OR_RETURN(q_, arena_->AllocateArray<__nv_bfloat16>(T * qd));
  ASSIGN_OR_RETURN(attn_, arena_->AllocateArray<__nv_bfloat16>(T * qd));
  ASSIGN_OR_RETURN(proj_, arena_->AllocateArray<__nv_bfloat16>(T * H));
  ASSIGN_OR_RETURN(gu_, arena_->AllocateArray<__nv_bfloat16>(T * 2 * F));
  ASSIGN_OR_RETURN(act_, arena_->AllocateArray<__nv_bfloat16>(T * F));
  ASSIGN_OR_RETURN(sel_, arena_->AllocateArray<__nv_bfloat16>(kLogitsRows * H));
  ASSIGN_OR_RETURN(logits_, arena_->AllocateArray<float>(kLogitsRows * vocab_pad_));
  ASSIGN_OR_RETURN(decode_ws_, arena_->Allocate(decode_ws_bytes_));
  ASSIGN_OR_RETURN(d_ints_, arena_->AllocateArray<int32_t>(ints_capacity_));
  ASSIGN_OR_RETURN(d_row_ids_, arena_->AllocateArray<int32_t>(kLogitsRows));
  ASSIGN_OR_RETURN(d_sampling_, arena_->AllocateArray<cuda::RowSampling>(kLogitsRows));
  ASSIGN_OR_RETURN(d_tokens_, arena_->AllocateArray<int32_t>(kLogitsRows));
  if (fp8_weights()) {
    ASSIGN_OR_RETURN(act_q_, arena_->AllocateArray<uint8_t>(act_rows * act_cols));
    ASSIGN_OR_RETURN(act_scale_, arena_->AllocateArray<float>(act_rows));
  }
  std::vector<int32_t> ids(kLogitsRows);
  for (int i = 0; i < kLogitsRows; ++i) ids[i] = i;
  RETURN_IF_ERROR(Upload(d_row_ids_, ids.data(), ids.size() * 4));
  ASSIGN_OR_RETURN(h_ints_buf_, pinned_.Acquire(ints_capacity_ * 4));
  ASSIGN_OR_RETURN(h_logits_buf_, pinned_.Acquire(kLogitsRows * vocab_pad_ * 4));
  ASSIGN_OR_RETURN(h_sample_buf_, pinned_.Acquire(kLogitsRows * (sizeof(cuda::RowSampling) + 4)));
  return OkStatus();
}

Status CudaLlama::AllocateKvCache(int num_blocks, int block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return InvalidArgumentError("KV cache: num_blocks {} and block_size {} must be positive", num_blocks,
                                block_size);
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
  ReleaseGraphs();  // they point at the old cache
  if (kv_ != nullptr) {
    CUDA_RETURN_IF_ERROR(cudaFree(kv_));
    kv_ = nullptr;
  }
  kv_layers_.clear();
  kv_quant_layers_.clear();
  num_blocks_ = block_size_ = 0;
  const LlamaConfig& c = config_;
  const size_t half = size_t{1} * num_blocks * block_size * c.num_kv_heads * c.head_dim;  // elements
  const size_t rows = size_t{1} * num_blocks * block_size * c.num_kv_heads;               // (slot, kv head)
  const size_t bytes = quant_kv() ? c.num_layers * (2 * half + 2 * rows * sizeof(float))
                                  : 2 * half * c.num_layers * sizeof(__nv_bfloat16);
  const cudaError_t err = cudaMalloc(&kv_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    kv_ = nullptr;
    return ResourceExhaustedError("KV cache: cannot allocate {} MiB on {} ({} blocks of {}): {}",
                                  bytes / kMiB, device_name_, num_blocks, block_size,
                                  cudaGetErrorString(err));
  }
  // On the step stream: a legacy-stream memset would not be ordered before the first step's cache writes.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_, 0, bytes, stream_.get()));
  if (quant_kv()) {
    auto* bytes_base = static_cast<uint8_t*>(kv_);
    auto* scales =
        reinterpret_cast<float*>(bytes_base + 2 * half * c.num_layers);  // 4-byte aligned: half % 4 == 0
    for (int l = 0; l < c.num_layers; ++l) {
      uint8_t* k = bytes_base + 2 * half * l;
      float* ks = scales + 2 * rows * l;
      kv_quant_layers_.push_back(cuda::DevicePagedKvQuant{k, k + half, ks, ks + rows, options_.kv_cache_dtype,
                                                          num_blocks, block_size, c.num_kv_heads,
                                                          c.head_dim});
    }
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    return OkStatus();
  }
  auto* base = static_cast<__nv_bfloat16*>(kv_);
  for (int l = 0; l < c.num_layers; ++l) {
    kv_layers_.push_back(cuda::DevicePagedKv<__nv_bfloat16>{base + 2 * half * l, base + (2 * half * l + half),
                                                            num_blocks, block_size, c.num_kv_heads,
                                                            c.head_dim});
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  return OkStatus();
}

KvCacheShape CudaLlama::kv_shape() const {
  return KvCacheShape{config_.num_layers, config_.num_kv_heads, config_.head_dim, block_size_, num_blocks_};
}

int64_t CudaLlama::KvBytesPerToken() const {
  const int64_t rows = int64_t{2} * config_.num_layers * config_.num_kv_heads;  // (K or V, layer, kv head)
  if (quant_kv()) return rows * (config_.head_dim + static_cast<int64_t>(sizeof(float)));
  return rows * config_.head_dim * static_cast<int64_t>(sizeof(__nv_bfloat16));
}

Status CudaLlama::CopyKvBlock(int32_t src, int32_t dst) {
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_) {
    return InvalidArgumentError("CopyKvBlock: block {} -> {} outside [0, {})", src, dst, num_blocks_);
  }
  if (src == dst) return OkStatus();
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  const size_t block = size_t{1} * block_size_ * config_.num_kv_heads * config_.head_dim;  // elements
  const size_t block_rows = size_t{1} * block_size_ * config_.num_kv_heads;
  for (const cuda::DevicePagedKvQuant& kv : kv_quant_layers_) {
    for (uint8_t* base : {kv.k, kv.v}) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + dst * block, base + src * block, block,
                                           cudaMemcpyDeviceToDevice, stream_.get()));
    }
    for (float* base : {kv.k_scale, kv.v_scale}) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + dst * block_rows, base + src * block_rows,
                                           block_rows * sizeof(float), cudaMemcpyDeviceToDevice,
                                           stream_.get()));
    }
  }
  for (const cuda::DevicePagedKv<__nv_bfloat16>& kv : kv_layers_) {
    for (__nv_bfloat16* base : {kv.k, kv.v}) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + dst * block, base + src * block,
                                           block * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice,
                                           stream_.get()));
    }
  }
  return OkStatus();
}

}  // namespace stoke
