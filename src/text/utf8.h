// Small UTF-8 helpers for the text layer (validation with byte offsets, decoding one code point,
// and the lossy conversion that Hugging Face's decode applies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sparkserve {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlongs,
// surrogates and code points above U+10FFFF count as ill-formed), or nullopt if `s` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Decodes the code point at s[pos] of VALID UTF-8 and returns its length in bytes.
inline size_t decode_utf8_at(std::string_view s, size_t pos, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) { cp = b0; return 1; }
  if (b0 < 0xE0) { cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[pos + 1]) & 0x3Fu); return 2; }
  if (b0 < 0xF0) {
    cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[pos + 1]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(s[pos + 2]) & 0x3Fu);
    return 3;
  }
  cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[pos + 1]) & 0x3Fu) << 12) |
       ((static_cast<unsigned char>(s[pos + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(s[pos + 3]) & 0x3Fu);
  return 4;
}

// Length of the last code point of VALID, non-empty UTF-8 `s`.
size_t last_utf8_char_length(std::string_view s);

void append_utf8(std::string& out, char32_t cp);

// Replaces each maximal ill-formed subpart with U+FFFD (Unicode's recommended practice; the same
// result as Rust's String::from_utf8_lossy, which HF tokenizers' decode uses).
std::string utf8_lossy(std::string_view s);


// Incremental UTF-8 decoding one byte at a time, with the well-formedness rules of Unicode
// Table 3-7 (no overlongs, surrogates or code points above U+10FFFF), for the byte-level
// automata of constrained decoding. Equality compares the whole state.
struct Utf8Stepper {
  enum Result : uint8_t { kChar, kMore, kBad };  // kChar: cp holds a complete code point
  uint8_t need = 0;               // continuation bytes still expected
  uint8_t lo = 0x80, hi = 0xBF;   // allowed range of the next continuation byte
  char32_t cp = 0;

  Result feed(uint8_t b) {
    if (need == 0) {
      lo = 0x80, hi = 0xBF;
      if (b < 0x80) { cp = b; return kChar; }
      if (b >= 0xC2 && b <= 0xDF) { need = 1; cp = b & 0x1Fu; return kMore; }
      if (b >= 0xE0 && b <= 0xEF) {
        need = 2; cp = b & 0x0Fu;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
        return kMore;
      }
      if (b >= 0xF0 && b <= 0xF4) {
        need = 3; cp = b & 0x07u;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
        return kMore;
      }
      return kBad;
    }
    if (b < lo || b > hi) return kBad;
    cp = (cp << 6) | (b & 0x3Fu);
    lo = 0x80, hi = 0xBF;
    return --need == 0 ? kChar : kMore;
  }
  bool operator==(const Utf8Stepper&) const = default;
};

}  // namespace sparkserve
