// The gate's text: a real English text read from a file (by default the GPL-3 licence that Debian's
// base-files installs on every Debian machine), its line-wrapping undone, cut into sentences (encoder inputs,
// greedy prompts) and its tokens into windows (teacher-forced decoder runs).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke::precision {

inline constexpr const char* kDefaultGateText = "/usr/share/common-licenses/GPL-3";

// The file's text with whitespace normalised (NormalizeText). `path` empty = kDefaultGateText. NotFound says
// to pass --data when the default is absent; InvalidArgument when the file holds no text.
StatusOr<std::string> ReadGateText(const std::string& path);

// Paragraphs (separated by blank lines) joined by "\n\n"; inside a paragraph every run of whitespace (the
// licence's hard line breaks and indentation) becomes one space. No leading or trailing whitespace.
std::string NormalizeText(std::string_view text);

struct SentenceOptions {
  size_t min_chars = 24;   // shorter pieces (headings, "0. Definitions.") are skipped
  size_t max_chars = 400;  // longer sentences are cut at the last space before this
  size_t max_count = 64;   // at most this many sentences, in text order
};
// Sentences in text order: a piece ends after '.', '?' or '!' followed by whitespace, or at a paragraph
// break.
std::vector<std::string> SplitSentences(std::string_view text, const SentenceOptions& options = {});

// Consecutive windows of at most `window` tokens covering ids (the last one may be shorter); window >= 1.
std::vector<std::span<const int32_t>> TokenWindows(std::span<const int32_t> ids, int window);

}  // namespace stoke::precision
