#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace sparkserve {

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout rules (float_repr_style 'short'):
  // scientific when the decimal exponent is < -4 or >= 16, else positional with ".0" if integral.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci = [-]d[.ddd]e[+-]XX
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp10 = std::stoi(sci.substr(epos + 1));
  bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += e;
    return out;
  }
  if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    return out;
  }
  size_t int_len = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_len) {
    out += digits + std::string(int_len - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return out;
}

std::string py_json_quote(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", c);
          out += u;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

namespace {
void dump(const OrderedJson& v, std::string& out) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; break;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case OrderedJson::value_t::number_float: {
      double d = v.get<double>();
      // json.dumps spells non-finite floats NaN / Infinity / -Infinity.
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(d);
      break;
    }
    case OrderedJson::value_t::string: out += py_json_quote(v.get_ref<const std::string&>()); break;
    case OrderedJson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out += ']';
      break;
    }
    case OrderedJson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += py_json_quote(k);
        out += ": ";
        dump(e, out);
      }
      out += '}';
      break;
    }
    default: out += "null"; break;  // binary / discarded: never produced by our parsers
  }
}
}  // namespace

std::string py_json_dumps(const OrderedJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace sparkserve
