// jinja2's built-in filters, plus transformers' `tojson` override
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

namespace {

// str(value), keeping Markup as Markup (jinja2's soft_str).
Value soft_str(const Value& v) {
  if (v.is_string()) return v;
  return Value(py_str(v));
}

bool arg_true(const std::optional<Value>& v, bool def = false) { return v ? truthy(*v) : def; }

int64_t arg_int(const std::optional<Value>& v, int64_t def, const char* what) {
  if (!v) return def;
  if (v->is_int() || v->is_bool()) return v->as_int();
  type_error(std::string("'") + py_type_name(*v) + "' object cannot be interpreted as an integer (" + what + ")");
}

Value lower_if_str(const Value& v) { return v.is_string() ? Value(py_lower(v.str())) : v; }

// The attribute path "a.b.0" as jinja2 splits it (digits become indexes).
std::vector<Value> attribute_parts(const Value& attr) {
  std::vector<Value> parts;
  if (!attr.is_string()) {
    parts.push_back(attr);
    return parts;
  }
  for (const auto& p : py_split(attr.str(), std::string("."), -1, false)) {
    bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
    parts.push_back(digits ? Value(static_cast<int64_t>(std::stoll(p))) : Value(p));
  }
  return parts;
}

Value get_path(Interpreter& in, Value item, const std::vector<Value>& parts, const std::optional<Value>& def) {
  for (const auto& p : parts) {
    item = in.getitem(item, p);
    if (def && !def->is_none() && item.is_undefined()) item = *def;
  }
  return item;
}

void sort_values(std::vector<Value>& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (auto& [k, i] : keyed) out.push_back(items[i]);
  items = std::move(out);
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool is_max) {
  auto p = bind_args(is_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = arg_true(p[0]);
  std::vector<Value> parts;
  if (p[1] && !p[1]->is_none()) parts = attribute_parts(*p[1]);
  auto key = [&](const Value& x) {
    Value k = parts.empty() ? x : get_path(in, x, parts, std::nullopt);
    return cs ? k : lower_if_str(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    check_orderable(k, best_key, is_max ? ">" : "<");
    if (is_max ? py_less(best_key, k) : py_less(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

std::vector<Value> select_or_reject(Interpreter& in, const Value& v, CallArgs& a, bool select, bool attr) {
  std::vector<Value> out;
  if (!truthy(v)) return out;
  size_t off = 0;
  std::vector<Value> parts;
  if (attr) {
    if (a.args.empty()) throw_error("FilterArgumentError", "Missing parameter for attribute name");
    parts = attribute_parts(a.args[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs targs;
  if (a.args.size() > off) {
    test = py_str(a.args[off]);
    targs.args.assign(a.args.begin() + static_cast<long>(off) + 1, a.args.end());
  }
  targs.kwargs = a.kwargs;
  for (const auto& item : iterate(v)) {
    Value x = attr ? get_path(in, item, parts, std::nullopt) : item;
    bool r;
    if (test) {
      CallArgs copy = targs;
      r = in.test(*test, x, copy);
    } else {
      r = truthy(x);
    }
    if (r == select) out.push_back(item);
  }
  return out;
}

Value py_round(const Value& v, int64_t precision, const std::string& method) {
  if (method != "common" && method != "ceil" && method != "floor")
    throw_error("FilterArgumentError", "method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) type_error("type " + py_type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value(v.as_int());
      // round(int, negative): nearest multiple, ties to even.
      int64_t m = 1;
      for (int64_t i = 0; i < -precision && m < INT64_MAX / 10; ++i) m *= 10;
      int64_t x = v.as_int();
      int64_t q = x / m, r = x % m;
      if (r < 0) { r += m; --q; }
      if (2 * r > m || (2 * r == m && (q & 1))) ++q;
      return Value(q * m);
    }
    double x = v.as_double();
    if (!std::isfinite(x)) return Value(x);
    if (precision >= 0 && precision < 300) {
      // printf rounds the exact binary value half-to-even, as Python's round() does.
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
      return Value(std::strtod(buf, nullptr));
    }
    if (precision >= 300) return Value(x);
    double m = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / m) * m);
  }
  // ceil/floor: func(value * 10**precision) / 10**precision (true division -> float).
  double scale = std::pow(10.0, static_cast<double>(precision));
  double y = method == "ceil" ? std::ceil(v.as_double() * scale) : std::floor(v.as_double() * scale);
  return Value(y / scale);
}

Value do_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = arg_true(p[0]);
  if (p[1] && !p[1]->is_none()) {
    if (p[1]->is_string()) o.indent = p[1]->str();
    else if (p[1]->is_int()) o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(p[1]->as_int(), 1024))), ' ');
    else type_error("indent must be an int or a str");
  }
  if (p[2] && !p[2]->is_none()) {
    auto seps = iterate(*p[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      throw_error("ValueError", "separators must be a pair of strings");
    o.item_separator = seps[0].str();
    o.key_separator = seps[1].str();
  }
  o.sort_keys = arg_true(p[3]);
  std::string s = to_json(v, o);
  in.check_size(s.size());
  return Value(std::move(s));
}

Value do_indent(const Value& v, CallArgs& a) {
  auto p = bind_args("indent", a, {"width", "first", "blank"});
  std::string ind = p[0] && p[0]->is_string() ? p[0]->str() : std::string(static_cast<size_t>(std::max<int64_t>(0, arg_int(p[0], 4, "width"))), ' ');
  bool first = arg_true(p[1]);
  bool blank = arg_true(p[2]);
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) type_error("unsupported operand type(s) for +=: '" + py_type_name(v) + "' and 'str'");
  std::string s = v.str() + "\n";
  auto lines = py_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else if (!lines.empty()) {
    rv = lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : ind + lines[i];
      }
    }
  }
  if (first) rv = ind + rv;
  return Value(rv, v.is_markup());
}

Value do_title(const Value& v) {
  // "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s) if item)
  std::u32string u = utf8_decode(py_str(v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    std::u32string item = u.substr(i, j - i);
    out += py_upper(utf8_encode(item.substr(0, 1))) + py_lower(utf8_encode(item.substr(1)));
    i = j;
  }
  return Value(out);
}

Value do_reverse(const Value& v) {
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value(utf8_encode(u), v.is_markup());
  }
  if (!(v.is_list() || v.is_dict() || v.is_undefined() || v.is_loop()))
    throw_error("FilterArgumentError", "argument must be iterable");
  // reversed(x) where Python can, else list(x) reversed.
  std::string type = v.is_sequence_list() ? (v.is_tuple() ? "reversed" : "list_reverseiterator")
                     : v.is_dict()        ? "dict_reversekeyiterator"
                     : v.is_undefined()   ? "reversed"
                                          : "";
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return type.empty() ? Value::list(std::move(items)) : Value::iterator(std::move(items), type);
}

Value do_length(const Value& v) {
  switch (v.kind()) {
    case Kind::String: return Value(static_cast<int64_t>(utf8_length(v.str())));
    case Kind::List:
      if (v.is_iterator()) type_error("object of type '" + py_type_name(v) + "' has no len()");
      return Value(static_cast<int64_t>(v.items().size()));
    case Kind::Dict: return Value(static_cast<int64_t>(v.dict_data().items.size()));
    case Kind::Undefined: return Value(static_cast<int64_t>(0));
    case Kind::Loop: return Value(static_cast<int64_t>(v.loop_data().items->items.size()));
    default: type_error("object of type '" + py_type_name(v) + "' has no len()");
  }
}

Value do_int(const Value& v, CallArgs& a) {
  auto p = bind_args("int", a, {"default", "base"});
  Value def = p[0] ? *p[0] : Value(static_cast<int64_t>(0));
  int base = static_cast<int>(arg_int(p[1], 10, "base"));
  if (v.is_undefined()) fail_undefined(v);  // int(Undefined) raises UndefinedError
  switch (v.kind()) {
    case Kind::Int: case Kind::Bool: return Value(v.as_int());
    case Kind::Float: {
      double d = v.as_double();
      if (std::isnan(d)) return def;
      if (std::isinf(d)) throw_error("OverflowError", "cannot convert float infinity to integer");
      if (std::fabs(d) >= 9.2e18) throw_error("OverflowError", "integer does not fit in 64 bits");
      return Value(static_cast<int64_t>(d));
    }
    case Kind::String: {
      if (auto i = py_int_of_string(v.str(), base)) return Value(*i);
      if (auto f = py_float_of_string(v.str())) {
        if (std::isfinite(*f) && std::fabs(*f) < 9.2e18) return Value(static_cast<int64_t>(*f));
      }
      return def;
    }
    default: return def;
  }
}

Value do_float(const Value& v, CallArgs& a) {
  auto p = bind_args("float", a, {"default"});
  Value def = p[0] ? *p[0] : Value(0.0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    if (auto f = py_float_of_string(v.str())) return Value(*f);
  }
  return def;
}

Value do_sum(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args("sum", a, {"attribute", "start"});
  std::vector<Value> parts;
  if (p[0] && !p[0]->is_none()) parts = attribute_parts(*p[0]);
  Value acc = p[1] ? *p[1] : Value(static_cast<int64_t>(0));
  for (const auto& item : iterate(v)) {
    Value x = parts.empty() ? item : get_path(in, item, parts, std::nullopt);
    if (acc.is_string()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
    CallArgs none;
    // Reuse the interpreter's `+` through a tiny expression-free path.
    if (acc.is_number() && x.is_number()) {
      if (acc.is_float() || x.is_float()) acc = Value(acc.as_double() + x.as_double());
      else {
        int64_t r;
        if (__builtin_add_overflow(acc.as_int(), x.as_int(), &r)) throw_error("OverflowError", "integer overflow in sum");
        acc = Value(r);
      }
    } else if (acc.is_list() && x.is_list() && acc.is_tuple() == x.is_tuple()) {
      std::vector<Value> r = acc.items();
      r.insert(r.end(), x.items().begin(), x.items().end());
      acc = Value::list(std::move(r), acc.is_tuple());
    } else {
      if (x.is_undefined()) fail_undefined(x);
      type_error("unsupported operand type(s) for +: '" + py_type_name(acc) + "' and '" + py_type_name(x) + "'");
    }
  }
  return acc;
}

Value do_truncate(const Value& v, CallArgs& a) {
  auto p = bind_args("truncate", a, {"length", "killwords", "end", "leeway"});
  int64_t length = arg_int(p[0], 255, "length");
  bool killwords = arg_true(p[1]);
  std::string end = p[2] ? py_str(*p[2]) : "...";
  int64_t leeway = arg_int(p[3], 5, "leeway");
  std::u32string s = utf8_decode(py_str(v));
  int64_t end_len = static_cast<int64_t>(utf8_length(end));
  if (length < end_len) throw_error("AssertionError", "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value(py_str(v));
  std::string head = utf8_encode(s.substr(0, static_cast<size_t>(length - end_len)));
  if (killwords) return Value(head + end);
  auto parts = py_split(head, std::string(" "), 1, true);
  return Value(parts[0] + end);
}

Value do_batch_or_slice(const Value& v, CallArgs& a, bool is_batch) {
  auto p = bind_args(is_batch ? "batch" : "slice", a, {is_batch ? "linecount" : "slices", "fill_with"});
  int64_t n = arg_int(p[0], 1, "count");
  std::vector<Value> items = iterate(v);
  std::vector<Value> out;
  bool fill = p[1] && !p[1]->is_none();
  if (is_batch) {
    if (n <= 0) throw_error("ValueError", "batch size must be positive");
    for (size_t i = 0; i < items.size(); i += static_cast<size_t>(n)) {
      std::vector<Value> chunk(items.begin() + static_cast<long>(i),
                               items.begin() + static_cast<long>(std::min(items.size(), i + static_cast<size_t>(n))));
      if (fill)
        while (static_cast<int64_t>(chunk.size()) < n) chunk.push_back(*p[1]);
      out.push_back(Value::list(std::move(chunk)));
    }
    return Value::iterator(std::move(out));
  }
  if (n <= 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
  size_t len = items.size();
  size_t per = len / static_cast<size_t>(n), extra = len % static_cast<size_t>(n);
  size_t offset = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    size_t start = offset + i * per;
    if (i < extra) ++offset;
    size_t end = offset + (i + 1) * per;
    std::vector<Value> chunk(items.begin() + static_cast<long>(start), items.begin() + static_cast<long>(end));
    if (fill && i >= extra) chunk.push_back(*p[1]);
    out.push_back(Value::list(std::move(chunk)));
  }
  return Value::iterator(std::move(out));
}

Value do_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args("groupby", a, {"attribute", "default", "case_sensitive"});
  if (!p[0]) type_error("groupby() missing required argument 'attribute'");
  auto parts = attribute_parts(*p[0]);
  bool cs = arg_true(p[2]);
  auto key = [&](const Value& x) {
    Value k = get_path(in, x, parts, p[1]);
    return cs ? k : lower_if_str(k);
  };
  std::vector<Value> items = iterate(v);
  sort_values(items, key, false);
  std::vector<Value> out;
  size_t i = 0;
  while (i < items.size()) {
    Value k = key(items[i]);
    std::vector<Value> group;
    size_t j = i;
    while (j < items.size() && py_equal(key(items[j]), k)) group.push_back(items[j++]);
    Value shown = cs ? k : get_path(in, group[0], parts, p[1]);
    out.push_back(Value::list({shown, Value::list(std::move(group))}, true));
    i = j;
  }
  return Value::list(std::move(out));
}

Value sorted_dicts(const Value& v) {
  if (v.is_list()) {
    std::vector<Value> items;
    for (const auto& x : v.items()) items.push_back(sorted_dicts(x));
    return Value::list(std::move(items), v.is_tuple());
  }
  if (!v.is_dict()) return v;
  DictData d = v.dict_data();
  std::stable_sort(d.items.begin(), d.items.end(), [](const auto& a, const auto& b) {
    try {
      return py_less(a.first, b.first);
    } catch (const JinjaError&) {
      return py_type_name(a.first) < py_type_name(b.first);
    }
  });
  for (auto& kv : d.items) kv.second = sorted_dicts(kv.second);
  return Value::dict(std::move(d));
}

}  // namespace

const std::unordered_map<std::string, FilterFn>& builtin_filters() {
  static const auto* filters = [] {
    auto* t = new std::unordered_map<std::string, FilterFn>();
    auto& m = *t;
    m["tojson"] = do_tojson;
    m["safe"] = [](Interpreter&, const Value& v, CallArgs&) { return Value(py_str(v), true); };
    m["string"] = [](Interpreter&, const Value& v, CallArgs&) { return soft_str(v); };
    m["trim"] = [](Interpreter&, const Value& v, CallArgs& a) {
      auto p = bind_args("trim", a, {"chars"});
      std::optional<std::string> chars;
      if (p[0] && !p[0]->is_none()) chars = py_str(*p[0]);
      Value s = soft_str(v);
      return Value(py_strip(s.str(), chars, true, true), s.is_markup());
    };
    m["length"] = m["count"] = [](Interpreter&, const Value& v, CallArgs&) { return do_length(v); };
    m["items"] = [](Interpreter&, const Value& v, CallArgs&) {
      if (v.is_undefined()) return Value::iterator({});
      if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, x] : v.dict_data().items) out.push_back(Value::list({k, x}, true));
      return Value::iterator(std::move(out));
    };
    m["list"] = [](Interpreter&, const Value& v, CallArgs&) { return Value::list(iterate(v)); };
    m["lower"] = [](Interpreter&, const Value& v, CallArgs&) {
      Value s = soft_str(v);
      return Value(py_lower(s.str()), s.is_markup());
    };
    m["upper"] = [](Interpreter&, const Value& v, CallArgs&) {
      Value s = soft_str(v);
      return Value(py_upper(s.str()), s.is_markup());
    };
    m["capitalize"] = [](Interpreter&, const Value& v, CallArgs&) {
      Value s = soft_str(v);
      return Value(py_capitalize(s.str()), s.is_markup());
    };
    m["title"] = [](Interpreter&, const Value& v, CallArgs&) { return do_title(v); };
    m["replace"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("replace", a, {"old", "new", "count"});
      if (!p[0] || !p[1]) type_error("do_replace() missing required arguments 'old' and 'new'");
      int64_t count = p[2] && !p[2]->is_none() ? arg_int(p[2], -1, "count") : -1;
      std::string r = py_replace(py_str(v), py_str(*p[0]), py_str(*p[1]), static_cast<long>(count));
      in.check_size(r.size());
      return Value(std::move(r));
    };
    m["join"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("join", a, {"d", "attribute"});
      std::string sep = p[0] ? py_str(*p[0]) : "";
      std::vector<Value> parts;
      if (p[1] && !p[1]->is_none()) parts = attribute_parts(*p[1]);
      std::string out;
      bool first = true;
      for (const auto& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += py_str(parts.empty() ? item : get_path(in, item, parts, std::nullopt));
        in.check_size(out.size());
      }
      return Value(std::move(out));
    };
    m["default"] = m["d"] = [](Interpreter&, const Value& v, CallArgs& a) {
      auto p = bind_args("default", a, {"default_value", "boolean"});
      if (v.is_undefined() || (arg_true(p[1]) && !truthy(v))) return p[0] ? *p[0] : Value("");
      return v;
    };
    m["first"] = [](Interpreter&, const Value& v, CallArgs&) {
      auto items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    m["last"] = [](Interpreter&, const Value& v, CallArgs&) {
      if (!(v.is_sequence_list() || v.is_dict() || v.is_string() || v.is_undefined()))
        type_error("'" + py_type_name(v) + "' object is not reversible");
      auto items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    m["map"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      std::vector<Value> out;
      if (!truthy(v)) return Value::iterator({});  // jinja2 maps only `if value:` (None maps to nothing)
      if (a.args.empty()) {
        std::optional<Value> attr, def;
        for (auto& [k, x] : a.kwargs) {
          if (k == "attribute") attr = x;
          else if (k == "default") def = x;
          else throw_error("FilterArgumentError", "Unexpected keyword argument '" + k + "'");
        }
        if (!attr) throw_error("FilterArgumentError", "map requires a filter argument");
        auto parts = attribute_parts(*attr);
        for (const auto& item : iterate(v)) out.push_back(get_path(in, item, parts, def));
      } else {
        std::string name = py_str(a.args[0]);
        CallArgs rest;
        rest.args.assign(a.args.begin() + 1, a.args.end());
        rest.kwargs = a.kwargs;
        for (const auto& item : iterate(v)) {
          CallArgs copy = rest;
          out.push_back(in.filter(name, item, copy));
        }
      }
      return Value::iterator(std::move(out));
    };
    m["select"] = [](Interpreter& in, const Value& v, CallArgs& a) { return Value::iterator(select_or_reject(in, v, a, true, false)); };
    m["reject"] = [](Interpreter& in, const Value& v, CallArgs& a) { return Value::iterator(select_or_reject(in, v, a, false, false)); };
    m["selectattr"] = [](Interpreter& in, const Value& v, CallArgs& a) { return Value::iterator(select_or_reject(in, v, a, true, true)); };
    m["rejectattr"] = [](Interpreter& in, const Value& v, CallArgs& a) { return Value::iterator(select_or_reject(in, v, a, false, true)); };
    m["dictsort"] = [](Interpreter&, const Value& v, CallArgs& a) {
      auto p = bind_args("dictsort", a, {"case_sensitive", "by", "reverse"});
      bool cs = arg_true(p[0]);
      std::string by = p[1] ? py_str(*p[1]) : "key";
      if (by != "key" && by != "value") throw_error("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_dict()) throw_error("AttributeError", "'" + py_type_name(v) + "' object has no attribute 'items'");
      std::vector<Value> items;
      for (const auto& [k, x] : v.dict_data().items) items.push_back(Value::list({k, x}, true));
      size_t pos = by == "key" ? 0 : 1;
      sort_values(items, [&](const Value& it) { return cs ? it.items()[pos] : lower_if_str(it.items()[pos]); }, arg_true(p[2]));
      return Value::list(std::move(items));
    };
    m["sort"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("sort", a, {"reverse", "case_sensitive", "attribute"});
      bool cs = arg_true(p[1]);
      std::vector<std::vector<Value>> attrs;  // comma-separated attribute list sorts by each
      if (p[2] && !p[2]->is_none()) {
        if (p[2]->is_string())
          for (const auto& part : py_split(p[2]->str(), std::string(","), -1, false))
            attrs.push_back(attribute_parts(Value(py_strip(part, std::nullopt, true, true))));
        else
          attrs.push_back(attribute_parts(*p[2]));
      }
      std::vector<Value> items = iterate(v);
      sort_values(items, [&](const Value& x) {
        if (attrs.empty()) return cs ? x : lower_if_str(x);
        if (attrs.size() == 1) {
          Value k = get_path(in, x, attrs[0], std::nullopt);
          return cs ? k : lower_if_str(k);
        }
        std::vector<Value> ks;
        for (const auto& parts : attrs) {
          Value k = get_path(in, x, parts, std::nullopt);
          ks.push_back(cs ? k : lower_if_str(k));
        }
        return Value::list(std::move(ks));
      }, arg_true(p[0]));
      return Value::list(std::move(items));
    };
    m["unique"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("unique", a, {"case_sensitive", "attribute"});
      bool cs = arg_true(p[0]);
      std::vector<Value> parts;
      if (p[1] && !p[1]->is_none()) parts = attribute_parts(*p[1]);
      std::vector<Value> seen, out;
      for (const auto& item : iterate(v)) {
        Value k = parts.empty() ? item : get_path(in, item, parts, std::nullopt);
        if (!cs) k = lower_if_str(k);
        bool dup = false;
        for (const auto& s : seen)
          if (py_equal(s, k)) { dup = true; break; }
        if (dup) continue;
        seen.push_back(k);
        out.push_back(item);
      }
      return Value::iterator(std::move(out));
    };
    m["min"] = [](Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); };
    m["max"] = [](Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); };
    m["sum"] = do_sum;
    m["int"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_int(v, a); };
    m["float"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_float(v, a); };
    m["abs"] = [](Interpreter&, const Value& v, CallArgs&) {
      if (v.is_undefined()) fail_undefined(v);
      if (v.is_float()) return Value(std::fabs(v.as_double()));
      if (v.is_int() || v.is_bool()) {
        if (v.as_int() == INT64_MIN) throw_error("OverflowError", "integer overflow in abs");
        return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
      }
      type_error("bad operand type for abs(): '" + py_type_name(v) + "'");
    };
    m["round"] = [](Interpreter&, const Value& v, CallArgs& a) {
      auto p = bind_args("round", a, {"precision", "method"});
      return py_round(v, arg_int(p[0], 0, "precision"), p[1] ? py_str(*p[1]) : "common");
    };
    m["reverse"] = [](Interpreter&, const Value& v, CallArgs&) { return do_reverse(v); };
    m["indent"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_indent(v, a); };
    m["wordcount"] = [](Interpreter&, const Value& v, CallArgs&) {
      int64_t n = 0;
      bool in_word = false;
      for (char32_t c : utf8_decode(py_str(v))) {
        bool w = c == '_' || py_isalnum(c) || (c >= 0x300 && c <= 0x36f);
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value(n);
    };
    m["center"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("center", a, {"width"});
      int64_t w = arg_int(p[0], 80, "width");
      in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)));
      std::string s = py_str(v);
      int64_t len = static_cast<int64_t>(utf8_length(s));
      if (w <= len) return Value(s);
      int64_t marg = w - len;
      int64_t left = marg / 2 + (marg & w & 1);
      return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(marg - left), ' '));
    };
    m["escape"] = m["e"] = [](Interpreter&, const Value& v, CallArgs&) {
      if (v.is_markup()) return v;
      return Value(html_escape(py_str(v)), true);
    };
    m["forceescape"] = [](Interpreter&, const Value& v, CallArgs&) { return Value(html_escape(py_str(v)), true); };
    m["format"] = [](Interpreter&, const Value& v, CallArgs& a) {
      if (!a.args.empty() && !a.kwargs.empty())
        throw_error("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
      Value args;
      if (!a.kwargs.empty()) {
        DictData d;
        for (auto& [k, x] : a.kwargs) d.set(Value(k), x);
        args = Value::dict(std::move(d));
      } else {
        args = Value::list(a.args, true);
      }
      return Value(percent_format(py_str(v), args));
    };
    m["attr"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      auto p = bind_args("attr", a, {"name"});
      if (!p[0]) type_error("attr() missing required argument 'name'");
      std::string name = py_str(*p[0]);
      // Attribute only: a dict's keys are not attributes.
      if (v.is_dict()) {
        bool unsafe = false;
        if (auto meth = builtin_method(v, name, &unsafe)) return *meth;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      }
      return in.getattr(v, name);
    };
    m["batch"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_batch_or_slice(v, a, true); };
    m["slice"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_batch_or_slice(v, a, false); };
    m["truncate"] = [](Interpreter&, const Value& v, CallArgs& a) { return do_truncate(v, a); };
    m["groupby"] = do_groupby;
    // pprint.pformat for values whose repr fits in 80 columns (dict keys sorted); longer values
    // are not wrapped as pformat would.
    m["pprint"] = [](Interpreter&, const Value& v, CallArgs&) { return Value(py_repr(sorted_dicts(v))); };
    return t;
  }();
  return *filters;
}

}  // namespace sparkserve::jinja
