#include "text/byte_level.h"

#include "text/utf8.h"

namespace sparkserve {
namespace {

struct Tables {
  std::array<std::string, 256> chars;
  std::array<int, 512> byte_of_cp;  // every mapped code point is below 0x144
  Tables() {
    byte_of_cp.fill(-1);
    // Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 onwards in
    // byte order (GPT-2's bytes_to_unicode).
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      append_utf8(chars[b], cp);
      byte_of_cp[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() { return tables().chars; }

int byte_level_byte(char32_t cp) { return cp < 512 ? tables().byte_of_cp[cp] : -1; }

std::string byte_level_encode(std::string_view bytes) {
  const auto& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.chars[b];
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view chars) {
  std::string out;
  out.reserve(chars.size());
  for (size_t pos = 0; pos < chars.size();) {
    char32_t cp;
    pos += decode_utf8_at(chars, pos, cp);
    const int b = byte_level_byte(cp);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace sparkserve
