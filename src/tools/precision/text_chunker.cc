#include "tools/precision/text_chunker.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "base/file_util.h"

namespace stoke::precision {

StatusOr<std::string> ReadGateText(const std::string& path) {
  const std::string file = path.empty() ? kDefaultGateText : path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    if (path.empty()) {
      return NotFoundError(
          "the default gate text {} is absent (Debian's base-files installs it): pass --data "
          "FILE with a few pages of English text",
          file);
    }
    return NotFoundError("--data {}: no such file", file);
  }
  ASSIGN_OR_RETURN(std::string raw, ReadFileToString(file));
  std::string text = NormalizeText(raw);
  if (text.empty()) return InvalidArgumentError("{}: holds no text", file);
  return text;
}

std::string NormalizeText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  int newlines = 0;  // newlines in the current whitespace run
  bool in_space = false;
  for (char ch : text) {
    if (std::isspace(static_cast<unsigned char>(ch))) {
      in_space = true;
      if (ch == '\n') ++newlines;
      continue;
    }
    if (in_space && !out.empty()) out += newlines >= 2 ? "\n\n" : " ";
    in_space = false;
    newlines = 0;
    out += ch;
  }
  return out;
}

std::vector<std::string> SplitSentences(std::string_view text, const SentenceOptions& options) {
  std::vector<std::string> out;
  auto emit = [&](std::string_view piece) {
    while (!piece.empty() && std::isspace(static_cast<unsigned char>(piece.front()))) piece.remove_prefix(1);
    while (!piece.empty() && std::isspace(static_cast<unsigned char>(piece.back()))) piece.remove_suffix(1);
    if (piece.size() < options.min_chars || out.size() >= options.max_count) return;
    if (piece.size() > options.max_chars) {
      const size_t cut = piece.rfind(' ', options.max_chars);
      piece = piece.substr(0, cut == std::string_view::npos || cut == 0 ? options.max_chars : cut);
    }
    out.emplace_back(piece);
  };
  size_t begin = 0;
  for (size_t i = 0; i < text.size() && out.size() < options.max_count; ++i) {
    const char ch = text[i];
    const bool at_end = i + 1 == text.size();
    const bool space_next = !at_end && std::isspace(static_cast<unsigned char>(text[i + 1]));
    const bool paragraph = ch == '\n' && !at_end && text[i + 1] == '\n';
    if (((ch == '.' || ch == '?' || ch == '!') && (space_next || at_end)) || paragraph) {
      emit(text.substr(begin, i + 1 - begin));
      begin = i + 1;
    }
  }
  if (begin < text.size()) emit(text.substr(begin));
  return out;
}

std::vector<std::span<const int32_t>> TokenWindows(std::span<const int32_t> ids, int window) {
  std::vector<std::span<const int32_t>> out;
  if (window < 1) return out;
  for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(window)) {
    out.push_back(ids.subspan(b, std::min(ids.size() - b, static_cast<size_t>(window))));
  }
  return out;
}

}  // namespace stoke::precision
