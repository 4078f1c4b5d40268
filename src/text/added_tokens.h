// Added tokens (tokenizer.json "added_tokens"): matched on the text before the model sees it,
// with HF's leftmost-longest rule and the single_word / lstrip / rstrip flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sparkserve {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One segment of a text: either plain text (token < 0) or an added token's id; [begin, end) are
// byte offsets (lstrip/rstrip make an added token's segment include the whitespace it swallowed).
struct TextSegment {
  size_t begin, end;
  int32_t token;
  size_t match_end = 0;  // an added token: the end of its match (end lies past it after an rstrip)
};

// Where split() stands after emitting an added token's segment seg: the next segment starts at
// seg.end and the search for the next match at seg.match_end. What split() decided up to there
// depends on the text's first E + lookahead() bytes only, E the largest end of seg and the
// segments before it (an rstrip may swallow a later match: segments can overlap). A text that
// agrees with the split one on those bytes splits the same up to there, and the rest of its split
// is split(text, out, {seg.end, seg.match_end}).
struct SplitResume {
  size_t segment_begin = 0;
  size_t scan = 0;
};

// Matches a fixed set of added tokens in text.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is the string to find for `tokens[i]` (its content, normalized when the token
  // is a normalized one). Empty patterns are ignored.
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  bool empty() const { return entries_.empty(); }
  // Splits valid-UTF-8 `text` into segments that cover it in order (from `from` on: the segments
  // of text after that resume point).
  void split(std::string_view text, std::vector<TextSegment>& out, SplitResume from = {}) const;
  // Bytes past an added token's segment that decisions about it may have read: a pattern
  // starting at or before the segment's end (the longest one wins) and the character after it
  // (single_word; rstrip reads the character after the segment).
  size_t lookahead() const { return lookahead_; }

 private:
  struct Entry {
    AddedToken token;
    std::string pattern;
  };
  // Entries grouped by first byte, longest pattern first, so the first hit is the longest.
  std::vector<Entry> entries_;
  std::vector<uint32_t> by_first_byte_[256];
  bool first_byte_[256] = {};
  size_t lookahead_ = 4;  // the longest pattern + 4 (one UTF-8 character)
};

}  // namespace sparkserve
