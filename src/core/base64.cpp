#include "core/base64.h"

#include <array>

namespace sparkserve {
namespace {

constexpr int8_t kSkip = -2, kBad = -1;

constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = kBad;
  for (int i = 0; i < 26; ++i) {
    t[static_cast<size_t>('A' + i)] = static_cast<int8_t>(i);
    t[static_cast<size_t>('a' + i)] = static_cast<int8_t>(26 + i);
  }
  for (int i = 0; i < 10; ++i) t[static_cast<size_t>('0' + i)] = static_cast<int8_t>(52 + i);
  t['+'] = 62;
  t['/'] = 63;
  for (char c : {' ', '\t', '\n', '\r', '\f', '\v'}) t[static_cast<unsigned char>(c)] = kSkip;
  return t;
}
constexpr std::array<int8_t, 256> kTable = make_table();

}  // namespace

Expected<std::string> base64_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;        // pending bits in acc
  size_t symbols = 0;  // alphabet characters seen
  size_t padding = 0;  // '=' seen (only whitespace and '=' may follow the first one)
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int8_t v = kTable[c];
    if (v == kSkip) continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    if (v == kBad)
      return make_error("invalid base64: character " + std::to_string(static_cast<int>(c)) + " at offset " +
                        std::to_string(i));
    if (padding > 0) return make_error("invalid base64: data after '=' padding at offset " + std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  if (symbols % 4 == 1) return make_error("invalid base64: truncated (a trailing group of one character)");
  if (padding > 0 && (symbols + padding) % 4 != 0) return make_error("invalid base64: wrong amount of '=' padding");
  return out;
}

}  // namespace sparkserve
