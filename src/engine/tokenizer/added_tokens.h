// Added tokens (chat markers, [CLS], <|endoftext|>, ...) are cut out of the text before pre-tokenization so
// they map straight to their ids. Special ones are matched only when the caller asks (template output):
// otherwise a user could type "<|im_start|>" and forge a turn -- the same rule as llama.cpp with
// parse_special=false (control tokens skipped, user-defined tokens still matched).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;  // control token: matched only with parse_special, skipped by Decode(skip_special)
  bool lstrip = false;   // swallows whitespace on its left
  bool rstrip = false;   // swallows whitespace on its right
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  struct Segment {
    std::string_view text;  // id < 0: ordinary text to pre-tokenize
    int32_t id = -1;        // id >= 0: a matched added token
  };
  // Leftmost-longest match, left to right.
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indexes into tokens_, longest first
};

// What EncodeOptions::add_special wraps around the ids: "[CLS] $A [SEP]", "<|begin_of_text|> $A".
struct SpecialWrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// tokenizer.json "post_processor": TemplateProcessing (single), BertProcessing, RobertaProcessing, ByteLevel,
// Sequence, or null. `lookup` maps a token string to its id (-1 if absent).
StatusOr<SpecialWrap> SpecialWrapFromJson(const nlohmann::json& j,
                                          const std::function<int32_t(const std::string&)>& lookup);

// Applies prefix/suffix and truncation to max_length (0 = none), keeping the suffix ([SEP]).
std::vector<int32_t> WrapAndTruncate(const SpecialWrap& wrap, bool add_special, std::vector<int32_t> body,
                                     int max_length);

}  // namespace stoke::tok
