// Byte-level BPE (GPT-2, Llama-3, SmolLM, Qwen2): added tokens -> pre-tokenize -> byte-level alphabet ->
// merge by lowest rank -> ids. Built from GGUF metadata or tokenizer.json (tokenizer_loader.cc).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {

// How a vocabulary entry decodes (GGUF token_type 1..6 collapsed to what matters here).
enum class TokenKind : uint8_t {
  kNormal,       // byte-level alphabet
  kControl,      // special: <|im_start|>, [CLS]; text only when not skipping specials
  kUserDefined,  // added, not special: literal text, always matched in input
  kUnused,
};

struct BpeVocab {
  std::vector<std::string> tokens;  // id -> text as stored (byte-level alphabet for kNormal)
  std::vector<TokenKind> kinds;     // same size as tokens
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<tok::AddedToken> added;                       // matched in text before pre-tokenization
  tok::PreTokenizer pre;
  bool byte_level = true;
  bool ignore_merges = false;  // Llama-3: a pre-token that is itself in the vocab is emitted whole
  int32_t unk_id = -1;         // used for pieces that cannot be spelled (never for byte-level vocabs)
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
  tok::SpecialWrap wrap;  // what add_special adds (GGUF: BOS when add_bos_token)
  std::string source;     // file name for error messages
};

class BpeTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<BpeTokenizer>> Create(BpeVocab vocab);

  StatusOr<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special = true) const override;
  std::string DecodePiece(int32_t id, bool first, bool skip_special) const override;
  int vocab_size() const override { return static_cast<int>(v_.tokens.size()); }
  int32_t bos_id() const override { return v_.bos_id; }
  const std::vector<int32_t>& eos_ids() const override { return v_.eos_ids; }
  bool IsSpecial(int32_t id) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string TokenText(int32_t id) const override;

 private:
  explicit BpeTokenizer(BpeVocab v) : v_(std::move(v)) {}
  // Merges one pre-token (already in the byte-level alphabet) and appends its ids.
  void EncodePiece(const std::string& piece, std::vector<int32_t>* out) const;
  void MergePiece(const std::string& piece, std::vector<int32_t>* out) const;

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  BpeVocab v_;
  std::unordered_map<std::string, int32_t> token_to_id_;             // kNormal tokens
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_;  // (left, right) -> (rank, merged id)
  std::vector<std::string> bytes_;  // id -> decoded bytes (kNormal, kUserDefined)
  tok::AddedTokenMatcher matcher_;

  // Per-pre-token cache: the same words recur constantly. Bounded; cleared when full.
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 128;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace stoke
