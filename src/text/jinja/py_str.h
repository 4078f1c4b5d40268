// Python str semantics on UTF-8 text: Python indexes, counts and strips by code point, and its
// notion of whitespace (str.isspace) is wider than C's.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparkserve::jinja {

// Decodes UTF-8 (the engine only ever holds valid UTF-8: JSON input and checked templates).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool utf8_valid(std::string_view s);
size_t utf8_length(std::string_view s);

bool py_isspace(char32_t c);      // str.isspace()
bool py_isprintable(char32_t c);  // str.isprintable()
bool py_isalnum(char32_t c);      // close to str.isalnum(): letters and numbers by category
bool py_isalpha(char32_t c);
bool py_isdigit(char32_t c);
bool py_islower_char(char32_t c);
bool py_isupper_char(char32_t c);
bool py_iscased(char32_t c);

// chars == nullopt: strip whitespace (str.strip()), else strip any code point in chars.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) / str.rsplit; sep nullopt splits on whitespace runs.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  long maxsplit, bool from_right);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, long count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
// str.find / count on code point positions; start/end already clamped by the caller.
long py_find(std::string_view s, std::string_view sub, bool from_right);
long py_count(std::string_view s, std::string_view sub);

}  // namespace sparkserve::jinja
