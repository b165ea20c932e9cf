// WordPiece for BERT-family encoders (model-formats.md §7): BertNormalizer (clean text, pad CJK ideographs,
// strip accents via NFD, lowercase) -> BertPreTokenizer (whitespace + punctuation) -> greedy longest-match
// with "##" continuations -> [CLS] ... [SEP]. Mirrors HF tokenizers so ids match it exactly.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {

struct WordPieceVocab {
  std::vector<std::string> tokens;  // id -> piece ("the", "##ing", "[CLS]")
  std::vector<tok::AddedToken> added;
  int32_t unk_id = -1;
  std::string continuing_prefix = "##";
  int max_input_chars_per_word = 100;
  // BertNormalizer options.
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;  // HF: strip_accents == null means "same as lowercase"
  bool lowercase = true;
  bool decode_cleanup = true;  // WordPiece decoder's "cleanup": " ." -> "." etc.
  tok::SpecialWrap wrap;       // [CLS] $A [SEP]
  std::string source;
};

class WordPieceTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<WordPieceTokenizer>> Create(WordPieceVocab vocab);

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special = true) const override;
  std::string DecodePiece(int32_t id, bool first, bool skip_special) const override;
  int vocab_size() const override { return static_cast<int>(v_.tokens.size()); }
  bool IsSpecial(int32_t id) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string TokenText(int32_t id) const override;

  // Exposed for tests: normalized text and the words the pre-tokenizer cuts it into.
  std::string Normalize(std::string_view text) const;
  std::vector<std::string> PreTokenize(const std::string& normalized) const;

 private:
  explicit WordPieceTokenizer(WordPieceVocab v) : v_(std::move(v)) {}
  void EncodeWord(const std::string& word, std::vector<int32_t>* out) const;

  WordPieceVocab v_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<bool> special_;
  tok::AddedTokenMatcher matcher_;
};

}  // namespace stoke
