#include "engine/tokenizer/wordpiece_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stoke {
namespace {

using ::testing::ElementsAre;

enum : int32_t {
  kPad = 0,
  kUnk,
  kCls,
  kSep,
  kMask,
  kHello,
  kWorld,
  kS,
  kUn,
  kAff,
  kAble,
  kComma,
  kBang,
  kA,
  kB,
  kNi,
  kHao,
  kDot,
  kI,
  kDotAbove
};

std::unique_ptr<WordPieceTokenizer> Tiny(int max_chars = 100, bool strip_accents = true) {
  WordPieceVocab v;
  v.tokens = {"[PAD]",
              "[UNK]",
              "[CLS]",
              "[SEP]",
              "[MASK]",
              "hello",
              "world",
              "##s",
              "un",
              "##aff",
              "##able",
              ",",
              "!",
              "a",
              "b",
              "\xE4\xBD\xA0" /*你*/,
              "\xE5\xA5\xBD" /*好*/,
              ".",
              "i",
              "##\xCC\x87" /* ##U+0307 */};
  v.unk_id = kUnk;
  v.max_input_chars_per_word = max_chars;
  v.strip_accents = strip_accents;
  for (int32_t id : {kPad, kUnk, kCls, kSep, kMask}) v.added.push_back({v.tokens[id], id, /*special=*/true});
  v.wrap.prefix = {kCls};
  v.wrap.suffix = {kSep};
  v.source = "tiny";
  return std::move(WordPieceTokenizer::Create(std::move(v))).value();
}

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view text, EncodeOptions o = {}) {
  auto r = t.Encode(text, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<int32_t>{};
}

TEST(WordPiece, NormalizesAndSplitsPunctuation) {
  auto t = Tiny();
  EXPECT_THAT(Enc(*t, "Hello, WORLD!"), ElementsAre(kCls, kHello, kComma, kWorld, kBang, kSep));
  // Accents are stripped (NFD, drop Mn) before lookup; whitespace incl. tabs/newlines separates words.
  EXPECT_THAT(Enc(*t, "H\xC3\xA9llo\t\n w\xC3\xB6rld"), ElementsAre(kCls, kHello, kWorld, kSep));
}

TEST(WordPiece, GreedyLongestMatchWithContinuations) {
  auto t = Tiny();
  EXPECT_THAT(Enc(*t, "unaffable worlds", {.add_special = false}), ElementsAre(kUn, kAff, kAble, kWorld, kS));
}

TEST(WordPiece, UnmatchablePositionMakesWholeWordUnk) {
  auto t = Tiny();
  // "unaffz": un ##aff then "z" has no piece -> the whole word is [UNK], not "un ##aff [UNK]".
  EXPECT_THAT(Enc(*t, "unaffz hello", {.add_special = false}), ElementsAre(kUnk, kHello));
}

TEST(WordPiece, OverlongWordIsUnk) {
  auto t = Tiny(/*max_chars=*/5);
  EXPECT_THAT(Enc(*t, "aaaaaa", {.add_special = false}), ElementsAre(kUnk));
  EXPECT_THAT(Enc(*t, "hello", {.add_special = false}), ElementsAre(kHello));  // exactly 5 chars is fine
}

TEST(WordPiece, CjkIdeographsAreSeparateWords) {
  auto t = Tiny();
  // No spaces in the input, yet each ideograph becomes its own word.
  EXPECT_THAT(Enc(*t,
                  "a\xE4\xBD\xA0\xE5\xA5\xBD"
                  "b",
                  {.add_special = false}),
              ElementsAre(kA, kNi, kHao, kB));
}

TEST(WordPiece, ControlCharsDroppedAndDottedCapitalI) {
  auto t = Tiny();
  // U+200D (a format char) and U+0007 (a control char) are removed by clean_text.
  EXPECT_THAT(Enc(*t, "a\xE2\x80\x8D\x07 b", {.add_special = false}), ElementsAre(kA, kB));
  // U+0130: NFD + accent stripping leave "I" -> "i"; without stripping, full lowercasing gives "i" + U+0307,
  // as HF's char::to_lowercase does (utf8proc's simple mapping alone would give "i").
  EXPECT_THAT(Enc(*t, "\xC4\xB0", {.add_special = false}), ElementsAre(kI));
  auto keep = Tiny(100, /*strip_accents=*/false);
  EXPECT_THAT(Enc(*keep, "\xC4\xB0", {.add_special = false}), ElementsAre(kI, kDotAbove));
}

TEST(WordPiece, LiteralSpecialTextOnlyParsedWhenAsked) {
  auto t = Tiny();
  EXPECT_THAT(Enc(*t, "[SEP]", {.add_special = false}), ElementsAre(kUnk, kUnk, kUnk));  // "[", "sep", "]"
  EXPECT_THAT(Enc(*t, "a[SEP]b", {.add_special = false, .parse_special = true}), ElementsAre(kA, kSep, kB));
}

TEST(WordPiece, TruncationKeepsSep) {
  auto t = Tiny();
  EXPECT_THAT(Enc(*t, "a b a b a", {.max_length = 4}), ElementsAre(kCls, kA, kB, kSep));
}

TEST(WordPiece, DecodeJoinsContinuationsAndCleansPunctuation) {
  auto t = Tiny();
  std::vector<int32_t> ids = {kCls, kHello, kComma, kWorld, kS, kDot, kSep};
  EXPECT_EQ(t->Decode(ids), "hello, worlds.");
  EXPECT_EQ(t->Decode(ids, /*skip_special=*/false), "[CLS] hello, worlds. [SEP]");
  EXPECT_TRUE(t->IsSpecial(kCls));
  EXPECT_FALSE(t->IsSpecial(kHello));
}

TEST(WordPiece, NormalizeMatchesBertNormalizer) {
  auto t = Tiny();
  EXPECT_EQ(t->Normalize("\xC3\x85ngstr\xC3\xB6m\tX\xE4\xBD\xA0"), "angstrom x \xE4\xBD\xA0 ");
  EXPECT_THAT(t->PreTokenize("don't stop"), ElementsAre("don", "'", "t", "stop"));
}

}  // namespace
}  // namespace stoke
