// What the bench sends: input/output length distributions, the presets (short, standard, long), prompts read
// from a JSONL file, synthetic prompts of an exact token count (token-id arrays for /v1/completions) and a
// shared-prefix option. Deterministic for a given seed.
//
//   --workload short      input 128, output 128 tokens
//   --workload standard   input 512, output 256
//   --workload long       input 2000, output 512
//   --workload FILE.jsonl one request per line: {"prompt": "..."} | {"prompt_ids": [1, 2]} |
//                         {"messages": [{"role": "user", "content": "..."}]} | {"input": "..."}, each with an
//                         optional "max_tokens" (else --output-len / the preset's)
//   --input-len / --output-len SPEC: "128" | "uniform:64:192" (inclusive) | "normal:512:64" (mean:stddev)
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tools/bench/bench_types.h"

namespace stoke::bench {

struct LengthDist {
  enum class Kind : uint8_t { kFixed, kUniform, kNormal };
  Kind kind = Kind::kFixed;
  double a = 0, b = 0;                     // fixed: a; uniform: [a, b]; normal: mean a, stddev b
  int Sample(std::mt19937_64& rng) const;  // >= 1
  double Mean() const;
  std::string ToString() const;
};
StatusOr<LengthDist> ParseLengthDist(std::string_view spec);

struct WorkloadSpec {
  std::string name = "short";  // preset name, or the JSONL path
  LengthDist input{LengthDist::Kind::kFixed, 128, 0};
  LengthDist output{LengthDist::Kind::kFixed, 128, 0};
  int shared_prefix = 0;  // the first N prompt tokens are the same for every request
  // Synthetic token ids are drawn from [lo, hi): clear of the low ids where tokenizers keep special tokens.
  int token_id_lo = 1000, token_id_hi = 20000;
  std::string file;  // JSONL, when given
  std::string Describe() const;
};

// "short" | "standard" | "long" | a path ending in .jsonl (read when the source is created).
StatusOr<WorkloadSpec> ParseWorkload(std::string_view name);

// One request's content, independent of the API that carries it.
struct PromptItem {
  std::string text;           // a text prompt / input ("" when ids or messages carry it)
  std::vector<int32_t> ids;   // a token-id prompt
  std::string messages_json;  // a chat "messages" array, as JSON, from a file
  int input_tokens = 0;       // exact for ids, estimated (one per word) for synthetic text, 0 if unknown
  int max_tokens = 0;
};

class PromptSource {
 public:
  // Synthetic prompts are token ids for openai-completions, words for the others.
  static StatusOr<PromptSource> Create(const WorkloadSpec& spec, Api api, uint64_t seed);
  PromptItem Next();

  // Text of about `n` tokens: common English words, each one token in byte-level BPE vocabularies.
  static std::string SyntheticText(int n, std::mt19937_64& rng);

 private:
  PromptSource() = default;
  WorkloadSpec spec_;
  bool use_ids_ = false;
  std::mt19937_64 rng_;
  std::vector<PromptItem> file_items_;
  size_t next_file_item_ = 0;
  std::vector<int32_t> prefix_ids_;
  std::string prefix_text_;
};

}  // namespace stoke::bench
