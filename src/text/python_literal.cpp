#include "text/python_literal.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "text/utf8.h"

namespace sparkserve {
namespace {

// Limits nesting so hostile input cannot exhaust the stack.
constexpr int kMaxDepth = 200;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

class LiteralParser {
 public:
  explicit LiteralParser(std::string_view s) : s_(s) {}

  std::optional<OrderedJson> parse_all() {
    // literal_eval strips leading spaces and tabs before parsing in eval mode.
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
    auto v = parse_expr(0);
    if (!v) return std::nullopt;
    skip_ws();
    if (pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;

  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t off = 0) const { return pos_ + off < s_.size() ? s_[pos_ + off] : '\0'; }

  void skip_ws() {
    while (!at_end()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
        ++pos_;
      } else if (c == '\\' && peek(1) == '\n') {
        pos_ += 2;
      } else if (c == '#') {
        while (!at_end() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::optional<OrderedJson> parse_expr(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    skip_ws();
    if (at_end()) return std::nullopt;
    char c = peek();
    if (c == '-' || c == '+') {
      // literal_eval accepts a sign only directly on a number (possibly parenthesised):
      // "--5", "-True" and "-'a'" are errors.
      ++pos_;
      skip_ws();
      std::optional<OrderedJson> v;
      if (is_digit(peek()) || (peek() == '.' && is_digit(peek(1)))) v = parse_number();
      else if (peek() == '(') v = parse_paren(depth + 1);
      if (!v || !v->is_number()) return std::nullopt;
      if (c == '+') return v;
      if (v->is_number_float()) return OrderedJson(-v->get<double>());
      if (v->is_number_unsigned()) {
        uint64_t u = v->get<uint64_t>();
        if (u == uint64_t{1} << 63) return OrderedJson(std::numeric_limits<int64_t>::min());
        return std::nullopt;  // below int64 range: exact value not representable here
      }
      return OrderedJson(-v->get<int64_t>());
    }
    if (c == '[') return parse_sequence(depth, ']');
    if (c == '(') return parse_paren(depth);
    if (c == '{') return parse_dict(depth);
    if (is_digit(c) || (c == '.' && is_digit(peek(1)))) return parse_number();
    if (c == '"' || c == '\'') return parse_strings();
    if (is_ident_char(c)) {
      size_t start = pos_;
      while (!at_end() && is_ident_char(peek())) ++pos_;
      std::string_view word = s_.substr(start, pos_ - start);
      if (!at_end() && (peek() == '"' || peek() == '\'')) {
        pos_ = start;
        return parse_strings();
      }
      if (word == "None") return OrderedJson(nullptr);
      if (word == "True") return OrderedJson(true);
      if (word == "False") return OrderedJson(false);
      return std::nullopt;
    }
    return std::nullopt;
  }

  std::optional<OrderedJson> parse_sequence(int depth, char close) {
    ++pos_;  // opening bracket
    OrderedJson arr = OrderedJson::array();
    skip_ws();
    if (peek() == close) {
      ++pos_;
      return arr;
    }
    while (true) {
      auto v = parse_expr(depth + 1);
      if (!v) return std::nullopt;
      arr.push_back(std::move(*v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
        if (peek() == close) {
          ++pos_;
          return arr;
        }
        continue;
      }
      if (peek() == close) {
        ++pos_;
        return arr;
      }
      return std::nullopt;
    }
  }

  // "(x)" is x; "()" / "(x,)" / "(x, y)" are tuples, which json.dumps writes as arrays.
  std::optional<OrderedJson> parse_paren(int depth) {
    size_t open = pos_;
    ++pos_;
    skip_ws();
    if (peek() == ')') {
      ++pos_;
      return OrderedJson::array();
    }
    auto first = parse_expr(depth + 1);
    if (!first) return std::nullopt;
    skip_ws();
    if (peek() == ')') {
      ++pos_;
      return first;
    }
    pos_ = open;
    return parse_sequence(depth, ')');
  }

  static std::optional<std::string> key_string(const OrderedJson& k) {
    // json.dumps converts str/int/float/bool/None keys to strings; anything else is a TypeError.
    if (k.is_string()) return k.get<std::string>();
    if (k.is_boolean()) return std::string(k.get<bool>() ? "true" : "false");
    if (k.is_null()) return std::string("null");
    if (k.is_number_integer() || k.is_number_unsigned()) return k.dump();
    if (k.is_number_float()) {
      double d = k.get<double>();
      if (std::isnan(d)) return std::string("NaN");
      if (std::isinf(d)) return std::string(d > 0 ? "Infinity" : "-Infinity");
      return py_float_repr(d);
    }
    return std::nullopt;
  }

  std::optional<OrderedJson> parse_dict(int depth) {
    ++pos_;
    OrderedJson obj = OrderedJson::object();
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return obj;
    }
    while (true) {
      auto k = parse_expr(depth + 1);
      if (!k) return std::nullopt;
      skip_ws();
      if (peek() != ':') return std::nullopt;  // a set literal: json.dumps cannot write it
      ++pos_;
      auto v = parse_expr(depth + 1);
      if (!v) return std::nullopt;
      auto key = key_string(*k);
      if (!key) return std::nullopt;
      obj[*key] = std::move(*v);  // a repeated key keeps its first position, last value (dict)
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
        if (peek() == '}') {
          ++pos_;
          return obj;
        }
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return obj;
      }
      return std::nullopt;
    }
  }

  // Digits with single underscores between them; returns the digits without underscores.
  bool take_digits(std::string& out, bool (*ok)(char)) {
    size_t start = pos_;
    bool last_underscore = false;
    while (!at_end()) {
      char c = peek();
      if (ok(c)) {
        out += c;
        last_underscore = false;
        ++pos_;
      } else if (c == '_' && pos_ > start && !last_underscore && pos_ + 1 < s_.size() && ok(s_[pos_ + 1])) {
        last_underscore = true;
        ++pos_;
      } else {
        break;
      }
    }
    return pos_ > start;
  }

  std::optional<OrderedJson> parse_number() {
    if (peek() == '0' && (peek(1) == 'x' || peek(1) == 'X' || peek(1) == 'o' || peek(1) == 'O' ||
                          peek(1) == 'b' || peek(1) == 'B')) {
      char kind = static_cast<char>(peek(1) | 0x20);
      pos_ += 2;
      if (peek() == '_') ++pos_;  // 0x_ff is valid Python
      std::string digits;
      bool (*ok)(char) = kind == 'x' ? +[](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
                         : kind == 'o' ? +[](char c) { return c >= '0' && c <= '7'; }
                                       : +[](char c) { return c == '0' || c == '1'; };
      if (!take_digits(digits, ok)) return std::nullopt;
      if (!at_end() && is_ident_char(peek())) return std::nullopt;
      int base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
      errno = 0;
      unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
      if (errno == ERANGE) return std::nullopt;
      return int_json(v);
    }
    std::string text;
    bool is_float = false;
    if (peek() != '.') take_digits(text, is_digit);
    if (peek() == '.') {
      is_float = true;
      text += '.';
      ++pos_;
      if (is_digit(peek())) take_digits(text, is_digit);
    }
    if (peek() == 'e' || peek() == 'E') {
      size_t save = pos_;
      std::string exp = "e";
      ++pos_;
      if (peek() == '+' || peek() == '-') exp += s_[pos_++];
      if (take_digits(exp, is_digit)) {
        text += exp;
        is_float = true;
      } else {
        pos_ = save;
        return std::nullopt;
      }
    }
    // A 'j' suffix (complex) or a letter glued to the number is not a JSON-writable literal.
    if (!at_end() && is_ident_char(peek())) return std::nullopt;
    if (is_float) {
      double d = std::strtod(text.c_str(), nullptr);
      return OrderedJson(d);
    }
    // Python 3 rejects leading zeros in non-zero decimal integers ("007").
    if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) return std::nullopt;
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return int_json(v);
  }

  static OrderedJson int_json(unsigned long long v) {
    if (v <= static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()))
      return OrderedJson(static_cast<int64_t>(v));
    return OrderedJson(static_cast<uint64_t>(v));
  }

  // One or more adjacent string literals, concatenated.
  std::optional<OrderedJson> parse_strings() {
    std::string out;
    bool any = false;
    while (true) {
      skip_inline_ws();
      size_t save = pos_;
      bool raw = false;
      size_t start = pos_;
      while (!at_end() && is_ident_char(peek()) && pos_ - start < 3) ++pos_;
      std::string prefix(s_.substr(start, pos_ - start));
      for (char& ch : prefix) ch = static_cast<char>(ch | 0x20);
      if (!(peek() == '"' || peek() == '\'')) {
        pos_ = save;
        break;
      }
      if (prefix == "r") raw = true;
      else if (prefix == "u" || prefix.empty()) raw = false;
      else return std::nullopt;  // b"", f"", rb"" ... are not str literals json can write
      if (!parse_one_string(out, raw)) return std::nullopt;
      any = true;
    }
    if (!any) return std::nullopt;
    return OrderedJson(std::move(out));
  }

  void skip_inline_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\f')) ++pos_;
  }

  bool parse_one_string(std::string& out, bool raw) {
    char q = peek();
    bool triple = peek(1) == q && peek(2) == q;
    pos_ += triple ? 3 : 1;
    while (true) {
      if (at_end()) return false;
      char c = s_[pos_];
      if (c == q) {
        if (!triple) {
          ++pos_;
          return true;
        }
        if (peek(1) == q && peek(2) == q) {
          pos_ += 3;
          return true;
        }
        out += c;
        ++pos_;
        continue;
      }
      if (c == '\n' && !triple) return false;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      // Backslash.
      if (pos_ + 1 >= s_.size()) return false;
      char e = s_[pos_ + 1];
      if (raw) {
        out += c;
        out += e;
        pos_ += 2;
        continue;
      }
      pos_ += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': case 'u': case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > s_.size()) return false;
          uint32_t cp = 0;
          for (int i = 0; i < n; ++i) {
            char h = s_[pos_ + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
            cp = cp * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          pos_ += n;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
          append_utf8(out, cp);
          break;
        }
        case 'N': return false;  // named escapes need the Unicode name table
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++i)
              cp = cp * 8 + static_cast<uint32_t>(s_[pos_++] - '0');
            append_utf8(out, cp);
          } else {
            // Unknown escapes keep the backslash (Python warns but accepts).
            out += '\\';
            out += e;
          }
      }
    }
  }
};

}  // namespace

std::optional<OrderedJson> parse_python_literal(std::string_view text) {
  return LiteralParser(text).parse_all();
}

}  // namespace sparkserve
