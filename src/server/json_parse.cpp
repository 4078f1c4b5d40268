#include "server/json_parse.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "text/utf8.h"

namespace sparkserve {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The first byte at or after p that ends a run of plain string characters: '"', '\\', a control
// character (< 0x20, which JSON forbids raw) or a non-ASCII byte (checked as UTF-8 by the caller).
// Eight bytes at a time while none of them is one.
const char* skip_plain(const char* p, const char* end) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL, kHighs = 0x8080808080808080ULL;
  auto zero_byte = [](uint64_t v) { return (v - kOnes) & ~v; };  // high bit set in some byte iff a byte is 0
  while (end - p >= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    const uint64_t special =
        (zero_byte(x ^ (kOnes * '"')) | zero_byte(x ^ (kOnes * '\\')) | ((x - kOnes * 0x20) & ~x) | x) & kHighs;
    if (special) break;
    p += 8;
  }
  while (p < end) {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\') break;
    ++p;
  }
  return p;
}

// Length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF; the table nlohmann's lexer checks too), or 0.
int utf8_sequence(const char* p, const char* end) {
  Utf8Stepper st;
  for (int i = 0; i < 4 && p + i < end; ++i) {
    const Utf8Stepper::Result r = st.feed(static_cast<uint8_t>(p[i]));
    if (r == Utf8Stepper::kChar) return i + 1;
    if (r == Utf8Stepper::kBad) return 0;
  }
  return 0;
}

class FastParser {
 public:
  FastParser(std::string_view s, int max_depth) : p_(s.data()), end_(s.data() + s.size()), max_depth_(max_depth) {}

  bool document(RequestJson& out) {
    skip_ws();
    if (!value(out, 0)) return false;
    skip_ws();
    return p_ == end_;
  }

 private:
  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool value(RequestJson& out, int depth) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '{': return object(out, depth + 1);
      case '[': return array(out, depth + 1);
      case '"': {
        std::string s;
        if (!string(s)) return false;
        out = std::move(s);
        return true;
      }
      case 't': return literal("true", out, RequestJson(true));
      case 'f': return literal("false", out, RequestJson(false));
      case 'n': return literal("null", out, RequestJson(nullptr));
      default: return number(out);
    }
  }

  bool literal(std::string_view word, RequestJson& out, RequestJson v) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::memcmp(p_, word.data(), word.size()) != 0) return false;
    p_ += word.size();
    out = std::move(v);
    return true;
  }

  bool object(RequestJson& out, int depth) {
    if (depth > max_depth_) return false;
    ++p_;
    out = RequestJson::object();
    skip_ws();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    for (;;) {
      skip_ws();
      std::string key;
      if (p_ == end_ || *p_ != '"' || !string(key)) return false;
      skip_ws();
      if (p_ == end_ || *p_ != ':') return false;
      ++p_;
      skip_ws();
      // As nlohmann's DOM parser: operator[] keeps a repeated key where it first appeared, the value
      // parsed last wins.
      if (!value(out[key], depth)) return false;
      skip_ws();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      if (*p_++ != ',') return false;
    }
  }

  bool array(RequestJson& out, int depth) {
    if (depth > max_depth_) return false;
    ++p_;
    out = RequestJson::array();
    skip_ws();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      return true;
    }
    for (;;) {
      skip_ws();
      out.push_back(RequestJson());
      if (!value(out.back(), depth)) return false;
      skip_ws();
      if (p_ == end_) return false;
      if (*p_ == ']') {
        ++p_;
        return true;
      }
      if (*p_++ != ',') return false;
    }
  }

  bool string(std::string& out) {
    ++p_;  // the opening quote
    for (;;) {
      const char* run = p_;
      p_ = skip_plain(p_, end_);
      out.append(run, p_);
      if (p_ == end_) return false;
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c == '\\') {
        if (!escape(out)) return false;
        continue;
      }
      if (c < 0x20) return false;
      const int n = utf8_sequence(p_, end_);
      if (n == 0) return false;
      out.append(p_, static_cast<size_t>(n));
      p_ += n;
    }
  }

  bool hex4(uint32_t& v) {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = *p_++;
      uint32_t d = 0;
      if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<uint32_t>(c - 'A' + 10);
      else return false;
      v = v * 16 + d;
    }
    return true;
  }

  bool escape(std::string& out) {
    if (end_ - p_ < 2) return false;
    const char e = p_[1];
    p_ += 2;
    switch (e) {
      case '"': out += '"'; return true;
      case '\\': out += '\\'; return true;
      case '/': out += '/'; return true;
      case 'b': out += '\b'; return true;
      case 'f': out += '\f'; return true;
      case 'n': out += '\n'; return true;
      case 'r': out += '\r'; return true;
      case 't': out += '\t'; return true;
      case 'u': {
        uint32_t cp = 0;
        if (!hex4(cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a low surrogate without its high one
        if (cp >= 0xD800 && cp <= 0xDBFF) {  // must be followed by its low surrogate
          uint32_t lo = 0;
          if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
          p_ += 2;
          if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        return true;
      }
      default: return false;
    }
  }

  bool number(RequestJson& out) {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || !is_digit(*p_)) return false;
    uint64_t v = 0;
    bool overflow = false;
    if (*p_ == '0') {
      ++p_;  // a leading zero stands alone ("01" is two tokens, an error the caller finds)
    } else {
      for (; p_ < end_ && is_digit(*p_); ++p_) {
        const auto d = static_cast<uint64_t>(*p_ - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) overflow = true;
        else v = v * 10 + d;
      }
    }
    bool integer = true;
    if (p_ < end_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (p_ == end_ || !is_digit(*p_)) return false;
      while (p_ < end_ && is_digit(*p_)) ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !is_digit(*p_)) return false;
      while (p_ < end_ && is_digit(*p_)) ++p_;
    }
    constexpr uint64_t kMinMagnitude = uint64_t{1} << 63;  // |INT64_MIN|
    if (integer && !overflow && !negative) {
      out = v;  // number_unsigned, as nlohmann types every non-negative integer
      return true;
    }
    if (integer && !overflow && v <= kMinMagnitude) {
      out = v == kMinMagnitude ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(v);
      return true;
    }
    // Fractions, exponents and integers out of range: nlohmann's own conversion of the token (it
    // gives number_float, or throws for a non-finite value: the caller's nlohmann parse reports it).
    try {
      out = RequestJson::parse(start, p_);
    } catch (const RequestJson::exception&) {
      return false;
    }
    return true;
  }

  const char* p_;
  const char* end_;
  int max_depth_;
};

}  // namespace

std::optional<RequestJson> parse_json_fast(std::string_view text, int max_depth) {
  RequestJson out;
  if (!FastParser(text, max_depth).document(out)) return std::nullopt;
  return out;
}

}  // namespace sparkserve
