// Tokenizer: text <-> token ids for every model stoke serves. Two families behind one interface:
// byte-level BPE (GPT-2 / Llama-3 / SmolLM, from GGUF metadata or tokenizer.json) and WordPiece (BERT, from
// tokenizer.json). LoadTokenizer() picks the right one from the model path.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

struct EncodeOptions {
  // BOS for Llama-family models when the model says so (add_bos_token); [CLS] ... [SEP] for BERT.
  bool add_special = true;
  // Match special-token strings ("<|im_start|>") in the text. Only for chat-template output: user text must
  // never be able to inject control tokens, so by default such strings are tokenized as ordinary text.
  bool parse_special = false;
  // 0 = no truncation. BERT truncates to max_length ids keeping the final [SEP].
  int max_length = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer();

  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                const EncodeOptions& opts = {}) const = 0;
  // Concatenated bytes of the tokens; invalid UTF-8 (a sequence cut mid-character) is replaced with U+FFFD.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special = true) const = 0;
  virtual int vocab_size() const = 0;
  virtual int32_t bos_id() const;                       // -1 if none
  virtual const std::vector<int32_t>& eos_ids() const;  // empty if none
  virtual bool IsSpecial(int32_t id) const;
  // Raw bytes this token decodes to ("" for specials and out-of-range ids); may be an incomplete UTF-8
  // sequence.
  virtual std::string TokenBytes(int32_t id) const;

  // What `id` contributes to a decoded stream: `first` = no token was emitted before it. BPE: TokenBytes (or
  // the special's text when not skipped). WordPiece: " word" / "##ing" -> "ing", no space before the first
  // word. Decode() is the concatenation of these pieces, so streaming and one-shot decoding agree.
  virtual std::string DecodePiece(int32_t id, bool first, bool skip_special) const;
  // The vocabulary entry as stored ("Ġthe", "##ing", "<|im_end|>"), for display; "" if out of range.
  virtual std::string TokenText(int32_t id) const;
};

// A GGUF file (tokenizer.ggml.*) or an HF folder (tokenizer.json).
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path);

// Streaming detokenisation for SSE: Push returns only complete UTF-8 (an incomplete multi-byte tail is held
// back until the next token completes it). Flush returns whatever is left, with U+FFFD for a sequence that
// never completed.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true);
  std::string Push(int32_t id);
  std::string Flush();

 private:
  const Tokenizer* tok_;  // not owned; a pointer keeps StreamDecoder assignable
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
  bool first_ = true;    // WordPiece: no space before the first word
};

}  // namespace stoke
