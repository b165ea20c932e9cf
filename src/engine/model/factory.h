// Builds the right decoder for a model path: a GGUF file or an HF folder holding a Llama-family model, on the
// CPU or (when this binary was built with CUDA and a GPU is present) on the GPU.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model/decoder.h"
#include "engine/model/llama_weights.h"

namespace stoke {

// Where and how a decoder runs.
struct DecoderOptions {
  // "cpu", "cuda", or "auto" (cuda when a CUDA backend is registered and a GPU is visible, else cpu).
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
  // The environment variable STOKE_GGML_NUMERICS=0 turns it off (stoke's own, slightly faster kernels).
  bool ggml_compatible_numerics = true;
};

// `path` is a GGUF file or an HF folder (already resolved: see loader/model_registry.h ResolveModel).
// Errors name the file and what is wrong; an unavailable device says why (built without CUDA, no GPU).
StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, const DecoderOptions& options);
// CPU, computing on `pool` (null = ThreadPool::Default()).
StatusOr<std::unique_ptr<DecoderModel>> LoadDecoder(const std::string& path, ThreadPool* pool = nullptr);

// The GPU backend registers itself here (engine/cuda, linked only into CUDA builds) so this CPU-only
// library never depends on CUDA. `available` says whether a usable GPU is present (for device "auto").
struct DecoderBackend {
  StatusOr<std::unique_ptr<DecoderModel>> (*create)(LlamaWeights weights, const DecoderOptions& options) = nullptr;
  bool (*available)() = nullptr;
};
void RegisterCudaDecoderBackend(DecoderBackend backend);
// The device "auto" resolves to on this machine: "cuda" or "cpu".
std::string ResolveDecoderDevice(const std::string& device);

}  // namespace stoke
