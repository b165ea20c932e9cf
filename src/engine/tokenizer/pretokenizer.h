// Pre-tokenization for byte-level BPE: the text is cut into pieces (words, number runs, punctuation runs,
// whitespace) before merges, so merges never cross a piece boundary. A PreTokenizer is a sequence of steps,
// each applied to every piece the previous step produced -- the model of both HF tokenizers
// (pre_tokenizer.type = Sequence) and llama.cpp (regex_exprs). Regexes run on PCRE2 (UTF + UCP, JIT), which
// has \p{L}/\p{N} and lookahead that std::regex lacks. Tables: shared/reference/model-formats.md §6.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::tok {

inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// llama.cpp's case-insensitive contractions spelled out ((?i:) would also fold U+017F and U+212A).
inline constexpr std::string_view kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern; copies share the compiled code. Thread-safe (match data is per call).
class Regex {
 public:
  static StatusOr<Regex> Compile(std::string_view pattern);
  // Appends [begin, end) byte ranges of every non-overlapping match, left to right. `text` must be valid
  // UTF-8.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<Code> code_;
  std::string pattern_;
};

class PreTokenizer {
 public:
  // llama.cpp's tokenizer.ggml.pre names (gpt2, llama-bpe, smollm, qwen2, ...). Unknown -> InvalidArgument.
  static StatusOr<PreTokenizer> ForGgufPre(std::string_view pre);
  // tokenizer.json "pre_tokenizer" (null -> no splitting). Supports ByteLevel, Split (Isolated/Removed),
  // Digits and Sequence; anything else -> Unimplemented naming the type.
  static StatusOr<PreTokenizer> FromJson(const nlohmann::json& j);

  // Cuts `text` (valid UTF-8) into pieces; pieces are raw text, not yet byte-level encoded.
  void Split(std::string_view text, std::vector<std::string>* pieces) const;
  // Whether a ByteLevel step is present (HF: the model's alphabet is byte-level).
  bool has_byte_level() const { return has_byte_level_; }

 private:
  enum class StepKind { kIsolate, kRemove, kPrefixSpace };
  struct Step {
    StepKind kind;
    Regex regex;  // unused for kPrefixSpace
  };
  Status AddRegex(std::string_view pattern, StepKind kind);
  Status AddJsonStep(const nlohmann::json& j);

  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace stoke::tok
