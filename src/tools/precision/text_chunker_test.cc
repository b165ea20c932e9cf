// The gate's text: whitespace normalisation of a hard-wrapped file, sentences, token windows.
#include "tools/precision/text_chunker.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace stoke::precision {
namespace {

TEST(NormalizeTextTest, UnwrapsLinesKeepsParagraphs) {
  EXPECT_EQ(NormalizeText("  The GNU General Public\n  License is a free,\n\n\n  copyleft licence.\n"),
            "The GNU General Public License is a free,\n\ncopyleft licence.");
  EXPECT_EQ(NormalizeText(" \n\t "), "");
}

TEST(SplitSentencesTest, SentencesParagraphsAndLimits) {
  const std::string text =
      "Short one. This sentence is long enough to be kept by the splitter. Is this one kept as well, "
      "really?\n\nA paragraph without a final stop that is long enough";
  const std::vector<std::string> s = SplitSentences(text);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], "This sentence is long enough to be kept by the splitter.");
  EXPECT_EQ(s[1], "Is this one kept as well, really?");
  EXPECT_EQ(s[2], "A paragraph without a final stop that is long enough");
  EXPECT_EQ(SplitSentences(text, {.max_count = 1}).size(), 1u);
  const std::vector<std::string> cut = SplitSentences(text, {.min_chars = 10, .max_chars = 20});
  EXPECT_EQ(cut[0], "Short one.");
  EXPECT_EQ(cut[1], "This sentence is");  // cut at the last space before 20 characters
  EXPECT_EQ(SplitSentences("e.g. 3.5 is a number with a dot inside it").size(), 1u);
}

TEST(TokenWindowsTest, CoverInOrder) {
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  const auto w = TokenWindows(ids, 3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].size(), 3u);
  EXPECT_EQ(w[2].size(), 1u);
  EXPECT_EQ(w[2][0], 7);
  EXPECT_TRUE(TokenWindows(ids, 0).empty());
}

TEST(ReadGateTextTest, UserFileAndMissingFiles) {
  const std::string path = (std::filesystem::temp_directory_path() / "stoke_gate_text_test.txt").string();
  {
    std::ofstream f(path);
    f << "Hello\n   world.\n";
  }
  auto t = ReadGateText(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, "Hello world.");
  std::filesystem::remove(path);
  auto missing = ReadGateText(path);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("--data"), std::string::npos);
}

}  // namespace
}  // namespace stoke::precision
