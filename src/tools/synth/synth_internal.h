// Internals of `stoke model synth` shared between its .cc files: the tokenizer generators.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace stoke::synth {

// A byte-level BPE vocabulary (GPT-2 byte alphabet) of exactly `vocab_size` ids: the specials at the ids
// given, the 256 byte tokens and generated merges filling every other id.
struct BpeSpec {
  int vocab_size = 0;
  std::vector<std::pair<int, std::string>> specials;  // (id, content), all special added tokens
  enum class Pre { kLlama3, kSmolLm } pre = Pre::kLlama3;
  std::string bos;  // TemplateProcessing prefix token (empty: none)
  uint64_t seed = 0;
};
std::string BpeTokenizerJson(const BpeSpec& spec);

// A WordPiece (BERT uncased) vocabulary of exactly `vocab_size` tokens: [PAD], [unused*], [UNK]=100,
// [CLS]=101, [SEP]=102, [MASK]=103, characters, ##characters, then generated words and ##subwords. Returns
// tokenizer.json and sets *vocab_txt to the same vocabulary, one token a line.
std::string WordPieceTokenizerJson(int vocab_size, uint64_t seed, std::string* vocab_txt);

}  // namespace stoke::synth
