// Regular expressions for constrained decoding (JSON Schema `pattern`, structured_outputs
// `regex`), compiled to a Thompson NFA over Unicode code points whose set of live states is a
// fixed-size bitset, so a decoding state can be copied per candidate token without allocating.
//
// The syntax is the ECMA-262 subset that schemas use: literals, `.`, classes `[a-z]`, `[^...]`,
// escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation,
// groups `( )`, `(?: )`, `(?<name> )`, alternation, quantifiers * + ? {n} {n,} {n,m} (lazy
// forms accepted: they match the same strings). `^` / `$` only at the start / end of a top-level
// alternative. Refused with a message naming the construct: backreferences, lookaround, \b / \B,
// \p{..}, flags, and patterns needing more than kMaxStates states.
#pragma once

#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sparkserve {

class RegexNfa {
 public:
  static constexpr size_t kMaxStates = 512;
  using States = std::bitset<kMaxStates>;

  // kSearch: JSON Schema's `pattern` (unanchored: matches a string that contains a match, unless
  // `^` / `$` anchor it). kFullMatch: the whole text must match (structured_outputs.regex).
  enum class Mode { kSearch, kFullMatch };

  static Expected<RegexNfa> compile(std::string_view pattern, Mode mode);

  // The live states before any input.
  const States& initial() const { return start_; }
  // Advances by one code point; false (s unchanged) when no state survives.
  bool step(States& s, char32_t cp) const;
  // Whether some live state can move on a code point in [lo, hi] (a partly read UTF-8 character
  // or escape: refusing its first byte early keeps a decoder from getting stuck mid-character).
  bool can_step_range(const States& s, char32_t lo, char32_t hi) const;
  bool accepting(const States& s) const { return s.test(static_cast<size_t>(accept_)); }
  size_t num_states() const { return char_set_.size(); }

 private:
  struct Range {
    char32_t lo, hi;
  };
  struct CharSet {
    std::vector<Range> ranges;  // sorted, merged
    bool negated = false;
    bool contains(char32_t cp) const;
    bool intersects(char32_t lo, char32_t hi) const;
  };
  friend class RegexBuilder;

  std::vector<CharSet> sets_;
  std::vector<int32_t> char_set_;  // per state: index into sets_, or -1 (epsilon / accept state)
  std::vector<int32_t> next_;      // per state: the target of its character transition
  std::vector<States> closure_;    // per state: the states reachable by epsilon moves (itself included)
  States start_;
  int32_t accept_ = 0;
};

}  // namespace sparkserve
