// libFuzzer target: arbitrary bytes through both tokenizer families and the chat-template recogniser.
// Invariants checked (a violation traps): no crash; Encode fails only on invalid UTF-8; every id is in range;
// byte-level BPE decodes its own ids back to the exact input; streaming decode equals one-shot decode and
// never emits invalid UTF-8.
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/unicode_util.h"
#include "engine/tokenizer/wordpiece_tokenizer.h"

namespace {

using namespace stoke;

std::unique_ptr<BpeTokenizer> MakeBpe() {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(tok::ByteToUnicode(static_cast<uint8_t>(b)));
    v.kinds.push_back(TokenKind::kNormal);
  }
  const char* merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "Ġ"}, {"1", "2"}};
  for (auto& m : merges) {
    v.merges.emplace_back(m[0], m[1]);
    v.tokens.push_back(std::string(m[0]) + m[1]);
    v.kinds.push_back(TokenKind::kNormal);
  }
  for (const char* s : {"<|im_start|>", "<|im_end|>"}) {
    v.added.push_back({s, static_cast<int32_t>(v.tokens.size()), true});
    v.tokens.push_back(s);
    v.kinds.push_back(TokenKind::kControl);
  }
  v.pre = *tok::PreTokenizer::ForGgufPre("smollm");
  return std::move(BpeTokenizer::Create(std::move(v))).value();
}

std::unique_ptr<WordPieceTokenizer> MakeWordPiece() {
  WordPieceVocab v;
  v.tokens = {"[UNK]", "[CLS]", "[SEP]", "the", "##s", "a", "##b", ",", "\xE4\xBD\xA0"};
  v.unk_id = 0;
  v.added = {{"[UNK]", 0, true}, {"[CLS]", 1, true}, {"[SEP]", 2, true}};
  v.wrap = {{1}, {2}};
  return std::move(WordPieceTokenizer::Create(std::move(v))).value();
}

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void Exercise(const Tokenizer& t, std::string_view text, const EncodeOptions& o, bool exact_roundtrip) {
  auto ids = t.Encode(text, o);
  Check(ids.ok() == (tok::FindInvalidUtf8(text) == std::string_view::npos));
  if (!ids.ok()) return;
  for (int32_t id : *ids) Check(id >= 0 && id < t.vocab_size());
  const std::string decoded = t.Decode(*ids, /*skip_special=*/false);
  Check(tok::FindInvalidUtf8(decoded) == std::string_view::npos);
  if (exact_roundtrip) Check(decoded == text);
  StreamDecoder stream(t, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : *ids) {
    std::string piece = stream.Push(id);
    Check(tok::FindInvalidUtf8(piece) == std::string_view::npos);
    streamed += piece;
  }
  streamed += stream.Flush();
  Check(streamed == decoded);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto bpe = MakeBpe();
  static const auto wp = MakeWordPiece();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  EncodeOptions o;
  o.parse_special = mode & 1;
  o.add_special = mode & 2;
  o.max_length = (mode & 4) ? (mode >> 4) : 0;
  // Byte-level BPE without truncation/BOS reproduces its input byte for byte.
  Exercise(*bpe, text, o, /*exact_roundtrip=*/!o.add_special && o.max_length == 0);
  Exercise(*wp, text, o, /*exact_roundtrip=*/false);
  auto ct = ChatTemplate::FromString(std::string(text));
  if (ct.ok()) {
    auto out = ct->Apply({{"system", "s"}, {"user", std::string(text)}});
    (void)out;
  }
  return 0;
}
