// Checks against the real models on disk (located through STOKE_MODEL_DIR, default ~/.cache/stoke/models);
// skipped with a message when they are absent. Expected ids come from llama.cpp (SmolLM2) and HF tokenizers
// (MiniLM); the full corpus comparison lives in tests/golden/test_tokenizer_golden.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

namespace stoke {
namespace {

using ::testing::ElementsAre;

std::string ModelDir() {
  if (const char* d = std::getenv("STOKE_MODEL_DIR"); d != nullptr && *d != '\0') return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/stoke/models";
}

std::string SmolLmPath() {
  return ModelDir() + "/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
}
std::string MiniLmPath() {
  return ModelDir() + "/all-minilm-l6-v2";
}

#define REQUIRE_PATH(p)            \
  if (!std::filesystem::exists(p)) \
  GTEST_SKIP() << "model not on disk: " << (p) << " (run `stoke model fetch` or set STOKE_MODEL_DIR)"

TEST(RealModels, SmolLm2GgufMatchesLlamaCpp) {
  REQUIRE_PATH(SmolLmPath());
  auto tok = LoadTokenizer(SmolLmPath());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  ASSERT_FALSE(t.eos_ids().empty());
  EXPECT_EQ(t.eos_ids()[0], 2);
  EXPECT_TRUE(t.IsSpecial(2));
  // add_bos_token is false in this file: no BOS even with add_special.
  EXPECT_THAT(*t.Encode("Hello world"), ElementsAre(19556, 905));
  // Literal markers in user text stay text; in template output they are the control ids.
  EXPECT_THAT(*t.Encode("<|im_start|>user\nhi<|im_end|>"),
              ElementsAre(44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46));
  EXPECT_THAT(*t.Encode("<|im_start|>user\nhi<|im_end|>", {.parse_special = true}),
              ElementsAre(1, 4093, 198, 6004, 2));
  const std::string s = "Hello, world! It's 2024-12-31 and I'll pay $1,234.56.";
  EXPECT_THAT(*t.Encode(s), ElementsAre(19556, 28, 905, 17, 657, 506, 216, 34, 32, 34, 36, 29, 33, 34, 29, 35,
                                        33, 284, 339, 3060, 2290, 1885, 33, 28, 34, 35, 36, 30, 37, 38, 30));
  EXPECT_EQ(t.Decode(*t.Encode(s)), s);
}

TEST(RealModels, SmolLm2ChatTemplate) {
  REQUIRE_PATH(SmolLmPath());
  auto ct = ChatTemplate::FromModel(SmolLmPath());
  ASSERT_TRUE(ct.ok()) << ct.status().ToString();
  EXPECT_EQ(ct->name(), "chatml");
  EXPECT_EQ(
      *ct->Apply({{"user", "Hi"}}),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(RealModels, MiniLmMatchesHfTokenizers) {
  REQUIRE_PATH(MiniLmPath());
  auto tok = LoadTokenizer(MiniLmPath());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 30522);
  EXPECT_THAT(*t.Encode("Hello, world!"), ElementsAre(101, 7592, 1010, 2088, 999, 102));
  EXPECT_THAT(*t.Encode("H\xC3\xA9llo WORLD [CLS] unaffable"),
              ElementsAre(101, 7592, 2088, 1031, 18856, 2015, 1033, 14477, 20961, 3468, 102));
  EXPECT_THAT(*t.Encode("H\xC3\xA9llo WORLD [CLS] unaffable", {.parse_special = true}),
              ElementsAre(101, 7592, 2088, 101, 14477, 20961, 3468, 102));
  EXPECT_EQ(t.Decode(*t.Encode("Hello, world!")), "hello, world!");
  // No chat template in an encoder folder: a clear error, not a guess.
  auto ct = ChatTemplate::FromModel(MiniLmPath());
  ASSERT_FALSE(ct.ok());
  EXPECT_THAT(ct.status().message(), ::testing::HasSubstr("no chat template"));
}

}  // namespace
}  // namespace stoke
