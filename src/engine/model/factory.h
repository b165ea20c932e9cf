// Builds the right decoder for a model path: a GGUF file or an HF folder holding a Llama-family model, on the
// CPU or, when the Backends value passed in has a CUDA decoder and a GPU is present, on the GPU.
#pragma once

#include <memory>
#include <string>

#include "api/weight_quantization.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/decoder.h"
#include "engine/model/llama_weights.h"

namespace stoke {

struct Backends;  // engine/model/backends.h

// CUDA decoder tuning, copied into CudaLlama::Options (engine/cuda/cuda_llama.h, which documents each
// measurement) and from there into the kernels' cuda::AttentionLaunchOptions. Plain C++ so that this CPU-only
// library and the CLI can carry it; `stoke serve` / `generate` / `score` / `bench step` flags in brackets.
// The defaults are the measured best on the H200; every other value is for A/B runs and workarounds.
struct CudaDecoderTuning {
  // [--gemm-cache FILE] cuBLASLt algorithm cache ("" = in memory only): a file skips re-timing the decode
  // GEMM shapes on the next start (faster start-up, same kernels once warm).
  std::string gemm_cache_path;
  // [--gemv-max-rows N] steps of at most N tokens run their projections through the bf16 GEMV instead of
  // cuBLASLt, 0..8; 0 = always cuBLASLt. Larger: fewer kernels at small batch, slower from batch ~4 up.
  int gemv_max_rows = 1;
  // [--fp8-gemv-max-rows N] with fp8 weights (--quantization fp8): steps of at most N tokens run the layers'
  // projections through the fp8 GEMV instead of quantising the activations for cuBLASLt's FP8 GEMM, 0..8
  // (0 = never; the lm_head follows --gemv-max-rows). Default 8: at 2-8 rows the tensor-core fp8 GEMV costs
  // what one row does; the 8B fp8 decode step took 4.50 ms instead of 5.53 at batch 2 and 4.87 instead
  // of 5.74 at batch 8 with it (H100, bench/results/gpu_fp8_gemv_step_h100_2026-12-06.json).
  int fp8_gemv_max_rows = 8;
  // [--gemv-split N] warps per output row in the one-token GEMVs: 0 = auto (2 when k >= 4096, else 1), 1, 2,
  // 4 or 8. More: more parallelism per row, more cross-warp reduction.
  int gemv_split = 0;
  // [--pdl auto|on|off] programmatic dependent launch for the decode step's kernels: GEMVs (their first
  // weight loads overlap the kernel before), norms, RoPE + cache write, decode attention and its merge.
  // "auto": in the steps whose projections run through the GEMV (at most gemv_max_rows tokens: batch-1
  // decode; with fp8 weights at most fp8_gemv_max_rows when larger), where the chain measured 1.1-1.8 %
  // faster (fp8 batch 2 / 8: 2.3-5.9 % / 0.9-3.3 %, two H100 calls); "on": every step (batch 64 measured
  // 0.8 % slower); "off": none.
  std::string pdl = "auto";
  // [--decode-min-partition N] fewest context positions per split of decode attention, 1..512. Smaller: more
  // blocks for small batches (occupancy) against a larger merge kernel.
  int decode_min_partition = 16;
  // [--decode-partition N] most context positions per split of decode attention (decode_min_partition ..
  // 65536): longer contexts are split even when the batch fills the GPU. 2048 (was a fixed 512).
  int decode_partition = 2048;
  // [--decode-pipeline on|off] decode attention prefetches the next position's K/V (off only for A/B).
  bool decode_pipeline = true;
  // [--decode-attention tiled|tiled-smem|warp] decode attention kernel: "tiled" (tensor cores: the group's
  // query heads as the rows of an mma tile; over an 8-bit cache each warp converts its own keys' codes
  // straight into fp16 fragments in registers), "tiled-smem" (the same, but an 8-bit cache's codes are
  // widened to bf16 in shared memory by the whole block: slower, kept for A/B; a bf16 cache runs "tiled") or
  // "warp" (one warp per position and GQA group, CUDA cores).
  std::string decode_attention = "tiled";
  // [--decode-stages 2|3|4] tiles of 16 keys per warp in the cp.async pipeline of the tiled decode kernel
  // over an 8-bit cache (2: double buffering; more keeps more KV bytes in flight, for more shared memory). A
  // bf16 cache and the other kernels ignore it.
  int decode_stages = 2;
  // [--prefill-attention auto|warp] "auto": the tiled tensor-core kernel where it applies (a bf16 or 8-bit
  // cache); "warp": always the simple warp kernel (exact, much slower; a way around a tiled-kernel problem).
  std::string prefill_attention = "auto";
  // [--mixed-attention split|prefill] a step of decodes and prefill chunks: "split" runs the decodes'
  // attention in the decode kernel (a GQA group's query heads share each K/V tile) and only the chunks in the
  // prefill kernel; "prefill" runs every sequence in the prefill kernel (each decode a one-row query tile
  // per head: the form before 2026-12-05, for A/B).
  std::string mixed_attention = "split";
  // [--vector-elementwise on|off] the step's small memory-bound kernels in wider forms, the same values bit
  // for bit: the SwiGLU and the fp8 activation quantiser of steps past the GEMV move 8 values per thread
  // access (16-byte loads and stores) instead of one; the RoPE + cache write (bf16 or 8-bit) takes one warp
  // per head instead of one block. On by default since served on the H200 at c=512 (fp8 weights + fp8 KV) the
  // step's model part took 33.80 ms against 34.87 / 35.05 ms off, at a lower power-capped clock
  // (bench/results/gpu_served_valid_windows_h200_2026-12-06.json); "off" keeps the one-value / block forms.
  bool vector_elementwise = true;
  // [--kquant-gemv auto|fp32|int8] GGUF Q4_K / Q6_K weights in 1-token steps: "fp32" (each weight value an
  // exact fp32 times bf16 activations: the dequantised matrix's product), "int8" (activations quantised per
  // 32 values as the CPU engine and llama.cpp do, each block's product an exact integer dot: the CPU engine's
  // numerics) or "auto" (the faster of the two per type and shape, as measured: cuda::KGemvAuto).
  std::string kquant_gemv = "auto";
};
// InvalidArgument naming the flag when a tuning value is out of range.
Status ValidateCudaDecoderTuning(const CudaDecoderTuning& t);

// Where and how a decoder runs.
struct DecoderOptions {
  // "cpu", "cuda", or "auto" (cuda when the Backends have a CUDA decoder and a GPU is visible, else cpu).
  std::string device = "cpu";
  int gpu_index = 0;
  // CUDA: the fraction of the GPU's total memory stoke may use (weights, activations, KV cache). The KV
  // cache gets what is left after weights and activation scratch (DecoderModel::KvBudgetBytes).
  double gpu_memory_fraction = 0.90;
  // CUDA: activation scratch is sized for steps of at most this many tokens (larger steps are refused).
  int max_step_tokens = 8192;
  // CUDA: capture decode steps as CUDA graphs (off: run every step eagerly; same results).
  bool cuda_graphs = true;
  ThreadPool* pool = nullptr;  // CPU: the compute pool (null = ThreadPool::Default())
  // CPU, GGUF files: ggml-compatible numerics (CpuLlama::Create), so logits equal llama.cpp's CPU backend's.
  // Flag --ggml-numerics off turns it off (stoke's own, slightly faster kernels; logits differ from
  // llama.cpp's in the last bits).
  bool ggml_compatible_numerics = true;
  // KV cache storage (--kv-cache-dtype): auto | bf16 | int8 | fp8 (KvCacheOptions, decoder.h).
  KvCacheOptions kv_cache;
  // Weight precision (--quantization): none | fp8 (api/weight_quantization.h; docs/precision.md). int8
  // (encoders only) is refused by LoadDecoder.
  WeightQuantization quantization = WeightQuantization::kNone;
  // CUDA: kernel choices (see CudaDecoderTuning); ignored on the CPU.
  CudaDecoderTuning cuda;
};

// `path` is a GGUF file or an HF folder (already resolved: see loader/model_registry.h ResolveModel). The
// device comes from `options.device`, resolved against `backends` (ResolveDecoderDevice); a "cuda" decoder is
// made by `backends.cuda_decoder.create`. Errors name the file and what is wrong; an unavailable device says
// why (built without CUDA, no GPU).
StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, const DecoderOptions& options,
                                                    const Backends& backends);
// CPU, computing on `pool` (null = ThreadPool::Default()).
StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool = nullptr);

// A CUDA decoder backend (engine/cuda: CudaBackends(), linked only into CUDA builds), carried in a Backends
// value so this CPU-only library never depends on CUDA. `available` says whether a usable GPU is present (for
// device "auto"); null = always.
struct DecoderBackend {
  StatusOr<std::unique_ptr<DecoderModel>> (*create)(LlamaWeights weights, const DecoderOptions& options) = nullptr;
  bool (*available)() = nullptr;
};
// The device `device` means with these backends: "auto" becomes "cuda" when backends.cuda_usable(), else
// "cpu"; any other string is returned as it is (LoadDecoder rejects unknown ones).
std::string ResolveDecoderDevice(const std::string& device, const Backends& backends);

}  // namespace stoke
