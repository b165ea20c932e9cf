#include "serve/stop_filter.h"

#include <gtest/gtest.h>

#include <random>

namespace stoke {
namespace {

// Feeds `pieces` and returns what was emitted, and whether it stopped.
std::pair<std::string, bool> Feed(const std::vector<std::string>& stops,
                                  const std::vector<std::string>& pieces) {
  StopFilter f(stops);
  std::string out;
  for (const std::string& p : pieces) {
    StopFilter::Result r = f.Push(p);
    out += r.text;
    if (r.stopped) return {out, true};
  }
  return {out + f.Flush(), false};
}

TEST(StopFilterTest, NoStopsPassesThrough) {
  StopFilter f({});
  EXPECT_EQ(f.Push("abc").text, "abc");
  EXPECT_EQ(f.held_size(), 0u);
  EXPECT_EQ(f.Flush(), "");
}

TEST(StopFilterTest, HoldsBackAPossibleStartAndReleasesIt) {
  StopFilter f({"END"});
  StopFilter::Result r = f.Push("abcE");
  EXPECT_EQ(r.text, "abc");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(f.held_size(), 1u);
  r = f.Push("N");
  EXPECT_EQ(r.text, "");
  r = f.Push("x");  // "ENx": not the stop string after all
  EXPECT_EQ(r.text, "ENx");
  EXPECT_EQ(f.Flush(), "");
}

TEST(StopFilterTest, StopsAcrossPiecesAndNeverEmitsTheStop) {
  EXPECT_EQ(Feed({"\n\nUser:"}, {"Hello", "\n", "\nUs", "er:", " more"}),
            std::make_pair(std::string("Hello"), true));
  // The stop string in the middle of one piece: text before it is kept, after it dropped.
  EXPECT_EQ(Feed({"STOP"}, {"abSTOPcd"}), std::make_pair(std::string("ab"), true));
  // The earliest of several stop strings wins.
  EXPECT_EQ(Feed({"cd", "b"}, {"abcd"}), std::make_pair(std::string("a"), true));
  // Held text is released at the end when no stop completes.
  EXPECT_EQ(Feed({"xyz"}, {"abx", "y"}), std::make_pair(std::string("abxy"), false));
  // Empty stop strings are ignored.
  EXPECT_EQ(Feed({""}, {"ab"}), std::make_pair(std::string("ab"), false));
}

TEST(StopFilterTest, PushAfterStopEmitsNothing) {
  StopFilter f({"x"});
  EXPECT_TRUE(f.Push("axb").stopped);
  StopFilter::Result r = f.Push("more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(f.Flush(), "");
}

// Any split of a text into pieces emits the same as the text cut at the first stop occurrence.
TEST(StopFilterTest, RandomSplitsAgreeWithOneShot) {
  std::mt19937 rng(7);
  const std::vector<std::string> stops = {"aba", "bb", "cab"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    for (int i = std::uniform_int_distribution<int>(0, 20)(rng); i > 0; --i) text += "abc"[rng() % 3];
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    const std::string expect = cut == std::string::npos ? text : text.substr(0, cut);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(0, 4)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    auto [got, stopped] = Feed(stops, pieces);
    ASSERT_EQ(got, expect) << text;
    ASSERT_EQ(stopped, cut != std::string::npos) << text;
  }
}

}  // namespace
}  // namespace stoke
