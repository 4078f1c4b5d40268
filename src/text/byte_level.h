// GPT-2's reversible byte <-> printable-character mapping used by byte-level BPE: vocabulary
// entries of tokenizer.json are written in these characters, one character per raw byte.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace sparkserve {

// The character (as UTF-8) that stands for byte b.
const std::array<std::string, 256>& byte_level_chars();

// The byte that code point cp stands for, or -1 when cp is not one of the 256 mapped characters.
int byte_level_byte(char32_t cp);

// Raw bytes -> their byte-level character string.
std::string byte_level_encode(std::string_view bytes);

// Byte-level character string (valid UTF-8) -> raw bytes; nullopt if a character is unmapped.
std::optional<std::string> byte_level_decode(std::string_view chars);

}  // namespace sparkserve
