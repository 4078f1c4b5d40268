#include "text/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstring>

#include "text/utf8.h"

namespace sparkserve {
namespace {

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// HF's word test for single_word: Rust's char::is_alphanumeric() or '_'. Alphanumeric is
// approximated by the general categories L* and N* (Rust also counts Other_Alphabetic marks).
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

char32_t last_char(std::string_view s) {
  char32_t cp;
  decode_utf8_at(s, s.size() - last_utf8_char_length(s), cp);
  return cp;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (patterns[i].empty()) continue;
    entries_.push_back({std::move(tokens[i]), std::move(patterns[i])});
  }
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const auto b = static_cast<unsigned char>(entries_[i].pattern[0]);
    by_first_byte_[b].push_back(i);
    first_byte_[b] = true;
    lookahead_ = std::max(lookahead_, entries_[i].pattern.size() + 4);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return entries_[a].pattern.size() > entries_[b].pattern.size();
    });
  }
}

// HF's AddedVocabulary::find_matches over aho-corasick LeftmostLongest matches.
void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out, SplitResume from) const {
  size_t start_offset = from.segment_begin;  // end of the last emitted segment
  size_t scan = from.scan;                   // where the automaton resumes: the end of the last raw match
  const size_t n = text.size();
  while (scan < n) {
    // Leftmost position where some pattern matches; the longest pattern there.
    const Entry* hit = nullptr;
    size_t pos = scan;
    for (; pos < n; ++pos) {
      const auto b = static_cast<unsigned char>(text[pos]);
      if (!first_byte_[b]) continue;
      for (uint32_t idx : by_first_byte_[b]) {
        const std::string& p = entries_[idx].pattern;
        if (p.size() <= n - pos && std::memcmp(text.data() + pos, p.data(), p.size()) == 0) {
          hit = &entries_[idx];
          break;
        }
      }
      if (hit) break;
    }
    if (!hit) break;
    size_t start = pos, stop = pos + hit->pattern.size();
    scan = stop;
    const AddedToken& tok = hit->token;
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      char32_t next_cp = 0;
      if (stop < n) decode_utf8_at(text, stop, next_cp);
      const bool stop_space = stop == n || !is_word_char(next_cp);
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t len = last_utf8_char_length(text.substr(0, s));
        if (!is_white_space(last_char(text.substr(0, s)))) break;
        s -= len;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < n) {
        char32_t cp;
        const size_t len = decode_utf8_at(text, stop, cp);
        if (!is_white_space(cp)) break;
        stop += len;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id, scan});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
}

}  // namespace sparkserve
