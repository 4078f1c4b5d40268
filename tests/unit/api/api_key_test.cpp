// The API-key check: the Bearer scheme is case-insensitive (RFC 9110 11.1), the key is not, and
// any difference (length, one byte anywhere) refuses.
#include "server/api_key.h"

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

TEST(ApiKey, BearerSchemeIsCaseInsensitive) {
  EXPECT_TRUE(api_key_matches("Bearer sekret", "sekret"));
  EXPECT_TRUE(api_key_matches("bearer sekret", "sekret"));
  EXPECT_TRUE(api_key_matches("BEARER  sekret ", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearer Sekret", "sekret"));
  EXPECT_FALSE(api_key_matches("Basic sekret", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearersekret", "sekret"));
  EXPECT_FALSE(api_key_matches("Bearer ", "sekret"));
  EXPECT_FALSE(api_key_matches(std::nullopt, "sekret"));
}

TEST(ApiKey, AnyDifferenceRefuses) {
  EXPECT_TRUE(constant_time_equals("abc", "abc"));
  EXPECT_TRUE(constant_time_equals("", ""));
  EXPECT_FALSE(constant_time_equals("abc", "abd"));
  EXPECT_FALSE(constant_time_equals("abc", "xbc"));
  EXPECT_FALSE(constant_time_equals("abc", "abcd"));
  EXPECT_FALSE(constant_time_equals("abcd", "abc"));
  EXPECT_FALSE(constant_time_equals("", "a"));
  EXPECT_FALSE(constant_time_equals(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

}  // namespace
}  // namespace sparkserve
