// Methods of Python's built-in str, dict and list that templates call (`s.startswith(..)`,
// `d.items()`), with the sandbox's refusal of the mutating ones.
#include <algorithm>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

namespace {

using Method = std::function<Value(Interpreter&, const Value& self, CallArgs&)>;

// `prefix` is Python's message up to the offending type name ("must be str, not ").
std::string need_str(const std::optional<Value>& v, const char* prefix) {
  if (!v || !v->is_string()) type_error(std::string(prefix) + (v ? py_type_name(*v) : "NoneType"));
  return v->str();
}

std::optional<std::string> opt_str(const std::optional<Value>& v, const char* what) {
  if (!v || v->is_none()) return std::nullopt;
  return need_str(v, what);
}

long opt_int(const std::optional<Value>& v, long def) {
  if (!v || v->is_none()) return def;
  if (!v->is_int() && !v->is_bool()) type_error("'" + py_type_name(*v) + "' object cannot be interpreted as an integer");
  return static_cast<long>(v->as_int());
}

// s[start:end] on code points, Python-clamped; returns the byte offset of the slice start.
std::string clamp_slice(const std::string& s, const std::optional<Value>& start, const std::optional<Value>& end,
                        size_t* byte_offset) {
  std::u32string u = utf8_decode(s);
  long n = static_cast<long>(u.size());
  auto adj = [n](long v) { return v < 0 ? std::max(0L, v + n) : std::min(v, n); };
  long b = adj(opt_int(start, 0));
  long e = adj(opt_int(end, n));
  if (e < b) e = b;
  *byte_offset = utf8_encode(u.substr(0, static_cast<size_t>(b))).size();
  return utf8_encode(u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b)));
}

bool affix_match(const Value& self, CallArgs& a, bool prefix) {
  auto p = bind_args(prefix ? "startswith" : "endswith", a, {"prefix", "start", "end"});
  if (!p[0]) type_error(std::string(prefix ? "startswith" : "endswith") + "() takes at least 1 argument (0 given)");
  size_t off;
  std::string s = clamp_slice(self.str(), p[1], p[2], &off);
  std::vector<std::string> cands;
  if (p[0]->is_tuple()) {
    for (const auto& c : p[0]->items()) {
      if (!c.is_string())
        type_error("tuple for " + std::string(prefix ? "startswith" : "endswith") + " must only contain str, not " + py_type_name(c));
      cands.push_back(c.str());
    }
  } else if (p[0]->is_string()) {
    cands.push_back(p[0]->str());
  } else {
    type_error(std::string(prefix ? "startswith" : "endswith") + " first arg must be str or a tuple of str, not " +
               py_type_name(*p[0]));
  }
  for (const auto& c : cands) {
    if (c.size() > s.size()) continue;
    if (prefix ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0) return true;
  }
  return false;
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

std::string pad(const std::string& s, long width, const std::string& fill, int mode) {  // 0 center, 1 ljust, 2 rjust
  long len = static_cast<long>(utf8_length(s));
  if (width <= len) return s;
  long marg = width - len;
  long left = mode == 1 ? 0 : mode == 2 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (long i = 0; i < left; ++i) out += fill;
  out += s;
  for (long i = 0; i < marg - left; ++i) out += fill;
  return out;
}

// str.format with the field forms templates use: {}, {0}, {name}, {name.attr}, {0[key]}, an
// optional !r/!s conversion and a format spec applied via percent formatting of simple specs.
Value str_format(Interpreter& in, const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') { out += '}'; ++i; continue; }
      throw_error("ValueError", "Single '}' encountered in format string");
    }
    if (c != '{') { out += c; continue; }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') { out += '{'; ++i; continue; }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw_error("ValueError", "Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec, conv;
    size_t colon = field.find(':');
    if (colon != std::string::npos) { spec = field.substr(colon + 1); field = field.substr(0, colon); }
    size_t bang = field.find('!');
    if (bang != std::string::npos) { conv = field.substr(bang + 1); field = field.substr(0, bang); }
    size_t end = field.find_first_of(".[");
    std::string head = field.substr(0, end);
    Value v;
    if (head.empty()) {
      if (auto_idx >= a.args.size()) throw_error("IndexError", "Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
      v = a.args[auto_idx++];
    } else if (std::all_of(head.begin(), head.end(), ::isdigit)) {
      size_t idx = std::stoul(head);
      if (idx >= a.args.size()) throw_error("IndexError", "Replacement index " + head + " out of range for positional args tuple");
      v = a.args[idx];
    } else {
      bool found = false;
      for (auto& [k, kv] : a.kwargs)
        if (k == head) { v = kv; found = true; }
      if (!found) throw_error("KeyError", "'" + head + "'");
    }
    while (end != std::string::npos && end < field.size()) {
      if (field[end] == '.') {
        size_t nx = field.find_first_of(".[", end + 1);
        v = in.getattr(v, field.substr(end + 1, nx == std::string::npos ? std::string::npos : nx - end - 1));
        end = nx;
      } else {
        size_t rb = field.find(']', end);
        if (rb == std::string::npos) throw_error("ValueError", "Missing ']' in format string");
        std::string key = field.substr(end + 1, rb - end - 1);
        Value k = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit) ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key);
        v = in.getitem(v, k);
        end = rb + 1 < field.size() ? rb + 1 : std::string::npos;
      }
    }
    std::string text = conv == "r" ? py_repr(v) : py_str(v);
    if (!spec.empty()) text = conv.empty() && !v.is_string() ? percent_format("%" + spec + (v.is_float() ? "f" : v.is_int() ? "d" : "s"), v) : percent_format("%" + spec + "s", Value(text));
    out += text;
  }
  return Value(out);
}

const std::unordered_map<std::string, Method>& str_methods() {
  static const auto* m = new std::unordered_map<std::string, Method>{
      {"startswith", [](Interpreter&, const Value& s, CallArgs& a) { return Value(affix_match(s, a, true)); }},
      {"endswith", [](Interpreter&, const Value& s, CallArgs& a) { return Value(affix_match(s, a, false)); }},
      {"strip", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("strip", a, {"chars"});
         return Value(py_strip(s.str(), opt_str(p[0], "strip arg must be None or str, not "), true, true), s.is_markup());
       }},
      {"lstrip", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("lstrip", a, {"chars"});
         return Value(py_strip(s.str(), opt_str(p[0], "lstrip arg must be None or str, not "), true, false), s.is_markup());
       }},
      {"rstrip", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("rstrip", a, {"chars"});
         return Value(py_strip(s.str(), opt_str(p[0], "rstrip arg must be None or str, not "), false, true), s.is_markup());
       }},
      {"split", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("split", a, {"sep", "maxsplit"});
         auto sep = opt_str(p[0], "must be str or None, not ");
         if (sep && sep->empty()) throw_error("ValueError", "empty separator");
         return str_list(py_split(s.str(), sep, opt_int(p[1], -1), false));
       }},
      {"rsplit", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("rsplit", a, {"sep", "maxsplit"});
         auto sep = opt_str(p[0], "must be str or None, not ");
         if (sep && sep->empty()) throw_error("ValueError", "empty separator");
         return str_list(py_split(s.str(), sep, opt_int(p[1], -1), true));
       }},
      {"splitlines", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("splitlines", a, {"keepends"});
         return str_list(py_splitlines(s.str(), p[0] && truthy(*p[0])));
       }},
      {"replace", [](Interpreter& in, const Value& s, CallArgs& a) {
         auto p = bind_args("replace", a, {"old", "new", "count"});
         std::string r = py_replace(s.str(), need_str(p[0], "replace() argument 1 must be str, not "), need_str(p[1], "replace() argument 2 must be str, not "),
                                    opt_int(p[2], -1));
         in.check_size(r.size());
         return Value(std::move(r), s.is_markup());
       }},
      {"upper", [](Interpreter&, const Value& s, CallArgs& a) { bind_args("upper", a, {}); return Value(py_upper(s.str()), s.is_markup()); }},
      {"lower", [](Interpreter&, const Value& s, CallArgs& a) { bind_args("lower", a, {}); return Value(py_lower(s.str()), s.is_markup()); }},
      {"casefold", [](Interpreter&, const Value& s, CallArgs& a) { bind_args("casefold", a, {}); return Value(py_lower(s.str())); }},
      {"title", [](Interpreter&, const Value& s, CallArgs& a) { bind_args("title", a, {}); return Value(py_title(s.str()), s.is_markup()); }},
      {"capitalize", [](Interpreter&, const Value& s, CallArgs& a) { bind_args("capitalize", a, {}); return Value(py_capitalize(s.str()), s.is_markup()); }},
      {"join", [](Interpreter& in, const Value& s, CallArgs& a) {
         auto p = bind_args("join", a, {"iterable"});
         if (!p[0]) type_error("str.join() takes exactly one argument (0 given)");
         std::string out;
         size_t i = 0;
         for (const auto& item : iterate(*p[0])) {
           if (!item.is_string())
             type_error("sequence item " + std::to_string(i) + ": expected str instance, " + py_type_name(item) + " found");
           if (i++) out += s.str();
           out += item.str();
           in.check_size(out.size());
         }
         return Value(std::move(out));
       }},
      {"find", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("find", a, {"sub", "start", "end"});
         size_t off;
         std::string sub = clamp_slice(s.str(), p[1], p[2], &off);
         long r = py_find(sub, need_str(p[0], "must be str, not "), false);
         return Value(static_cast<int64_t>(r < 0 ? -1 : r + static_cast<long>(utf8_length(s.str().substr(0, off)))));
       }},
      {"rfind", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("rfind", a, {"sub", "start", "end"});
         size_t off;
         std::string sub = clamp_slice(s.str(), p[1], p[2], &off);
         long r = py_find(sub, need_str(p[0], "must be str, not "), true);
         return Value(static_cast<int64_t>(r < 0 ? -1 : r + static_cast<long>(utf8_length(s.str().substr(0, off)))));
       }},
      {"index", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("index", a, {"sub", "start", "end"});
         size_t off;
         std::string sub = clamp_slice(s.str(), p[1], p[2], &off);
         long r = py_find(sub, need_str(p[0], "must be str, not "), false);
         if (r < 0) throw_error("ValueError", "substring not found");
         return Value(static_cast<int64_t>(r + static_cast<long>(utf8_length(s.str().substr(0, off)))));
       }},
      {"count", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("count", a, {"sub", "start", "end"});
         size_t off;
         std::string sub = clamp_slice(s.str(), p[1], p[2], &off);
         return Value(static_cast<int64_t>(py_count(sub, need_str(p[0], "must be str, not "))));
       }},
      {"isdigit", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         return Value(!u.empty() && std::all_of(u.begin(), u.end(), py_isdigit));
       }},
      {"isalpha", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         return Value(!u.empty() && std::all_of(u.begin(), u.end(), py_isalpha));
       }},
      {"isalnum", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         return Value(!u.empty() && std::all_of(u.begin(), u.end(), py_isalnum));
       }},
      {"isspace", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         return Value(!u.empty() && std::all_of(u.begin(), u.end(), py_isspace));
       }},
      {"islower", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         bool cased = false;
         for (char32_t c : u) {
           if (py_isupper_char(c)) return Value(false);
           if (py_islower_char(c)) cased = true;
         }
         return Value(cased);
       }},
      {"isupper", [](Interpreter&, const Value& s, CallArgs&) {
         auto u = utf8_decode(s.str());
         bool cased = false;
         for (char32_t c : u) {
           if (py_islower_char(c)) return Value(false);
           if (py_isupper_char(c)) cased = true;
         }
         return Value(cased);
       }},
      {"center", [](Interpreter& in, const Value& s, CallArgs& a) {
         auto p = bind_args("center", a, {"width", "fillchar"});
         long w = opt_int(p[0], 0);
         in.check_size(static_cast<size_t>(std::max(0L, w)));
         return Value(pad(s.str(), w, p[1] ? need_str(p[1], "The fill character must be a unicode character, not ") : " ", 0));
       }},
      {"ljust", [](Interpreter& in, const Value& s, CallArgs& a) {
         auto p = bind_args("ljust", a, {"width", "fillchar"});
         long w = opt_int(p[0], 0);
         in.check_size(static_cast<size_t>(std::max(0L, w)));
         return Value(pad(s.str(), w, p[1] ? need_str(p[1], "The fill character must be a unicode character, not ") : " ", 1));
       }},
      {"rjust", [](Interpreter& in, const Value& s, CallArgs& a) {
         auto p = bind_args("rjust", a, {"width", "fillchar"});
         long w = opt_int(p[0], 0);
         in.check_size(static_cast<size_t>(std::max(0L, w)));
         return Value(pad(s.str(), w, p[1] ? need_str(p[1], "The fill character must be a unicode character, not ") : " ", 2));
       }},
      {"removeprefix", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("removeprefix", a, {"prefix"});
         std::string pre = need_str(p[0], "removeprefix() argument must be str, not ");
         return Value(s.str().compare(0, pre.size(), pre) == 0 ? s.str().substr(pre.size()) : s.str());
       }},
      {"removesuffix", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("removesuffix", a, {"suffix"});
         std::string suf = need_str(p[0], "removesuffix() argument must be str, not ");
         const std::string& x = s.str();
         bool m = !suf.empty() && x.size() >= suf.size() && x.compare(x.size() - suf.size(), suf.size(), suf) == 0;
         return Value(m ? x.substr(0, x.size() - suf.size()) : x);
       }},
      {"partition", [](Interpreter&, const Value& s, CallArgs& a) {
         auto p = bind_args("partition", a, {"sep"});
         std::string sep = need_str(p[0], "must be str, not ");
         if (sep.empty()) throw_error("ValueError", "empty separator");
         size_t f = s.str().find(sep);
         if (f == std::string::npos) return Value::list({Value(s.str()), Value(""), Value("")}, true);
         return Value::list({Value(s.str().substr(0, f)), Value(sep), Value(s.str().substr(f + sep.size()))}, true);
       }},
      {"format", [](Interpreter& in, const Value& s, CallArgs& a) { return str_format(in, s.str(), a); }},
  };
  return *m;
}

const std::unordered_map<std::string, Method>& dict_methods() {
  static const auto* m = new std::unordered_map<std::string, Method>{
      {"items", [](Interpreter&, const Value& d, CallArgs& a) {
         bind_args("items", a, {});
         std::vector<Value> out;
         for (const auto& [k, v] : d.dict_data().items) out.push_back(Value::list({k, v}, true));
         return Value::list(std::move(out));
       }},
      {"keys", [](Interpreter&, const Value& d, CallArgs& a) {
         bind_args("keys", a, {});
         return Value::list(iterate(d));
       }},
      {"values", [](Interpreter&, const Value& d, CallArgs& a) {
         bind_args("values", a, {});
         std::vector<Value> out;
         for (const auto& [k, v] : d.dict_data().items) out.push_back(v);
         return Value::list(std::move(out));
       }},
      {"get", [](Interpreter&, const Value& d, CallArgs& a) {
         if (!a.kwargs.empty()) type_error("get() takes no keyword arguments");
         if (a.args.empty() || a.args.size() > 2) type_error("get expected at most 2 arguments, got " + std::to_string(a.args.size()));
         if (const Value* v = d.dict_data().find(a.args[0])) return *v;
         return a.args.size() > 1 ? a.args[1] : Value::none();
       }},
      {"copy", [](Interpreter&, const Value& d, CallArgs&) { return Value::dict(d.dict_data()); }},
  };
  return *m;
}

const std::unordered_map<std::string, Method>& list_methods() {
  static const auto* m = new std::unordered_map<std::string, Method>{
      {"index", [](Interpreter&, const Value& l, CallArgs& a) {
         if (a.args.empty()) type_error("index expected at least 1 argument, got 0");
         const auto& items = l.items();
         for (size_t i = 0; i < items.size(); ++i)
           if (py_equal(items[i], a.args[0])) return Value(static_cast<int64_t>(i));
         throw_error("ValueError", py_repr(a.args[0]) + " is not in " + (l.is_tuple() ? "tuple" : "list"));
       }},
      {"count", [](Interpreter&, const Value& l, CallArgs& a) {
         if (a.args.size() != 1) type_error("count() takes exactly one argument (" + std::to_string(a.args.size()) + " given)");
         int64_t n = 0;
         for (const auto& x : l.items())
           if (py_equal(x, a.args[0])) ++n;
         return Value(n);
       }},
      {"copy", [](Interpreter&, const Value& l, CallArgs&) { return Value::list(l.items(), l.is_tuple()); }},
  };
  return *m;
}

bool is_unsafe(const Value& obj, const std::string& name) {
  static const char* dict_mut[] = {"clear", "pop", "popitem", "setdefault", "update"};
  static const char* list_mut[] = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"};
  if (obj.is_dict()) return std::find(std::begin(dict_mut), std::end(dict_mut), name) != std::end(dict_mut);
  if (obj.is_sequence_list() && !obj.is_tuple())
    return std::find(std::begin(list_mut), std::end(list_mut), name) != std::end(list_mut);
  return false;
}

}  // namespace

std::optional<Value> builtin_method(const Value& obj, const std::string& name, bool* unsafe) {
  *unsafe = false;
  const std::unordered_map<std::string, Method>* table = nullptr;
  if (obj.is_string()) table = &str_methods();
  else if (obj.is_dict()) table = &dict_methods();
  else if (obj.is_sequence_list()) table = &list_methods();
  if (!table) return std::nullopt;
  auto it = table->find(name);
  if (it == table->end()) {
    *unsafe = is_unsafe(obj, name);
    return std::nullopt;
  }
  Method fn = it->second;
  Value self = obj;
  return Value::callable(name + " of " + py_type_name(obj) + " object",
                         [fn, self](Interpreter& in, CallArgs& a) { return fn(in, self, a); }, CallableKind::Method);
}

}  // namespace sparkserve::jinja
