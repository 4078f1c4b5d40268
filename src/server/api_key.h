// The API-key check of `serve --api-key`: `Authorization: Bearer <key>`, the scheme name
// case-insensitive (RFC 9110 11.1), the key compared in time independent of where it differs.
#pragma once

#include <optional>
#include <string_view>

namespace sparkserve {

// True when `authorization` (the header's value, nullopt when absent) carries `key`.
bool api_key_matches(std::optional<std::string_view> authorization, std::string_view key);

// Equality whose running time depends only on the lengths, not on the bytes.
bool constant_time_equals(std::string_view a, std::string_view b);

}  // namespace sparkserve
