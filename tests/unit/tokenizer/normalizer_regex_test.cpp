#include <gtest/gtest.h>

#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/regex.h"
#include "tiny_tokenizer.h"

namespace sparkserve {
namespace {

using testing::kQwen2Pattern;
using testing::kQwen35Pattern;

TEST(Normalizer, NfcComposesDecomposedText) {
  auto n = Normalizer::from_json({{"type", "NFC"}});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->normalize("cafe\xCC\x81"), "caf\xC3\xA9");                    // e + U+0301 -> é
  EXPECT_EQ(n->normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(n->normalize("\xE2\x84\xAB"), "\xC3\x85");                      // Angstrom sign -> Å
  EXPECT_EQ(n->normalize("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");     // reorder: dot below first
  EXPECT_EQ(n->normalize("plain"), "plain");
  EXPECT_EQ(n->normalize(std::string("nul\0inside", 10)), std::string("nul\0inside", 10));
}

TEST(Normalizer, SequenceNullAndOtherForms) {
  auto seq = Normalizer::from_json({{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "NFC"}}}}});
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(seq->normalize("e\xCC\x81"), "\xC3\xA9");
  auto none = Normalizer::from_json(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->is_identity());
  EXPECT_EQ(none->normalize("e\xCC\x81"), "e\xCC\x81");
  auto nfkc = Normalizer::from_json({{"type", "NFKC"}});
  ASSERT_TRUE(nfkc.ok());
  EXPECT_EQ(nfkc->normalize("\xEF\xBC\x91"), "1");  // fullwidth 1
}

TEST(Normalizer, UnsupportedTypeIsNamed) {
  auto n = Normalizer::from_json({{"type", "Lowercase"}});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.message().find("Lowercase"), std::string::npos) << n.message();
}

std::vector<std::string> split(const std::string& pattern, const std::string& text) {
  auto p = PreTokenizer::from_json({{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}});
  EXPECT_TRUE(p.ok()) << p.message();
  std::vector<std::string> pieces;
  EXPECT_TRUE(p->split(text, pieces).ok());
  return pieces;
}

TEST(Regex, Qwen35PatternKeepsCombiningMarksInWords) {
  // नमस्ते: letters with dependent vowel signs and virama (\p{M}).
  const std::string namaste = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_EQ(split(kQwen35Pattern, namaste), std::vector<std::string>{namaste});
  EXPECT_GT(split(kQwen2Pattern, namaste).size(), 1u);
  // A decomposed accent after a letter stays in the word only with \p{M}.
  EXPECT_EQ(split(kQwen35Pattern, "e\xCC\x81t\xC3\xA9"), std::vector<std::string>{"e\xCC\x81t\xC3\xA9"});
  EXPECT_EQ(split(kQwen2Pattern, "e\xCC\x81t"), (std::vector<std::string>{"e", "\xCC\x81t"}));
}

TEST(Regex, Qwen35PatternPieces) {
  EXPECT_EQ(split(kQwen35Pattern, "Hello world's 12 ab!!\n\n  x"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", "1", "2", " ab", "!!\n\n", " ", " x"}));
  EXPECT_EQ(split(kQwen35Pattern, "IT'S"), (std::vector<std::string>{"IT", "'S"}));
  EXPECT_EQ(split(kQwen35Pattern, "a   "), (std::vector<std::string>{"a", "   "}));
  EXPECT_EQ(split(kQwen35Pattern, "a\r\n\r\nb"), (std::vector<std::string>{"a", "\r\n\r\n", "b"}));
}

TEST(Regex, WhiteSpaceClassIsOniguruma) {
  // \s is Unicode White_Space: U+0085 and U+3000 yes, U+180E and U+200B no.
  EXPECT_EQ(split(R"(\s+)", "a\xC2\x85" "b"), (std::vector<std::string>{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(split(R"(\s+)", "a\xE3\x80\x80" "b"), (std::vector<std::string>{"a", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(split(R"(\s+)", "a\xE1\xA0\x8E" "b"), std::vector<std::string>{"a\xE1\xA0\x8E" "b"});
  EXPECT_EQ(split(R"(\S+)", "a\xE1\xA0\x8E" "b c"), (std::vector<std::string>{"a\xE1\xA0\x8E" "b", " ", "c"}));
  EXPECT_EQ(oniguruma_compatible_pattern(R"([^\s\p{L}]x\\s)"),
            R"([^\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\p{L}]x\\s)");
}

TEST(Regex, LongInputsNeedNoRecursionLimit) {
  // 1 MB of spaces followed by a letter exercises \s+(?!\S) backtracking.
  std::string text(1 << 20, ' ');
  text += "x";
  auto pieces = split(kQwen35Pattern, text);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].size(), (1u << 20) - 1);
  EXPECT_EQ(pieces[1], " x");
}

TEST(Regex, BadPatternIsAnError) {
  auto r = Regex::compile("(unclosed");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("(unclosed"), std::string::npos) << r.message();
}

TEST(PreTokenizer, SplitBehaviors) {
  auto make = [](const char* behavior, bool invert = false) {
    auto p = PreTokenizer::from_json(
        {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}});
    EXPECT_TRUE(p.ok());
    std::vector<std::string> pieces;
    EXPECT_TRUE(p->split("a-b--c", pieces).ok());
    return pieces;
  };
  EXPECT_EQ(make("Isolated"), (std::vector<std::string>{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(make("Removed"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(make("MergedWithPrevious"), (std::vector<std::string>{"a-", "b-", "-", "c"}));
  EXPECT_EQ(make("MergedWithNext"), (std::vector<std::string>{"a", "-b", "-", "-c"}));
  EXPECT_EQ(make("Contiguous"), (std::vector<std::string>{"a", "-", "b", "--", "c"}));
  auto bad = PreTokenizer::from_json({{"type", "Whitespace"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("Whitespace"), std::string::npos);
}

TEST(PreTokenizer, ByteLevelWithGpt2Regex) {
  auto p = PreTokenizer::from_json({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}});
  ASSERT_TRUE(p.ok());
  std::vector<std::string> pieces;
  ASSERT_TRUE(p->split("Hello world's 123  x", pieces).ok());
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", " world", "'s", " 123", " ", " x"}));
  auto q = PreTokenizer::from_json({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}});
  ASSERT_TRUE(q.ok());
  pieces.clear();
  ASSERT_TRUE(q->split("Hi", pieces).ok());
  EXPECT_EQ(pieces, std::vector<std::string>{" Hi"});
}

}  // namespace
}  // namespace sparkserve
