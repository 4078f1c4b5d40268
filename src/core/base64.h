// Base64 (RFC 4648 §4, the standard alphabet) decoding for binary payloads sent inside JSON
// (images as data: URLs or Anthropic base64 sources).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace sparkserve {

// Decodes `text`. ASCII whitespace anywhere is skipped (MIME-wrapped input); the trailing '='
// padding may be left out. Anything else outside the alphabet, '=' before the end, or a length
// that leaves 1 character over (6 bits, not a byte) is an error naming the offset.
Expected<std::string> base64_decode(std::string_view text);

}  // namespace sparkserve
