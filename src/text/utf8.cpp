#include "text/utf8.h"

#include <cstdint>

namespace sparkserve {
namespace {

// Length of the well-formed sequence at s[pos], or 0 if ill-formed. When ill-formed, `subpart`
// gets the length of the maximal prefix that could still have started a well-formed sequence.
size_t well_formed_length(std::string_view s, size_t pos, size_t& subpart) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  subpart = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (pos + i >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[pos + i]);
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return 0;
    subpart = i + 1;
  }
  return need;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t pos = 0;
  const size_t n = s.size();
  while (pos < n) {
    // ASCII fast path, 8 bytes at a time.
    while (pos + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + pos, 8);
      if (w & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= n) break;
    if (static_cast<unsigned char>(s[pos]) < 0x80) { ++pos; continue; }
    size_t subpart;
    const size_t len = well_formed_length(s, pos, subpart);
    if (len == 0) return pos;
    pos += len;
  }
  return std::nullopt;
}

size_t last_utf8_char_length(std::string_view s) {
  size_t len = 1;
  while (len < s.size() && len < 4 && (static_cast<unsigned char>(s[s.size() - len]) & 0xC0) == 0x80) ++len;
  return len;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t subpart;
    const size_t len = well_formed_length(s, pos, subpart);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      pos += subpart;
    } else {
      out.append(s.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

}  // namespace sparkserve
