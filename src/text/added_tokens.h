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
};

// Matches a fixed set of added tokens in text.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is the string to find for `tokens[i]` (its content, normalized when the token
  // is a normalized one). Empty patterns are ignored.
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  bool empty() const { return entries_.empty(); }
  // Splits valid-UTF-8 `text` into segments that cover it in order.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Entry {
    AddedToken token;
    std::string pattern;
  };
  // Entries grouped by first byte, longest pattern first, so the first hit is the longest.
  std::vector<Entry> entries_;
  std::vector<uint32_t> by_first_byte_[256];
  bool first_byte_[256] = {};
};

}  // namespace sparkserve
