#include "text/jinja/py_str.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "text/utf8.h"

namespace sparkserve::jinja {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
    else { out.push_back(0xFFFD); ++i; continue; }
    if (i + n > s.size()) { out.push_back(0xFFFD); break; }
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) { append_utf8(out, c); }

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs 8 bytes at a time (a chat template checks whole messages).
    for (uint64_t w; i + 8 <= s.size(); i += 8) {
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
    }
    if (i == s.size()) break;
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    char32_t cp;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1f; }
    else if ((c >> 4) == 14) { n = 3; cp = c & 0x0f; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    i += n;
  }
  return true;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

bool py_isspace(char32_t c) {
  // Python: bidirectional class WS, B or S, or category Zs.
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

static utf8proc_category_t cat(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (cat(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool py_isalpha(char32_t c) {
  auto k = cat(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool py_isdigit(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; }
bool py_isalnum(char32_t c) {
  auto k = cat(c);
  return py_isalpha(c) || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
bool py_islower_char(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_LL; }
bool py_isupper_char(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_LU || cat(c) == UTF8PROC_CATEGORY_LT; }
bool py_iscased(char32_t c) {
  auto k = cat(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static char32_t upper1(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
static char32_t lower1(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
static char32_t title1(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

namespace {

// The code point that starts at s[i] / ends just before s[end] (valid UTF-8), and its byte length.
std::pair<char32_t, size_t> utf8_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return {cp, n};
}
std::pair<char32_t, size_t> utf8_before(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return {utf8_at(s, b).first, end - b};
}

}  // namespace

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  // Valid UTF-8 (all the engine holds) decodes and re-encodes to itself, so only the ends need
  // decoding: a chat template trims every message, and an agent's system prompt is ~50 KB.
  if (utf8_valid(s)) {
    size_t b = 0, e = s.size();
    while (left && b < e) {
      const auto [c, n] = utf8_at(s, b);
      if (!strip_it(c)) break;
      b += n;
    }
    while (right && e > b) {
      const auto [c, n] = utf8_before(s, e);
      if (!strip_it(c)) break;
      e -= n;
    }
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep, long maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    const std::string& d = *sep;
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
        size_t f = s.find(d, pos);
        if (f == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, f - pos));
        pos = f + d.size();
      }
      out.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      long n = 0;
      std::vector<std::string> rev;
      while (maxsplit < 0 || n < maxsplit) {
        if (end < d.size()) break;
        size_t f = s.rfind(d, end - d.size());
        if (f == std::string_view::npos) break;
        rev.emplace_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
        ++n;
      }
      rev.emplace_back(s.substr(0, end));
      out.assign(rev.rbegin(), rev.rend());
    }
    return out;
  }
  // Whitespace split: runs of whitespace separate, no empty strings.
  std::u32string u = utf8_decode(s);
  if (!from_right) {
    size_t i = 0;
    long n = 0;
    while (i < u.size()) {
      while (i < u.size() && py_isspace(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && n >= maxsplit) {
        size_t e = u.size();
        while (e > i && py_isspace(u[e - 1])) --e;
        out.push_back(utf8_encode(u.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !py_isspace(u[j])) ++j;
      out.push_back(utf8_encode(u.substr(i, j - i)));
      ++n;
      i = j;
    }
  } else {
    long i = static_cast<long>(u.size()) - 1;
    long n = 0;
    std::vector<std::string> rev;
    while (i >= 0) {
      while (i >= 0 && py_isspace(u[i])) --i;
      if (i < 0) break;
      if (maxsplit >= 0 && n >= maxsplit) {
        long b = 0;
        while (b <= i && py_isspace(u[b])) ++b;
        rev.push_back(utf8_encode(u.substr(b, i - b + 1)));
        break;
      }
      long j = i;
      while (j >= 0 && !py_isspace(u[j])) --j;
      rev.push_back(utf8_encode(u.substr(j + 1, i - j)));
      ++n;
      i = j;
    }
    out.assign(rev.rbegin(), rev.rend());
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::u32string u = utf8_decode(s);
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
  };
  while (i < u.size()) {
    if (is_break(u[i])) {
      size_t eol = i;
      size_t next = i + 1;
      if (u[i] == '\r' && next < u.size() && u[next] == '\n') ++next;
      out.push_back(utf8_encode(u.substr(start, (keepends ? next : eol) - start)));
      start = i = next;
    } else {
      ++i;
    }
  }
  if (start < u.size()) out.push_back(utf8_encode(u.substr(start)));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, long count) {
  std::string out;
  if (old.empty()) {
    // Python inserts repl between every code point (and at both ends), up to count times.
    std::u32string u = utf8_decode(s);
    long n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) { out += repl; ++n; }
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  long n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    pos = f + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

std::string py_upper(std::string_view s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) {
    if (c == 0xDF) { out += "SS"; continue; }  // the one full mapping chat text commonly meets
    utf8_append(out, upper1(c));
  }
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) utf8_append(out, lower1(c));
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    char32_t m = prev_cased ? lower1(c) : title1(c);
    utf8_append(out, m);
    prev_cased = py_iscased(c);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::u32string u = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) utf8_append(out, i == 0 ? title1(u[i]) : lower1(u[i]));
  return out;
}

long py_find(std::string_view s, std::string_view sub, bool from_right) {
  size_t f = from_right ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return static_cast<long>(utf8_length(s.substr(0, f)));
}

long py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<long>(utf8_length(s)) + 1;
  long n = 0;
  size_t pos = 0;
  while (true) {
    size_t f = s.find(sub, pos);
    if (f == std::string_view::npos) break;
    ++n;
    pos = f + sub.size();
  }
  return n;
}

}  // namespace sparkserve::jinja
