#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode_util.h"
#include "engine/tokenizer/wordpiece_tokenizer.h"

namespace stoke {
namespace {

// Byte tokens only: id b decodes to byte b, so a multi-byte character always spans several tokens.
std::unique_ptr<BpeTokenizer> ByteTokenizer() {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(tok::ByteToUnicode(static_cast<uint8_t>(b)));
    v.kinds.push_back(TokenKind::kNormal);
  }
  v.tokens.push_back("<|im_end|>");
  v.kinds.push_back(TokenKind::kControl);
  v.added.push_back({"<|im_end|>", 256, true});
  v.eos_ids = {256};
  v.pre = *tok::PreTokenizer::ForGgufPre("gpt2");
  return std::move(BpeTokenizer::Create(std::move(v))).value();
}

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(StreamDecoder, HoldsBackSplitEmojiUntilComplete) {
  auto t = ByteTokenizer();
  StreamDecoder d(*t);
  const std::string grin = "\xF0\x9F\x98\x80";  // U+1F600, 4 bytes = 4 tokens
  EXPECT_EQ(d.Push('a'), "a");
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Push(0x9F), "");
  EXPECT_EQ(d.Push(0x98), "");
  EXPECT_EQ(d.Push(0x80), grin);
  EXPECT_EQ(d.Flush(), "");
}

TEST(StreamDecoder, ZwjSequenceStreamsAsValidUtf8AndConcatenatesExactly) {
  auto t = ByteTokenizer();
  const std::string family =
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok "
      "\xF0\x9F\x87\xA9\xF0\x9F\x87\xAA";
  StreamDecoder d(*t);
  std::string all;
  for (int32_t id : Bytes(family)) {
    std::string piece = d.Push(id);
    EXPECT_EQ(tok::FindInvalidUtf8(piece), std::string_view::npos) << "broken UTF-8 emitted";
    all += piece;
  }
  all += d.Flush();
  EXPECT_EQ(all, family);
  EXPECT_EQ(t->Decode(Bytes(family)), family);
}

TEST(StreamDecoder, IncompleteTailBecomesReplacementOnlyAtFlush) {
  auto t = ByteTokenizer();
  StreamDecoder d(*t);
  EXPECT_EQ(d.Push('x'), "x");
  EXPECT_EQ(d.Push(0xE2), "");
  EXPECT_EQ(d.Push(0x82), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Flush(), "");
}

TEST(StreamDecoder, InvalidSequenceReplacedWhenTheNextByteProvesIt) {
  auto t = ByteTokenizer();
  StreamDecoder d(*t);
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Push('A'),
            "\xEF\xBF\xBD"
            "A");                           // F0 followed by ASCII can never complete
  EXPECT_EQ(d.Push(0xFF), "\xEF\xBF\xBD");  // never valid anywhere
}

TEST(StreamDecoder, SkipsSpecialTokensUnlessAsked) {
  auto t = ByteTokenizer();
  StreamDecoder skip(*t);
  EXPECT_EQ(skip.Push('a'), "a");
  EXPECT_EQ(skip.Push(256), "");
  StreamDecoder keep(*t, /*skip_special=*/false);
  EXPECT_EQ(keep.Push(256), "<|im_end|>");
}

TEST(StreamDecoder, WordPieceSpacesAndContinuations) {
  WordPieceVocab v;
  v.tokens = {"[UNK]", "[CLS]", "hello", "##s", "world", "."};
  v.unk_id = 0;
  v.added = {{"[UNK]", 0, true}, {"[CLS]", 1, true}};
  auto t = std::move(WordPieceTokenizer::Create(std::move(v))).value();
  StreamDecoder d(*t);
  EXPECT_EQ(d.Push(1), "");  // [CLS] skipped and does not count as the first word
  EXPECT_EQ(d.Push(2), "hello");
  EXPECT_EQ(d.Push(3), "s");
  EXPECT_EQ(d.Push(4), " world");
  EXPECT_EQ(d.Push(5), ".");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{1, 2, 3, 4, 5}), "hellos world.");
}

TEST(Utf8, CompletePrefixAndSanitize) {
  EXPECT_EQ(tok::CompleteUtf8Prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(tok::CompleteUtf8Prefix("ab\xE2\x82\xAC"), 5u);
  EXPECT_EQ(tok::CompleteUtf8Prefix("ab\xED\xA0"), 4u);  // would be a surrogate: invalid, not incomplete
  EXPECT_EQ(tok::SanitizeUtf8("a\xE2\x82"
                              "b\xC0\xAF"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(tok::FindInvalidUtf8("ok\xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(tok::FindInvalidUtf8("ok\xF0\x9F"), 2u);
}

}  // namespace
}  // namespace stoke
