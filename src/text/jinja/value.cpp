#include "text/jinja/value.h"

#include <cstdio>

#include "text/jinja/error.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (py_equal(k, key)) return &v;
  return nullptr;
}

const Value* DictData::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : items)
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

namespace {
std::shared_ptr<const std::string> shared_text(std::string s) {
  return s.empty() ? nullptr : std::make_shared<const std::string>(std::move(s));
}
}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = shared_text(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double d) : kind_(Kind::Float), f_(d) {}
Value::Value(std::string s, bool markup) : kind_(Kind::String), markup_(markup), s_(shared_text(std::move(s))) {}

const std::string& Value::str() const {
  static const std::string empty;
  return s_ ? *s_ : empty;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::List;
  auto d = std::make_shared<ListData>();
  d->items = std::move(items);
  d->is_tuple = is_tuple;
  v.obj_ = std::move(d);
  return v;
}
Value Value::iterator(std::vector<Value> items, std::string type_name) {
  Value v = list(std::move(items));
  std::static_pointer_cast<ListData>(v.obj_)->iterator_type = std::move(type_name);
  return v;
}

Value Value::dict(DictData data) {
  Value v;
  v.kind_ = Kind::Dict;
  v.obj_ = std::make_shared<DictData>(std::move(data));
  return v;
}
Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn, CallableKind kind) {
  Value v;
  v.kind_ = Kind::Callable;
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  c->kind = kind;
  v.obj_ = std::move(c);
  return v;
}
Value Value::namespace_(DictData attrs) {
  Value v;
  v.kind_ = Kind::Namespace;
  v.obj_ = std::make_shared<DictData>(std::move(attrs));
  return v;
}
Value Value::loop(std::shared_ptr<LoopData> data) {
  Value v;
  v.kind_ = Kind::Loop;
  v.obj_ = std::move(data);
  return v;
}

Value Value::from_json(const OrderedJson& j, int depth) {
  if (depth > 512) throw_error("RecursionError", "input nested deeper than 512 levels");
  switch (j.type()) {
    case OrderedJson::value_t::null: return none();
    case OrderedJson::value_t::boolean: return Value(j.get<bool>());
    case OrderedJson::value_t::number_integer: return Value(j.get<int64_t>());
    case OrderedJson::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw_error("OverflowError", "integer " + std::to_string(u) + " is too large for the template engine");
      return Value(static_cast<int64_t>(u));
    }
    case OrderedJson::value_t::number_float: return Value(j.get<double>());
    case OrderedJson::value_t::string: return Value(j.get<std::string>());
    case OrderedJson::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return list(std::move(items));
    }
    case OrderedJson::value_t::object: {
      DictData d;
      d.items.reserve(j.size());
      // JSON objects may repeat a key; Python's json keeps the last value at the first position.
      for (const auto& [k, e] : j.items()) d.set(Value(k), from_json(e, depth + 1));
      return dict(std::move(d));
    }
    default: return none();
  }
}

double Value::as_double() const {
  if (kind_ == Kind::Float) return f_;
  if (kind_ == Kind::Bool) return b_ ? 1.0 : 0.0;
  return static_cast<double>(i_);
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.as_double() != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: return v.is_iterator() || !v.items().empty();
    case Kind::Dict: return !v.dict_data().items.empty();
    default: return true;
  }
}

std::string py_repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7f) {
      out += static_cast<char>(c);
    } else if (py_isprintable(c)) {
      utf8_append(out, c);
    } else if (c < 0x100) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

namespace {
std::string repr_dict_body(const DictData& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += py_repr(k);
    out += ": ";
    out += py_repr(v);
  }
  return out + "}";
}
}  // namespace

std::string py_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::String:
      return v.is_markup() ? "Markup(" + py_repr_string(v.str()) + ")" : py_repr_string(v.str());
    case Kind::List: {
      const auto& d = v.list_data();
      if (!d.iterator_type.empty()) return "<" + d.iterator_type + " object>";
      std::string out = d.is_tuple ? "(" : "[";
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i) out += ", ";
        out += py_repr(d.items[i]);
      }
      if (d.is_tuple && d.items.size() == 1) out += ",";
      return out + (d.is_tuple ? ")" : "]");
    }
    case Kind::Dict: return repr_dict_body(v.dict_data());
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(v.as_int());
    case Kind::Float: return py_float_repr(v.as_double());
    case Kind::String: return v.str();
    case Kind::List: case Kind::Dict: return py_repr(v);
    case Kind::Callable: {
      const auto& c = v.callable_data();
      if (c.kind == CallableKind::Macro) return "<Macro '" + c.name + "'>";
      if (c.kind == CallableKind::Method) return "<built-in method " + c.name + ">";
      return "<function " + c.name + ">";
    }
    case Kind::Namespace: return "<Namespace " + repr_dict_body(v.namespace_data()) + ">";
    case Kind::Loop: {
      const auto& l = v.loop_data();
      return "<LoopContext " + std::to_string(l.index0 + 1) + "/" + std::to_string(l.items->items.size()) + ">";
    }
  }
  return "";
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined: case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      const auto& x = a.list_data();
      const auto& y = b.list_data();
      if (a.is_iterator() || b.is_iterator()) return &x == &y;
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!py_equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const auto& x = a.dict_data();
      const auto& y = b.dict_data();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, val] : x.items) {
        const Value* other = y.find(k);
        if (!other || !py_equal(val, *other)) return false;
      }
      return true;
    }
    case Kind::Callable: return &a.callable_data() == &b.callable_data();
    case Kind::Namespace: return &a.namespace_data() == &b.namespace_data();
    case Kind::Loop: return &a.loop_data() == &b.loop_data();
    default: return false;
  }
}

void check_orderable(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if ((a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) ||
      (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()))
    return;
  type_error(std::string("'") + op + "' not supported between instances of '" + py_type_name(a) + "' and '" +
             py_type_name(b) + "'");
}

bool py_less(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 byte order == code point order
  if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i], op);
    }
    return x.size() < y.size();
  }
  type_error(std::string("'") + op + "' not supported between instances of '" + py_type_name(a) + "' and '" +
             py_type_name(b) + "'");
}

std::string py_type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return v.is_markup() ? "Markup" : "str";
    case Kind::List: return v.is_iterator() ? v.list_data().iterator_type : v.is_tuple() ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Callable: {
      auto k = v.callable_data().kind;
      return k == CallableKind::Macro ? "Macro" : k == CallableKind::Method ? "builtin_function_or_method" : "function";
    }
    case Kind::Namespace: return "Namespace";
    case Kind::Loop: return "LoopContext";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::None: return "None";
    case Kind::String: return v.is_markup() ? "markupsafe.Markup object" : "str object";
    case Kind::Namespace: return "jinja2.utils.Namespace object";
    case Kind::Loop: return "jinja2.runtime.LoopContext object";
    case Kind::Callable:
      return v.callable_data().kind == CallableKind::Macro ? "jinja2.runtime.Macro object"
                                                           : py_type_name(v) + " object";
    default: return py_type_name(v) + " object";
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List: {
      const auto& d = v.list_data();
      if (d.iterator_type.empty()) return d.items;
      if (d.consumed) return {};
      d.consumed = true;
      return d.items;
    }
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_data().items.size());
      for (const auto& [k, _] : v.dict_data().items) keys.push_back(k);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(v.str())) {
        std::string s;
        utf8_append(s, c);
        chars.emplace_back(std::move(s), v.is_markup());
      }
      return chars;
    }
    case Kind::Loop: return v.loop_data().items->items;
    default: type_error("'" + py_type_name(v) + "' object is not iterable");
  }
}

void fail_undefined(const Value& v) {
  throw_error("UndefinedError", v.str().empty() ? "'undefined' is undefined" : v.str());
}

}  // namespace sparkserve::jinja
