// What a client asks of generation: the sampling knobs and limits, as plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stoke {

struct SamplingParams {
  float temperature = 1.0f;      // 0 = greedy
  float top_p = 1.0f;            // nucleus mass in (0, 1]
  int top_k = 0;                 // 0 = off
  std::optional<uint64_t> seed;  // unset: a random seed per request
  int max_tokens = 256;          // tokens to generate at most
  int min_tokens = 0;            // EOS ignored before this many (benchmarks: min = max)
  bool ignore_eos = false;
  std::vector<std::string> stop;        // stop strings: generation ends before them; never emitted
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS set
  int logprobs = -1;                    // -1: none; k >= 0: chosen token's logprob plus top-k alternatives
};

// One token draw as a backend performs it where the logits are (DecoderModel::SamplesOnDevice,
// cuda::SampleRows): Sampler's semantics (engine/runner/sampler.h) with the request's seed and its step
// counter. temperature <= 0, top_k == 1 or top_p <= 0: greedy; top_k <= 0: off; top_p >= 1: off. Plain data,
// shared by host and device.
struct TokenSampling {
  float temperature = 0.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  uint64_t step = 0;
};

// The chosen token's log-probability and the best alternatives (OpenAI logprobs/top_logprobs).
struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // top alternatives (id, logprob), best first
};

enum class FinishReason : uint8_t { kNone, kStop, kLength, kCancelled, kError };

// The one name of each reason, as the OpenAI API and vLLM's finished_reason label spell it ("abort" for a
// request the client cancelled); "" for kNone (not finished).
inline const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

}  // namespace stoke
