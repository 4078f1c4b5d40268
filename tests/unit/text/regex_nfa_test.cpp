// RegexNfa against std::regex (ECMAScript grammar, an implementation nobody here wrote) on every
// string up to length 5 over a small alphabet per pattern, in both modes: full match
// (regex_match) and JSON Schema's search semantics (regex_search).
#include "text/regex_nfa.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

namespace sparkserve {
namespace {

bool nfa_matches(const RegexNfa& re, const std::string& s) {
  RegexNfa::States st = re.initial();
  for (unsigned char c : s)
    if (!re.step(st, c)) return false;
  return re.accepting(st);
}

void all_strings(const std::string& alphabet, size_t max_len, const std::function<void(const std::string&)>& fn) {
  std::vector<std::string> level{""};
  fn("");
  for (size_t len = 1; len <= max_len; ++len) {
    std::vector<std::string> next;
    for (const auto& s : level)
      for (char c : alphabet) {
        next.push_back(s + c);
        fn(next.back());
      }
    level = std::move(next);
  }
}

struct Case {
  const char* pattern;
  const char* alphabet;
};

TEST(RegexNfa, AgreesWithStdRegexOnShortStrings) {
  const std::vector<Case> cases = {
      {"abc", "abcx"},
      {"^abc$", "abcx"},
      {"a|b", "abx"},
      {"^(a|bc)*$", "abcx"},
      {"^a+b?c{2,3}$", "abcx"},
      {"^[a-c]{2}$", "abcd"},
      {"^[^a]+$", "ab\n"},
      {"^\\d{1,3}(\\.\\d+)?$", "12.x"},
      {"^\\w+@\\w+$", "a1@_ -"},
      {"^\\s*x\\s*$", " x\ty"},
      {"^a.c$", "abc\n"},
      {"^(?:ab|a)(b|)$", "abx"},
      {"^[-a]+$", "a-b"},
      {"^a{0}b$", "ab"},
      {"^a{2,}$", "ab"},
      {"x*?y", "xyz"},
      {"^(a|b)?c$|^d$", "abcd"},
      {"^\\$\\.\\*$", "$.*a"},
      {"[0-9]{4}-[0-9]{2}", "0-1"},
      {"^([01][0-9]|2[0-3]):[0-5][0-9]$", "0123:5"},
  };
  for (const auto& c : cases) {
    for (auto mode : {RegexNfa::Mode::kFullMatch, RegexNfa::Mode::kSearch}) {
      auto re = RegexNfa::compile(c.pattern, mode);
      ASSERT_TRUE(re.ok()) << c.pattern << ": " << re.message();
      const std::regex oracle(c.pattern, std::regex::ECMAScript);
      int checked = 0;
      all_strings(c.alphabet, 5, [&](const std::string& s) {
        // Full match of a pattern with anchors: std::regex_match treats ^/$ as assertions, the same.
        const bool want = mode == RegexNfa::Mode::kFullMatch ? std::regex_match(s, oracle) : std::regex_search(s, oracle);
        EXPECT_EQ(nfa_matches(*re, s), want) << "pattern " << c.pattern << " mode " << int(mode) << " on \"" << s << "\"";
        ++checked;
      });
      EXPECT_GT(checked, 30);
    }
  }
}

TEST(RegexNfa, UnicodeClassesWorkOnCodePoints) {
  auto re = RegexNfa::compile("^[α-ω]+.$", RegexNfa::Mode::kFullMatch);
  ASSERT_TRUE(re.ok()) << re.message();
  RegexNfa::States s = re->initial();
  for (char32_t cp : {U'β', U'γ', U'中'}) ASSERT_TRUE(re->step(s, cp));
  EXPECT_TRUE(re->accepting(s));
  s = re->initial();
  EXPECT_FALSE(re->step(s, U'a'));
  // A partly read character: only ranges that the pattern can still take.
  s = re->initial();
  EXPECT_TRUE(re->can_step_range(s, 0x3B0, 0x3BF));
  EXPECT_FALSE(re->can_step_range(s, 0x4E00, 0x4E0F));
}

TEST(RegexNfa, RefusesWhatItCannotMatchWithANamedReason) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"(a)\\1", "backreferences"}, {"a(?=b)", "lookaround"}, {"\\bword", "word boundaries"},
      {"a^b", "'^'"},            {"a$b", "'$'"},         {"\\p{L}", "Unicode property"},
      {"(ab", "')'"},            {"a{3,2}", "m < n"},     {"[b-a]", "out of order"},
      {"a{1000}{1000}", "too large"}, {"*a", "nothing to repeat"}};
  for (const auto& [p, why] : bad) {
    auto re = RegexNfa::compile(p, RegexNfa::Mode::kSearch);
    ASSERT_FALSE(re.ok()) << p;
    EXPECT_NE(re.message().find(why), std::string::npos) << p << ": " << re.message();
  }
}

}  // namespace
}  // namespace sparkserve
