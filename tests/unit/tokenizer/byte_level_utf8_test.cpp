#include <gtest/gtest.h>

#include <set>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace sparkserve {
namespace {

TEST(ByteLevel, MapIsGpt2sBijection) {
  const auto& chars = byte_level_chars();
  std::set<std::string> distinct(chars.begin(), chars.end());
  EXPECT_EQ(distinct.size(), 256u);
  EXPECT_EQ(chars['A'], "A");
  EXPECT_EQ(chars['~'], "~");
  EXPECT_EQ(chars[0xE9], "\xC3\xA9");      // printable Latin-1 maps to itself (é)
  EXPECT_EQ(chars[' '], "\xC4\xA0");       // U+0120 'Ġ'
  EXPECT_EQ(chars['\n'], "\xC4\x8A");      // U+010A 'Ċ'
  EXPECT_EQ(chars[0], "\xC4\x80");         // U+0100
  EXPECT_EQ(chars[0xAD], "\xC5\x83");      // soft hyphen is the last remapped byte: U+0143
  for (int b = 0; b < 256; ++b) {
    auto back = byte_level_decode(chars[b]);
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, std::string(1, static_cast<char>(b)));
  }
}

TEST(ByteLevel, EncodeDecodeRoundTripAndUnmapped) {
  const std::string raw = "Hello, 世界\r\n\t\xff";
  EXPECT_EQ(byte_level_decode(byte_level_encode(raw)), raw);
  EXPECT_EQ(byte_level_encode("a b"), "a\xC4\xA0" "b");
  EXPECT_FALSE(byte_level_decode("\xE4\xB8\x96").has_value());  // U+4E16 is not a byte character
  EXPECT_FALSE(byte_level_decode(" ").has_value());             // plain space is not one either
}

TEST(Utf8, FindsFirstInvalidByte) {
  EXPECT_FALSE(find_invalid_utf8("").has_value());
  EXPECT_FALSE(find_invalid_utf8("plain ascii that is longer than eight bytes").has_value());
  EXPECT_FALSE(find_invalid_utf8("\xF0\x9F\x98\x80 \xE4\xB8\xAD \xC3\xA9 \xF4\x8F\xBF\xBF").has_value());
  EXPECT_EQ(find_invalid_utf8("ok\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("abcdefghij\x80"), 10u);
  EXPECT_EQ(find_invalid_utf8("\xC0\x80"), 0u);          // overlong
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\x80"), 0u);      // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // > U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ab\xE4\xB8"), 2u);        // truncated
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("a\xE4\xB8" "b"), "a" + fffd + "b");        // one truncated sequence -> one U+FFFD
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), fffd);
  EXPECT_EQ(utf8_lossy("\xC0\x80"), fffd + fffd);                   // C0 never starts a sequence
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), fffd + fffd + fffd);        // surrogates: each byte
  EXPECT_EQ(utf8_lossy("\xE4\xB8\xAD"), "\xE4\xB8\xAD");
}

TEST(Utf8, DecodeAndAppend) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  char32_t cp;
  EXPECT_EQ(decode_utf8_at(s, 0, cp), 1u);
  EXPECT_EQ(cp, U'a');
  EXPECT_EQ(decode_utf8_at(s, 1, cp), 2u);
  EXPECT_EQ(cp, U'\u00E9');
  EXPECT_EQ(decode_utf8_at(s, 3, cp), 3u);
  EXPECT_EQ(cp, U'\u4E2D');
  EXPECT_EQ(decode_utf8_at(s, 6, cp), 4u);
  EXPECT_EQ(cp, U'\U0001F600');
  EXPECT_EQ(last_utf8_char_length(s), 4u);
  std::string out;
  for (char32_t c : {U'a', U'\u00E9', U'\u4E2D', U'\U0001F600'}) append_utf8(out, c);
  EXPECT_EQ(out, s);
}

}  // namespace
}  // namespace sparkserve
