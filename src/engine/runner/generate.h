// Single-sequence loops over a DecoderModel: generation (chunked prefill, then one decode step per token)
// and teacher-forced scoring. The serving path batches many sequences through the scheduler instead; these
// are for `stoke generate` / `stoke score`, golden tests and benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "api/sampling.h"
#include "base/clock.h"
#include "base/status.h"
#include "engine/model/decoder.h"

namespace stoke {

struct GenerateOptions {
  // temperature / top_k / top_p / seed / max_tokens / min_tokens / ignore_eos / stop_token_ids are used;
  // stop strings are text-level and left to the caller (it owns detokenisation).
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;  // the model's EOS set (config ∪ tokenizer); stops generation, not emitted
  int prefill_chunk = 512;       // prompt tokens per prefill step
  int block_size = 16;           // KV block size (the loop owns a private identity block table)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, without the stopping EOS
  FinishReason finish = FinishReason::kNone;
  int prompt_tokens = 0;
  Nanos prefill_ns = 0;  // start -> first token sampled (prefill steps + first sample)
  Nanos decode_ns = 0;   // first token -> last token (one decode step + sample per further token)
  int decode_steps = 0;  // decode steps run (tokens after the first)
};

// Called with each generated token as soon as it is sampled; return false to stop (FinishReason::kCancelled).
using TokenCallback = std::function<bool(int32_t token)>;

// Generates from `prompt` (non-empty). Allocates the model's KV cache when it is too small for
// prompt + max_tokens. max_tokens is cut to the model's context length; a prompt that fills it fails.
StatusOr<GenerateResult> Generate(DecoderModel& model, std::span<const int32_t> prompt,
                                  const GenerateOptions& opts, const TokenCallback& on_token = {});

// Teacher-forced logits of every position: row i is the distribution after ids[0..i]. [ids.size(), vocab].
// Runs ceil(n / chunk) steps of `chunk` tokens (Logits::kAll) through the paged KV, so it also exercises
// chunked prefill.
StatusOr<std::vector<float>> ScoreLogits(DecoderModel& model, std::span<const int32_t> ids, int chunk = 512,
                                         int block_size = 16);

}  // namespace stoke
