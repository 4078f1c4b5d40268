// Small UTF-8 helpers for the text layer (validation with byte offsets, decoding one code point,
// and the lossy conversion that Hugging Face's decode applies).
#pragma once

#include <cstddef>
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

}  // namespace sparkserve
