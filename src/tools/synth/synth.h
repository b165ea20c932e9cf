// stoke model synth: a random-weight model folder with the exact shape of a real checkpoint, loadable by both
// stoke and Hugging Face transformers (config.json, model.safetensors or shards + index, tokenizer.json,
// tokenizer_config.json). For benchmarks and GPU parity tests on machines without internet: the weights are
// random but chosen so the outputs are well-conditioned (see docs/adding-a-model.md, "Synthetic models").
//
// Deterministic: the bytes depend only on (shape, dtype, seed, layers); a tensor's values depend only on the
// seed and its name (a counter-based PRNG), so they do not change with --layers, sharding or thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace stoke::synth {

struct SynthOptions {
  std::string arch;            // "llama" | "bert" | "" (taken from the shape)
  std::string shape;           // see ShapeNames()
  std::string dtype = "bf16";  // bf16 | f16 | f32
  std::string out_dir;
  uint64_t seed = 0;
  int layers = 0;        // > 0 overrides the shape's layer count (small models for tests)
  int threads = 0;       // 0 = hardware threads
  bool progress = true;  // progress bar on stderr
  // A new shard starts when the next tensor would take the current one above this (HF's default, 5 GB).
  int64_t max_shard_bytes = 5'000'000'000;
};

// Known shapes, in a fixed order ("llama-3.1-8b", ...).
std::vector<std::string> ShapeNames();
// "llama" or "bert" for a known shape; InvalidArgument listing the shapes otherwise.
StatusOr<std::string> ShapeArch(const std::string& shape);

struct SynthResult {
  std::vector<std::string> files;  // written, relative to out_dir
  int64_t parameters = 0;
  int64_t weight_bytes = 0;
  double seconds = 0;
};

// Writes the folder (created if missing; files of the same names are replaced).
StatusOr<SynthResult> WriteSynthModel(const SynthOptions& options);

// ---- exposed for tests
// -------------------------------------------------------------------------------------

// The PRNG: a standard-normal-like value (Irwin-Hall of four 16-bit uniforms, scaled to unit variance,
// bounded by +-3.46) for element `index` of the stream `key`.
float SynthNormal(uint64_t key, uint64_t index);
// The stream key of a tensor: a hash of the seed and the tensor's name.
uint64_t SynthTensorKey(uint64_t seed, const std::string& name);

}  // namespace stoke::synth
