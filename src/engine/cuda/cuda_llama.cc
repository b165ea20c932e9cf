#include "engine/cuda/cuda_llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "base/half.h"
#include "base/logging.h"
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
// Context classes of the decode buckets: a bucket's block-table width and split count cover this many
// positions, so one captured graph serves every step whose longest context fits the class.
constexpr int kContextClasses[] = {2048, 8192, 32768, 131072};
constexpr int64_t kVocabAlign = 16;  // lm_head rows padded (cuBLASLt wants n % 8 == 0)

int64_t RoundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

bool HasGemv(DType t) {
  return t == DType::kQ4_1 || t == DType::kQ8_0;
}

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

CudaLlama::CudaLlama(const Options& options) : options_(options) {}

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
  if (options.gemv_split != 0 && options.gemv_split != 1 && options.gemv_split != 2 &&
      options.gemv_split != 4 && options.gemv_split != 8) {
    return InvalidArgumentError("--gemv-split {} must be 0 (auto), 1, 2, 4 or 8", options.gemv_split);
  }
  if (options.attention.decode_min_partition < 1 ||
      options.attention.decode_min_partition > cuda::kDecodePartition) {
    return InvalidArgumentError("--decode-min-partition {} must be in [1, {}]",
                                options.attention.decode_min_partition, cuda::kDecodePartition);
  }
  RETURN_IF_ERROR(CheckWeights(weights));
  std::unique_ptr<CudaLlama> m(new CudaLlama(options));
  m->gemv_max_rows_ = options.gemv_max_rows;
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
      "cuda llama: {}: weights {:.1f} MiB, scratch {:.1f} MiB for steps of up to {} tokens, KV budget {:.1f} "
      "MiB (gpu memory fraction {} of {:.1f} GiB), cuda graphs {}, "
      "one-token GEMV {} (warps per row {}), PDL {}, decode min partition {}, decode pipeline {}, prefill "
      "attention {}",
      device_name_, weight_bytes_ / double(kMiB), arena_->capacity() / double(kMiB), max_tokens_,
      kv_budget_bytes_ / double(kMiB), options_.gpu_memory_fraction, total_bytes / double(kMiB << 10),
      options_.cuda_graphs ? "on" : "off", gemv_max_rows_ >= 1 ? "on" : "off",
      options_.gemv_split == 0 ? std::string("auto") : std::to_string(options_.gemv_split),
      options_.pdl ? "on" : "off", options_.attention.decode_min_partition,
      options_.attention.decode_pipeline ? "on" : "off",
      options_.attention.prefill_force_warp ? "warp" : "auto");
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
                                                    int64_t pad_rows_to) {
  Linear lin;
  lin.cols = parts.front()->cols;
  bool gemv = pad_rows_to == 1;  // the padded matrices (embedding / lm_head) never take the GEMV path
  for (const LinearWeight* p : parts) {
    if (p->cols != lin.cols) return InvalidArgumentError("cuda llama: fused parts differ in columns");
    lin.rows += p->rows;
    gemv = gemv && HasGemv(p->dtype);
  }
  const int64_t alloc_rows = RoundUp(lin.rows, pad_rows_to);
  ASSIGN_OR_RETURN(void* wp, DeviceAlloc(alloc_rows * lin.cols * sizeof(uint16_t)));
  lin.w = static_cast<__nv_bfloat16*>(wp);
  if (alloc_rows > lin.rows) {
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(lin.w + lin.rows * lin.cols, 0,
                                         (alloc_rows - lin.rows) * lin.cols * sizeof(uint16_t),
                                         stream_.get()));
  }
  int64_t offset = 0;
  std::vector<uint16_t> host;
  std::vector<float> tmp;
  for (const LinearWeight* p : parts) {
    __nv_bfloat16* dst = lin.w + offset * lin.cols;
    if (gemv) {
      // Raw blocks stay on the device for the GEMV; the bf16 copy is dequantised from them there.
      ASSIGN_OR_RETURN(size_t row_bytes, RowBytes(p->dtype, p->cols));
      const size_t bytes = row_bytes * p->rows;
      ASSIGN_OR_RETURN(void* raw, DeviceAlloc(bytes));
      RETURN_IF_ERROR(Upload(raw, p->data, bytes));
      RETURN_IF_ERROR(cuda::DequantizeToBf16(p->dtype, raw, p->rows * p->cols, dst, stream_.get()));
      lin.quant.push_back(Linear::QuantPart{p->dtype, raw, p->rows, offset});
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
  return lin;
}

Status CudaLlama::UploadWeights(const LlamaWeights& w) {
  const LlamaConfig& c = config_;
  vocab_pad_ = RoundUp(c.vocab_size, kVocabAlign);
  ASSIGN_OR_RETURN(Linear emb, UploadLinear({&w.embedding}, kVocabAlign));
  embedding_ = emb.w;
  if (w.lm_head.data == w.embedding.data && w.lm_head.dtype == w.embedding.dtype) {
    lm_head_ = emb;  // tied
  } else {
    ASSIGN_OR_RETURN(lm_head_, UploadLinear({&w.lm_head}, kVocabAlign));
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
                                     static_cast<size_t>(kLogitsRows * 4)};                         // tokens
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
  l.bt = l.ctx + al(S);
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
  a.bt = d_ints_ + l.bt;
  return a;
}

Status CudaLlama::EnqueueLinear(const Linear& lin, const __nv_bfloat16* x, int64_t m, __nv_bfloat16* y,
                                cuda::BlasLtGemm& gemm) {
  if (m == 1 && !lin.quant.empty()) {
    for (const Linear::QuantPart& p : lin.quant) {
      RETURN_IF_ERROR(cuda::QuantGemv(p.type, p.raw, p.rows, lin.cols, x, y + p.row_offset, stream_.get()));
    }
    return OkStatus();
  }
  if (m <= gemv_max_rows_) {
    return cuda::Bf16Gemv(lin.w, lin.rows, lin.cols, x, m, y, lin.rows, options_.pdl, stream_.get(),
                          options_.gemv_split);
  }
  return gemm.Run(x, lin.w, y, DType::kBF16, m, lin.rows, lin.cols, stream_.get());
}

// Layer i's QKV split + RoPE + cache write and its attention, over the bf16 cache.
Status CudaLlama::EnqueueAttention(int i, const StepArgs& a) {
  const LlamaConfig& c = config_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cudaStream_t s = stream_.get();
  const Layer& l = layers_[i];
  const cuda::DevicePagedKv<__nv_bfloat16>& kv = kv_layers_[i];
  RETURN_IF_ERROR(
      cuda::QkvRopeWriteKv(qkv_, l.qkv_bias, a.positions, a.slots, a.T, c.num_heads, inv_freq_, kv, q_, s));
  const cuda::PagedKvBatch<__nv_bfloat16> batch{.kv = kv,
                                                .block_tables = a.bt,
                                                .max_blocks_per_seq = a.W,
                                                .num_seqs = a.S,
                                                .context_lens = a.ctx,
                                                .max_context_len = a.max_ctx,
                                                .cu_seqlens = a.cu,
                                                .start_pos = a.start,
                                                .total_tokens = a.T};
  if (a.decode) {
    return cuda::PagedDecodeAttention(q_, batch, c.num_heads, scale, decode_ws_, attn_, s,
                                      options_.attention);
  }
  return cuda::PrefillAttention(q_, batch, c.num_heads, scale, attn_, s, options_.attention);
}

// The same over the 8-bit cache (quantised on write, dequantised inside the attention kernels).
Status CudaLlama::EnqueueQuantAttention(int i, const StepArgs& a) {
  const LlamaConfig& c = config_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cudaStream_t s = stream_.get();
  const Layer& l = layers_[i];
  const cuda::DevicePagedKvQuant& kv = kv_quant_layers_[i];
  RETURN_IF_ERROR(cuda::QkvRopeWriteKvQuant(qkv_, l.qkv_bias, a.positions, a.slots, a.T, c.num_heads,
                                            inv_freq_, kv, q_, s));
  if (a.decode) {
    return cuda::PagedDecodeAttention(q_, a.bt, a.W, a.ctx, a.S, c.num_heads, a.max_ctx, scale, kv,
                                      decode_ws_, attn_, s, options_.attention);
  }
  return cuda::PrefillAttention(q_, a.cu, a.start, a.S, a.T, a.bt, a.W, c.num_heads, scale, kv, attn_, s,
                                options_.attention);
}

Status CudaLlama::EnqueueLayers(const StepArgs& a, cuda::BlasLtGemm& gemm) {
  const LlamaConfig& c = config_;
  const int64_t T = a.T, H = c.hidden_size, F = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  cudaStream_t s = stream_.get();
  RETURN_IF_ERROR(cuda::EmbeddingGather(embedding_, c.vocab_size, H, a.tokens, T, x_, s));
  for (int i = 0; i < c.num_layers; ++i) {
    const Layer& l = layers_[i];
    RETURN_IF_ERROR(cuda::AddRmsNorm(i == 0 ? nullptr : proj_, x_, l.attn_norm, T, H, eps, h_, s));
    RETURN_IF_ERROR(EnqueueLinear(l.qkv, h_, T, qkv_, gemm));
    if (quant_kv()) {
      RETURN_IF_ERROR(EnqueueQuantAttention(i, a));
    } else {
      RETURN_IF_ERROR(EnqueueAttention(i, a));
    }
    RETURN_IF_ERROR(EnqueueLinear(l.o, attn_, T, proj_, gemm));
    RETURN_IF_ERROR(cuda::AddRmsNorm(proj_, x_, l.ffn_norm, T, H, eps, h_, s));
    if (T <= gemv_max_rows_ && (T > 1 || l.gate_up.quant.empty())) {
      RETURN_IF_ERROR(
          cuda::Bf16GemvSiluMul(l.gate_up.w, F, H, h_, T, act_, options_.pdl, s, options_.gemv_split));
    } else {
      RETURN_IF_ERROR(EnqueueLinear(l.gate_up, h_, T, gu_, gemm));
      RETURN_IF_ERROR(cuda::SiluMulFused(gu_, T, F, act_, s));
    }
    RETURN_IF_ERROR(EnqueueLinear(l.down, act_, T, proj_, gemm));  // the next layer adds it to x
  }
  return OkStatus();
}

Status CudaLlama::EnqueueLogits(const int32_t* rows, int64_t n, cuda::BlasLtGemm& gemm) {
  const LlamaConfig& c = config_;
  cudaStream_t s = stream_.get();
  RETURN_IF_ERROR(
      cuda::GatherAddRmsNorm(x_, proj_, rows, n, c.hidden_size, final_norm_, c.rms_norm_eps, sel_, s));
  if (n <= gemv_max_rows_) {
    return cuda::Bf16Gemv(lm_head_.w, vocab_pad_, c.hidden_size, sel_, n, logits_, vocab_pad_, options_.pdl,
                          s, options_.gemv_split);
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
  bool handled = false;
  Status st = StepBucket(in, out, &handled);
  if (st.ok() && !handled) st = StepGeneral(in, out);
  // A step that failed half-way may still have copies in flight from the pinned staging buffers the next
  // step overwrites: drain the stream first.
  if (!st.ok()) cudaStreamSynchronize(stream_.get());
  return st;
}

Status CudaLlama::StepGeneral(const StepInput& in, StepOutput* out) {
  const LlamaConfig& c = config_;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const int S = static_cast<int>(in.sequences.size());
  const int bs = block_size_;
  std::vector<int32_t> rows;
  std::vector<const TokenSampling*> draw;  // per row: its device draw, or nullptr for a logits row
  int W = 1, max_ctx = 0;
  bool decode = true;
  for (const StepSequence& seq : in.sequences) {
    const int end = seq.start_pos + seq.num_tokens;
    W = std::max(W, (end + bs - 1) / bs);
    max_ctx = std::max(max_ctx, end);
    decode = decode && seq.num_tokens == 1;
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
    const int need = (seq.start_pos + seq.num_tokens + bs - 1) / bs;
    int32_t* bt = h + l.bt + int64_t{s} * W;
    std::copy(seq.block_table.begin(), seq.block_table.begin() + need, bt);
    std::fill(bt + need, bt + W, 0);
  }
  h[l.cu + S] = static_cast<int32_t>(T);
  std::copy(rows.begin(), rows.end(), h + l.rows);
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_ints_, h, l.total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_.get()));

  StepArgs a = ArgsFor(l, T, S, W);
  a.decode = decode && cuda::DecodeWorkspaceBytes(S, c.num_heads, c.head_dim, max_ctx, options_.attention) <=
                           decode_ws_bytes_;
  a.max_ctx = max_ctx;
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
  a.decode = true;
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
  cudaStream_t s = stream_.get();
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  Status st = EnqueueLayers(a, *gemm_tuned_);
  if (st.ok()) st = EnqueueLogits(d_row_ids_, a.S, *gemm_tuned_);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (!st.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return st.ok() ? cuda::CudaError(__FILE__, __LINE__, "cudaStreamEndCapture", end) : st;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    return cuda::CudaError(__FILE__, __LINE__, "cudaGraphInstantiate", inst);
  }
  graphs_[key] = exec;
  return OkStatus();
}

}  // namespace stoke
