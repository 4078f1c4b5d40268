// Python behaviours the filters share: json.dumps with its options, `%` formatting, html escape,
// int()/float() of strings.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cctype>
#include <cerrno>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

namespace {

std::string quote_json(const std::string& s, bool ensure_ascii) {
  if (!ensure_ascii) return py_json_quote(s);
  std::string out = "\"";
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += static_cast<char>(c);
        } else if (c < 0x10000) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          char32_t v = c - 0x10000;
          std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                        static_cast<unsigned>(0xDC00 | (v & 0x3ff)));
          out += buf;
        }
    }
  }
  return out + "\"";
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

[[noreturn]] void not_serializable(const Value& v) {
  type_error("Object of type " + py_type_name(v) + " is not JSON serializable");
}

struct JsonWriter {
  const JsonOptions& opt;
  std::string item_sep, key_sep;
  std::string out;
  int depth = 0;

  void newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *opt.indent;
  }

  std::string key_string(const Value& k) {
    switch (k.kind()) {
      case Kind::String: return k.str();
      case Kind::Float: return json_float(k.as_double());
      case Kind::Bool: return k.as_bool() ? "true" : "false";
      case Kind::Int: return std::to_string(k.as_int());
      case Kind::None: return "null";
      default: type_error("keys must be str, int, float, bool or None, not " + py_type_name(k));
    }
  }

  void write(const Value& v, int level) {
    if (level > 512) throw_error("RecursionError", "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.kind()) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.as_int()); return;
      case Kind::Float: out += json_float(v.as_double()); return;
      case Kind::String: out += quote_json(v.str(), opt.ensure_ascii); return;
      case Kind::List: {
        if (v.is_iterator()) not_serializable(v);
        const auto& items = v.items();
        if (items.empty()) { out += "[]"; return; }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (opt.indent) newline(level + 1);
          write(items[i], level + 1);
        }
        if (opt.indent) newline(level);
        out += ']';
        return;
      }
      case Kind::Dict: {
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& kv : v.dict_data().items) items.push_back(&kv);
        if (items.empty()) { out += "{}"; return; }
        if (opt.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return py_less(a->first, b->first); });
        out += '{';
        bool first = true;
        for (const auto* kv : items) {
          if (!first) out += item_sep;
          first = false;
          if (opt.indent) newline(level + 1);
          out += quote_json(key_string(kv->first), opt.ensure_ascii);
          out += key_sep;
          write(kv->second, level + 1);
        }
        if (opt.indent) newline(level);
        out += '}';
        return;
      }
      default: not_serializable(v);
    }
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opt) {
  JsonWriter w{opt, "", "", "", 0};
  w.item_sep = opt.item_separator ? *opt.item_separator : (opt.indent ? "," : ", ");
  w.key_sep = opt.key_separator ? *opt.key_separator : ": ";
  w.write(v, 0);
  return std::move(w.out);
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

std::string strip_ws(const std::string& s) { return py_strip(s, std::nullopt, true, true); }

// Python's digit grouping with '_' (only between digits).
bool remove_underscores(const std::string& in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '_') {
      if (i == 0 || i + 1 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i - 1])) ||
          !std::isxdigit(static_cast<unsigned char>(in[i + 1])))
        return false;
      continue;
    }
    out += in[i];
  }
  return true;
}

}  // namespace

std::optional<int64_t> py_int_of_string(const std::string& raw, int base) {
  std::string s = strip_ws(raw);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  std::string body = s.substr(i);
  if (body.size() > 2 && body[0] == '0') {
    char p = static_cast<char>(std::tolower(static_cast<unsigned char>(body[1])));
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      body = body.substr(2);
      if (!body.empty() && body[0] == '_') body = body.substr(1);
    }
  }
  std::string digits;
  if (body.empty() || !remove_underscores(body, digits) || digits.empty()) return std::nullopt;
  for (char c : digits) {
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                          : 99;
    if (d >= base) return std::nullopt;
  }
  errno = 0;
  long long v = std::strtoll(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return std::nullopt;
  return neg ? -v : v;
}

std::optional<double> py_float_of_string(const std::string& raw) {
  std::string s = strip_ws(raw);
  std::string lower = py_lower(s);
  std::string t = lower;
  bool neg = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    neg = t[0] == '-';
    t = t.substr(1);
  }
  if (t == "inf" || t == "infinity") return neg ? -INFINITY : INFINITY;
  if (t == "nan") return NAN;
  std::string clean;
  if (s.empty() || !remove_underscores(s, clean)) return std::nullopt;
  for (char c : clean)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  const Value* mapping = nullptr;
  // Python treats any non-tuple argument with __getitem__ (dict, list) as a possible mapping:
  // it is still the single %s argument, but unused it raises nothing.
  bool mapping_like = args.is_dict() || args.is_sequence_list() && !args.is_tuple();
  if (args.is_tuple()) list = args.items();
  else if (args.is_dict()) mapping = &args;
  else list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') { out += fmt[i]; continue; }
    if (++i >= fmt.size()) throw_error("ValueError", "incomplete format");
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw_error("ValueError", "incomplete format key");
      if (!mapping) type_error("format requires a mapping");
      const Value* v = mapping->dict_data().find(fmt.substr(i + 1, close - i - 1));
      if (!v) throw_error("KeyError", "'" + fmt.substr(i + 1, close - i - 1) + "'");
      keyed = *v;
      arg = &keyed;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags += fmt[i++];
    std::string width, prec;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) width += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      prec = ".";
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) prec += fmt[i++];
    }
    if (i >= fmt.size()) throw_error("ValueError", "incomplete format");
    char conv = fmt[i];
    if (conv == '%') { out += '%'; continue; }
    if (!arg) {
      if (mapping) {
        arg = mapping;
      } else {
        if (next >= list.size()) type_error("not enough arguments for format string");
        arg = &list[next++];
      }
    }
    std::string spec = "%" + flags + width + prec;
    char buf[512];
    switch (conv) {
      case 's': case 'r': case 'a': {
        std::string text = conv == 's' ? py_str(*arg) : py_repr(*arg);
        if (prec.size() > 1) text = utf8_encode(utf8_decode(text).substr(0, std::stoul(prec.substr(1))));
        long w = width.empty() ? 0 : std::stol(width);
        long len = static_cast<long>(utf8_length(text));
        if (len < w) {
          std::string padding(static_cast<size_t>(w - len), ' ');
          text = flags.find('-') != std::string::npos ? text + padding : padding + text;
        }
        out += text;
        break;
      }
      case 'd': case 'i': case 'u': {
        if (!arg->is_number()) type_error(std::string("%") + conv + " format: a real number is required, not " + py_type_name(*arg));
        long long v = arg->is_float() ? static_cast<long long>(std::trunc(arg->as_double())) : arg->as_int();
        std::snprintf(buf, sizeof buf, (spec + "lld").c_str(), v);
        out += buf;
        break;
      }
      case 'x': case 'X': case 'o': {
        if (!arg->is_int() && !arg->is_bool()) type_error(std::string("%") + conv + " format: an integer is required, not " + py_type_name(*arg));
        long long v = arg->as_int();
        std::string digits;
        std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), v < 0 ? -v : v);
        out += v < 0 ? "-" + std::string(buf) : std::string(buf);
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!arg->is_number()) type_error("must be real number, not " + py_type_name(*arg));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->as_double());
        out += buf;
        break;
      }
      case 'c': {
        if (arg->is_string()) out += arg->str();
        else if (arg->is_int()) utf8_append(out, static_cast<char32_t>(arg->as_int()));
        break;
      }
      default:
        throw_error("ValueError", std::string("unsupported format character '") + conv + "'");
    }
  }
  if (!mapping && !mapping_like && next < list.size()) type_error("not all arguments converted during string formatting");
  return out;
}

}  // namespace sparkserve::jinja
