#include "base/constant_time.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret-key", "secret-key"));
  EXPECT_FALSE(ConstantTimeEquals("secret-key", "secret-kez"));
  EXPECT_FALSE(ConstantTimeEquals("secret-key", "Secret-key"));
  EXPECT_FALSE(ConstantTimeEquals("secret-key", "secret-ke"));    // a prefix
  EXPECT_FALSE(ConstantTimeEquals("secret-key", "secret-keyy"));  // longer
  EXPECT_FALSE(ConstantTimeEquals("secret-key", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  // A NUL inside is compared like any byte.
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
  EXPECT_TRUE(ConstantTimeEquals(std::string_view("a\0b", 3), std::string_view("a\0b", 3)));
}

}  // namespace
}  // namespace stoke
