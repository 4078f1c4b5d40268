#include "text/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "text/jinja/error.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

const char* token_type_name(Tok t) {
  switch (t) {
    case Tok::Data: return "template data";
    case Tok::VarBegin: return "begin of print statement";
    case Tok::VarEnd: return "end of print statement";
    case Tok::BlockBegin: return "begin of statement block";
    case Tok::BlockEnd: return "end of statement block";
    case Tok::Name: return "name";
    case Tok::String: return "string";
    case Tok::Int: return "integer";
    case Tok::Float: return "float";
    case Tok::Op: return "operator";
    case Tok::Eof: return "end of template";
  }
  return "token";
}

namespace {

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& opt) : src_(std::move(src)), opt_(opt) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t f = find_tag(pos);
      if (f == std::string::npos) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      char kind = src_[f + 1];
      char sign = (f + 2 < src_.size() && (src_[f + 2] == '-' || src_[f + 2] == '+')) ? src_[f + 2] : 0;
      std::string data = src_.substr(pos, f - pos);
      size_t raw_end = kind == '%' ? match_raw_begin(f) : 0;
      data = strip_before(data, sign, kind != '{', line_starting);
      emit_data(data, pos);
      size_t after = f + 2 + (sign ? 1 : 0);
      if (raw_end) {
        line_starting = src_[raw_end - 1] == '\n';
        pos = lex_raw(raw_end, f, line_starting);
        line_starting = pos > 0 && src_[pos - 1] == '\n';
        continue;
      }
      if (kind == '#') {
        pos = lex_comment(after, f);
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", f);
        pos = lex_tag(after, kind == '{');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    push(Tok::Eof, "", src_.size());
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& msg) const {
    auto [line, col] = position(at);
    throw_error("TemplateSyntaxError", "line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + msg);
  }

  // Tokens arrive in source order, so the column is counted on from the previous token's
  // (counting from the line start every time is quadratic on long one-line templates).
  std::pair<int, int> position(size_t at) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t start = line_starts_[line - 1];
    if (!(pos_cache_line_ == line && pos_cache_at_ <= at)) {
      pos_cache_line_ = line;
      pos_cache_at_ = start;
      pos_cache_col_ = 1;
    }
    pos_cache_col_ += static_cast<int>(utf8_length(std::string_view(src_).substr(pos_cache_at_, at - pos_cache_at_)));
    pos_cache_at_ = at;
    return {static_cast<int>(line), pos_cache_col_};
  }

  void push(Tok t, std::string text, size_t at) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    auto [l, c] = position(std::min(at, src_.size()));
    tok.line = l;
    tok.column = c;
    out_.push_back(std::move(tok));
  }

  void emit_data(const std::string& data, size_t at) {
    if (!data.empty()) push(Tok::Data, data, at);
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      size_t f = src_.find('{', pos);
      if (f == std::string::npos || f + 1 >= src_.size()) return std::string::npos;
      char c = src_[f + 1];
      if (c == '{' || c == '%' || c == '#') return f;
      pos = f + 1;
    }
  }

  // Python's \s at byte position i (ASCII fast path; decodes multi-byte whitespace).
  size_t space_len(size_t i) const {
    unsigned char c = static_cast<unsigned char>(src_[i]);
    if (c < 0x80) return py_isspace(c) ? 1 : 0;
    size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > src_.size()) return 0;
    auto u = utf8_decode(std::string_view(src_).substr(i, n));
    return (u.size() == 1 && py_isspace(u[0])) ? n : 0;
  }
  size_t skip_space(size_t i) const {
    while (i < src_.size()) {
      size_t n = space_len(i);
      if (!n) break;
      i += n;
    }
    return i;
  }

  // The data before a tag, after `{%-` (strip all trailing whitespace) or lstrip_blocks (drop
  // the whitespace between the line start and a block or comment tag).
  std::string strip_before(const std::string& data, char sign, bool block_or_comment, bool line_starting) const {
    if (sign == '-') return py_strip(data, std::nullopt, false, true);
    if (sign != '+' && opt_.lstrip_blocks && block_or_comment) {
      size_t nl = data.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < data.size()) {
        auto tail = utf8_decode(std::string_view(data).substr(l_pos));
        if (std::all_of(tail.begin(), tail.end(), py_isspace)) return data.substr(0, l_pos);
      }
    }
    return data;
  }

  // `{%[-+]? raw [-]?%}` at f: returns the position after it, or 0.
  size_t match_raw_begin(size_t f) const {
    size_t i = f + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_space(i);
    if (src_.compare(i, 3, "raw") != 0) return 0;
    i = skip_space(i + 3);
    if (src_.compare(i, 3, "-%}") == 0) return skip_space(i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return 0;
  }

  // Position after a block end at i (`%}` plus trim_blocks' newline, `-%}` plus whitespace,
  // `+%}`), or 0 when there is none at i.
  size_t match_end(size_t i, const char* end) const {
    size_t n = std::strlen(end);
    if (src_.compare(i, 1, "+") == 0 && src_.compare(i + 1, n, end) == 0 && end[0] != '}')
      return i + 1 + n;
    if (src_.compare(i, 1, "-") == 0 && src_.compare(i + 1, n, end) == 0) return skip_space(i + 1 + n);
    if (src_.compare(i, n, end) == 0) {
      i += n;
      if (end[0] != '}' && opt_.trim_blocks && i < src_.size() && src_[i] == '\n') ++i;
      return i;
    }
    return 0;
  }

  size_t lex_raw(size_t body, size_t begin_at, bool line_starting) {
    size_t i = body;
    while (true) {
      size_t f = src_.find("{%", i);
      if (f == std::string::npos) fail(begin_at, "Missing end of raw directive");
      size_t j = f + 2;
      char sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) sign = src_[j++];
      j = skip_space(j);
      if (src_.compare(j, 6, "endraw") == 0) {
        size_t k = skip_space(j + 6);
        size_t end = match_end(k, "%}");
        if (end) {
          std::string data = strip_before(src_.substr(body, f - body), sign, true, line_starting);
          emit_data(data, body);
          return end;
        }
      }
      i = f + 2;
    }
  }

  size_t lex_comment(size_t i, size_t begin_at) {
    while (true) {
      size_t f = src_.find("#}", i);
      if (f == std::string::npos) fail(begin_at, "Missing end of comment tag");
      size_t start = (f > i && (src_[f - 1] == '-' || src_[f - 1] == '+')) ? f - 1 : f;
      size_t end = match_end(start, "#}");
      if (end) return end;
      i = f + 1;
    }
  }

  size_t lex_tag(size_t i, bool variable) {
    const char* end = variable ? "}}" : "%}";
    std::vector<char> brackets;
    while (true) {
      i = skip_space(i);
      if (i >= src_.size()) fail(i, std::string("unexpected end of template, expected '") + end + "'");
      if (brackets.empty()) {
        size_t e = match_end(i, end);
        if (e) {
          push(variable ? Tok::VarEnd : Tok::BlockEnd, "", i);
          return e;
        }
      }
      char c = src_[i];
      unsigned char uc = static_cast<unsigned char>(c);
      if (std::isdigit(uc)) {
        i = lex_number(i);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else if (std::isalpha(uc) || c == '_' || uc >= 0x80) {
        size_t j = i;
        while (j < src_.size()) {
          unsigned char d = static_cast<unsigned char>(src_[j]);
          if (std::isalnum(d) || d == '_') { ++j; continue; }
          if (d >= 0x80) {
            size_t n = (d >> 5) == 6 ? 2 : (d >> 4) == 14 ? 3 : 4;
            auto u = utf8_decode(std::string_view(src_).substr(j, n));
            if (u.size() == 1 && py_isalnum(u[0])) { j += n; continue; }
          }
          break;
        }
        if (j == i) fail(i, "unexpected char " + std::string(1, c));
        push(Tok::Name, src_.substr(i, j - i), i);
        i = j;
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(i, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) fail(i, std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (brackets.empty()) fail(i, "unexpected '" + op + "'");
          if (brackets.back() != op[0])
            fail(i, "unexpected '" + op + "', expected '" + std::string(1, brackets.back()) + "'");
          brackets.pop_back();
        }
        push(Tok::Op, op, i);
        i += op.size();
      }
    }
  }

  size_t digits(size_t i) const {  // (\d+_)*\d+
    size_t j = i;
    while (j < src_.size()) {
      if (std::isdigit(static_cast<unsigned char>(src_[j]))) { ++j; continue; }
      if (src_[j] == '_' && j > i && j + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
        ++j;
        continue;
      }
      break;
    }
    return j;
  }

  size_t lex_number(size_t i) {
    // A float needs a fraction or an exponent and must not directly follow a '.' (x.0.1).
    bool after_dot = i > 0 && src_[i - 1] == '.';
    size_t j = digits(i);
    size_t k = j;
    bool is_float = false;
    if (!after_dot) {
      if (k < src_.size() && src_[k] == '.' && k + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
        k = digits(k + 1);
        is_float = true;
      }
      if (k < src_.size() && (src_[k] == 'e' || src_[k] == 'E')) {
        size_t m = k + 1;
        if (m < src_.size() && (src_[m] == '+' || src_[m] == '-')) ++m;
        if (m < src_.size() && std::isdigit(static_cast<unsigned char>(src_[m]))) {
          k = digits(m);
          is_float = true;
        }
      }
    }
    std::string text;
    if (is_float) {
      for (size_t p = i; p < k; ++p)
        if (src_[p] != '_') text += src_[p];
      push(Tok::Float, src_.substr(i, k - i), i);
      out_.back().float_value = std::strtod(text.c_str(), nullptr);
      return k;
    }
    // Integers: decimal, or 0b / 0o / 0x.
    int base = 10;
    size_t start = i;
    if (src_[i] == '0' && i + 1 < src_.size() && std::strchr("bBoOxX", src_[i + 1])) {
      char b = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[i + 1])));
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      j = i + 2;
      while (j < src_.size() && (std::isxdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
      start = i + 2;
    }
    for (size_t p = start; p < j; ++p)
      if (src_[p] != '_') text += src_[p];
    errno = 0;
    char* endp = nullptr;
    long long v = std::strtoll(text.c_str(), &endp, base);
    if (text.empty() || *endp != 0) fail(i, "invalid integer literal");
    if (errno == ERANGE) fail(i, "integer literal too large");
    push(Tok::Int, src_.substr(i, j - i), i);
    out_.back().int_value = v;
    return j;
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal, unescaped as jinja2 does: Python's unicode-escape codec.
  size_t lex_string(size_t i) {
    char q = src_[i];
    size_t j = i + 1;
    std::string val;
    while (true) {
      if (j >= src_.size()) fail(i, "unexpected char '" + std::string(1, q) + "'");
      char c = src_[j];
      if (c == q) break;
      if (c != '\\') {
        val += c;
        ++j;
        continue;
      }
      if (j + 1 >= src_.size()) fail(i, "unexpected char '" + std::string(1, q) + "'");
      char e = src_[j + 1];
      j += 2;
      auto read_hex = [&](int n, const char* what) {
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (j >= src_.size() || hexval(src_[j]) < 0) fail(i, std::string("truncated ") + what + " escape");
          v = v * 16 + static_cast<uint32_t>(hexval(src_[j++]));
        }
        return v;
      };
      switch (e) {
        case '\n': break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case 'a': val += '\a'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'n': val += '\n'; break;
        case 'r': val += '\r'; break;
        case 't': val += '\t'; break;
        case 'v': val += '\v'; break;
        case 'x': utf8_append(val, read_hex(2, "\\xXX")); break;
        case 'u': case 'U': {
          uint32_t cp = read_hex(e == 'u' ? 4 : 8, e == 'u' ? "\\uXXXX" : "\\UXXXXXXXX");
          if (cp > 0x10FFFF) fail(i, "illegal Unicode character");
          if (cp >= 0xD800 && cp <= 0xDFFF) fail(i, "surrogate code points are not supported in string literals");
          utf8_append(val, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && j < src_.size() && src_[j] >= '0' && src_[j] <= '7'; ++k)
              v = v * 8 + static_cast<uint32_t>(src_[j++] - '0');
            utf8_append(val, v);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // jinja2 first escapes non-ASCII as \xNN / \uNNNN / \UNNNNNNNN, so a backslash before
            // one stays a backslash and the escape's own text follows literally.
            size_t n = (static_cast<unsigned char>(e) >> 5) == 6 ? 2 : (static_cast<unsigned char>(e) >> 4) == 14 ? 3 : 4;
            auto u = utf8_decode(std::string_view(src_).substr(j - 1, n));
            char buf[16];
            char32_t cp = u.empty() ? 0xFFFD : u[0];
            if (cp < 0x100) std::snprintf(buf, sizeof buf, "x%02x", static_cast<unsigned>(cp));
            else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "u%04x", static_cast<unsigned>(cp));
            else std::snprintf(buf, sizeof buf, "U%08x", static_cast<unsigned>(cp));
            val += '\\';
            val += buf;
            j = j - 1 + n;
          } else {
            val += '\\';
            val += e;
          }
      }
    }
    push(Tok::String, val, i);
    return j + 1;
  }

  std::string src_;
  LexOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  mutable size_t pos_cache_line_ = 0;
  mutable size_t pos_cache_at_ = 0;
  mutable int pos_cache_col_ = 1;
};

std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  // keep_trailing_newline=False: one final newline is dropped.
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexOptions& options) {
  if (!utf8_valid(source)) throw_error("TemplateSyntaxError", "template source is not valid UTF-8");
  return Lexer(normalize_newlines(source), options).run();
}

}  // namespace sparkserve::jinja
