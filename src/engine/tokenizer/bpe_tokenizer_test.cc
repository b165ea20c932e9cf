#include "engine/tokenizer/bpe_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/tokenizer/unicode_util.h"

namespace stoke {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// A tiny byte-level vocabulary: ids 0..255 are the 256 byte stand-ins, then one token per merge result, then
// the extra (added) tokens.
using Merges = std::vector<std::pair<std::string, std::string>>;

struct TinyVocab {
  BpeVocab v;
  std::map<std::string, int32_t> ids;  // raw text -> id

  explicit TinyVocab(Merges merges, std::string pre = "gpt2") {
    for (int b = 0; b < 256; ++b) Add(tok::ByteToUnicode(static_cast<uint8_t>(b)), TokenKind::kNormal);
    for (const auto& [a, b] : merges) {
      const std::string ea = tok::ByteLevelEncode(a), eb = tok::ByteLevelEncode(b);
      v.merges.emplace_back(ea, eb);
      if (!Has(ea + eb)) Add(ea + eb, TokenKind::kNormal);
    }
    v.pre = *tok::PreTokenizer::ForGgufPre(pre);
    v.source = "tiny";
  }
  bool Has(const std::string& t) const {
    return std::find(v.tokens.begin(), v.tokens.end(), t) != v.tokens.end();
  }
  int32_t Add(const std::string& stored, TokenKind kind) {
    v.tokens.push_back(stored);
    v.kinds.push_back(kind);
    const int32_t id = static_cast<int32_t>(v.tokens.size() - 1);
    ids[kind == TokenKind::kNormal ? tok::ByteLevelDecode(stored) : stored] = id;
    return id;
  }
  int32_t AddSpecial(const std::string& text, bool special) {
    const int32_t id = Add(text, special ? TokenKind::kControl : TokenKind::kUserDefined);
    v.added.push_back({text, id, special});
    return id;
  }
  int32_t Id(const std::string& raw) const { return ids.at(raw); }
  std::unique_ptr<BpeTokenizer> Build() { return std::move(BpeTokenizer::Create(v)).value(); }
};

std::vector<int32_t> Enc(const Tokenizer& t, std::string_view text, EncodeOptions o = {}) {
  auto r = t.Encode(text, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<int32_t>{};
}

TEST(BpeTokenizer, LowestRankMergesFirstNotLeftmost) {
  // "abc": (b,c) has rank 0, so it wins over the leftmost pair (a,b) with rank 1; "a"+"bc" has no merge.
  TinyVocab tv(Merges{{"b", "c"}, {"a", "b"}});
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "abc"), ElementsAre(tv.Id("a"), tv.Id("bc")));
  EXPECT_THAT(Enc(*t, "abd"), ElementsAre(tv.Id("ab"), tv.Id("d")));
}

TEST(BpeTokenizer, MergesChainToLongerTokens) {
  TinyVocab tv(Merges{{"a", "b"}, {"b", "c"}, {"ab", "c"}});
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "abc"), ElementsAre(tv.Id("abc")));
  EXPECT_THAT(Enc(*t, "bcc"), ElementsAre(tv.Id("bc"), tv.Id("c")));
}

TEST(BpeTokenizer, EqualRanksMergeLeftToRight) {
  TinyVocab tv(Merges{{"a", "a"}});
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "aaa"), ElementsAre(tv.Id("aa"), tv.Id("a")));
  EXPECT_THAT(Enc(*t, "aaaa"), ElementsAre(tv.Id("aa"), tv.Id("aa")));
}

TEST(BpeTokenizer, MergesNeverCrossPreTokens) {
  // " b" is one GPT-2 pre-token; "a" and " b" are separate, so the (a, " ") merge cannot fire.
  TinyVocab tv(Merges{{"a", " "}, {" ", "b"}});
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "a b"), ElementsAre(tv.Id("a"), tv.Id(" b")));
  // Trailing whitespace run before a word gives up its last space to the word: "a", "  ", " b".
  EXPECT_THAT(Enc(*t, "a   b"), ElementsAre(tv.Id("a"), tv.Id(" "), tv.Id(" "), tv.Id(" b")));
}

TEST(BpeTokenizer, ByteLevelCoversAnyUtf8AndRoundTrips) {
  TinyVocab tv(Merges{{"h", "i"}});
  auto t = tv.Build();
  const std::string text = "hi \xC3\xA9t\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80\t\r\n  x";
  auto ids = Enc(*t, text);
  EXPECT_EQ(ids[0], tv.Id("hi"));
  EXPECT_EQ(t->Decode(ids), text);
}

TEST(BpeTokenizer, SpecialTokensMatchedOnlyWithParseSpecial) {
  TinyVocab tv(Merges{{"h", "i"}});
  const int32_t im_start = tv.AddSpecial("<|im_start|>", /*special=*/true);
  auto t = tv.Build();
  auto plain = Enc(*t, "<|im_start|>hi");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
  EXPECT_EQ(t->Decode(plain), "<|im_start|>hi");
  EXPECT_THAT(Enc(*t, "<|im_start|>hi", {.parse_special = true}), ElementsAre(im_start, tv.Id("hi")));
  EXPECT_TRUE(t->IsSpecial(im_start));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{im_start, tv.Id("hi")}), "hi");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{im_start, tv.Id("hi")}, /*skip_special=*/false), "<|im_start|>hi");
  EXPECT_EQ(t->TokenBytes(im_start), "");
}

TEST(BpeTokenizer, UserDefinedTokensAlwaysMatched) {
  TinyVocab tv(Merges{});
  const int32_t user = tv.AddSpecial("<tool>", /*special=*/false);
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "a<tool>b"), ElementsAre(tv.Id("a"), user, tv.Id("b")));
  EXPECT_FALSE(t->IsSpecial(user));
  EXPECT_EQ(t->TokenBytes(user), "<tool>");
}

TEST(BpeTokenizer, LongestAddedTokenWins) {
  TinyVocab tv(Merges{});
  const int32_t short_tok = tv.AddSpecial("<|a", false);
  const int32_t long_tok = tv.AddSpecial("<|a|>", false);
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "<|a|><|a"), ElementsAre(long_tok, short_tok));
}

TEST(BpeTokenizer, SmolLmIsolatesEveryDigit) {
  TinyVocab tv(Merges{{"1", "2"}, {" ", "1"}}, "smollm");
  auto t = tv.Build();
  // Digits are isolated before the GPT-2 regex, so neither "12" nor " 1" can form.
  EXPECT_THAT(Enc(*t, "x 12"), ElementsAre(tv.Id("x"), tv.Id(" "), tv.Id("1"), tv.Id("2")));
  TinyVocab gpt2(Merges{{" ", "1"}, {" 1", "2"}, {"1", "2"}});
  auto g = gpt2.Build();
  EXPECT_THAT(Enc(*g, "x 12"), ElementsAre(gpt2.Id("x"), gpt2.Id(" 12")));
}

TEST(BpeTokenizer, Llama3GroupsDigitsByThreeAndIgnoresMerges) {
  TinyVocab tv(Merges{{"1", "2"}, {"12", "3"}}, "llama-bpe");
  tv.v.ignore_merges = true;
  const int32_t whole = tv.Add(tok::ByteLevelEncode("abcd"), TokenKind::kNormal);  // no merge path leads here
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "1234"), ElementsAre(tv.Id("123"), tv.Id("4")));
  EXPECT_THAT(Enc(*t, "abcd"), ElementsAre(whole));
  EXPECT_THAT(Enc(*t, "abc"), ElementsAre(tv.Id("a"), tv.Id("b"), tv.Id("c")));
}

TEST(BpeTokenizer, WrapAddsBosAndTruncates) {
  TinyVocab tv(Merges{});
  const int32_t bos = tv.AddSpecial("<s>", true);
  tv.v.bos_id = bos;
  tv.v.wrap.prefix = {bos};
  auto t = tv.Build();
  EXPECT_THAT(Enc(*t, "ab"), ElementsAre(bos, tv.Id("a"), tv.Id("b")));
  EXPECT_THAT(Enc(*t, "ab", {.add_special = false}), ElementsAre(tv.Id("a"), tv.Id("b")));
  EXPECT_THAT(Enc(*t, "abc", {.max_length = 2}), ElementsAre(bos, tv.Id("a")));
  EXPECT_EQ(t->bos_id(), bos);
}

TEST(BpeTokenizer, RejectsInvalidUtf8) {
  TinyVocab tv(Merges{});
  auto t = tv.Build();
  auto r = t->Encode("ok \xC3(");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("byte 3"));
}

TEST(BpeTokenizer, CreateRejectsOutOfRangeIds) {
  TinyVocab tv(Merges{});
  tv.v.eos_ids = {100000};
  auto r = BpeTokenizer::Create(tv.v);
  EXPECT_FALSE(r.ok());
}

TEST(PreTokenizer, Gpt2RegexPieces) {
  auto pre = *tok::PreTokenizer::ForGgufPre("gpt2");
  std::vector<std::string> pieces;
  pre.Split("Hello world's  test, 2024!\n\nok  ", &pieces);
  EXPECT_THAT(pieces,
              ElementsAre("Hello", " world", "'s", " ", " test", ",", " 2024", "!", "\n", "\n", "ok", "  "));
}

TEST(PreTokenizer, Llama3RegexPieces) {
  auto pre = *tok::PreTokenizer::ForGgufPre("llama-bpe");
  std::vector<std::string> pieces;
  pre.Split("I'LL pay 1234567 now!!\r\n\n x", &pieces);
  EXPECT_THAT(pieces, ElementsAre("I", "'LL", " pay", " ", "123", "456", "7", " now", "!!\r\n\n", " x"));
}

TEST(PreTokenizer, UnknownGgufPreIsAnError) {
  auto r = tok::PreTokenizer::ForGgufPre("no-such-pre");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("no-such-pre"));
}

TEST(PreTokenizer, JsonSequenceSplitThenByteLevel) {
  auto j = nlohmann::json::parse(R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"\\p{N}{1,3}"},"behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":true,"use_regex":false}]})");
  auto pre = tok::PreTokenizer::FromJson(j);
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  EXPECT_TRUE(pre->has_byte_level());
  std::vector<std::string> pieces;
  pre->Split("ab12345", &pieces);
  EXPECT_THAT(pieces, ElementsAre(" ab", " 123", " 45"));
}

TEST(PreTokenizer, JsonUnsupportedTypeNamed) {
  auto r = tok::PreTokenizer::FromJson(nlohmann::json::parse(R"({"type":"Metaspace"})"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("Metaspace"));
}

}  // namespace
}  // namespace stoke
