#include "base/status.h"

#include <gtest/gtest.h>

namespace stoke {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("{} is odd", x);
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = NotFoundError("model {} missing", "m");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: model m missing");
  EXPECT_EQ(s.WithContext("load").message(), "load: model m missing");
  EXPECT_TRUE(OkStatus().ok());
}

TEST(StatusTest, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
}

}  // namespace
}  // namespace stoke
