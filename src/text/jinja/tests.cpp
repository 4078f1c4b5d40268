// jinja2's built-in tests (`x is string`, `x is divisibleby 3`, ...).
#include <cmath>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

namespace {

Value one_arg(CallArgs& a, const char* test) {
  auto p = bind_args(test, a, {"other"});
  if (!p[0]) type_error(std::string(test) + "() missing 1 required positional argument");
  return *p[0];
}

Value py_mod(Interpreter& in, const Value& v, const Value& m) {
  // value % n, with Python's errors for non-numbers.
  CallArgs none;
  (void)none;
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_string()) return Value(percent_format(v.str(), m));  // str % x is formatting in Python
  if (!v.is_number() || !m.is_number())
    type_error("unsupported operand type(s) for %: '" + py_type_name(v) + "' and '" + py_type_name(m) + "'");
  if (!v.is_float() && !m.is_float()) {
    if (m.as_int() == 0) throw_error("ZeroDivisionError", "integer modulo by zero");
    int64_t r = m.as_int() == -1 ? 0 : v.as_int() % m.as_int();
    if (r != 0 && ((r < 0) != (m.as_int() < 0))) r += m.as_int();
    return Value(r);
  }
  double y = m.as_double();
  if (y == 0) throw_error("ZeroDivisionError", "float modulo");
  double r = std::fmod(v.as_double(), y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value(r);
}

}  // namespace

const std::unordered_map<std::string, TestFn>& builtin_tests() {
  static const auto* tests = [] {
    auto* t = new std::unordered_map<std::string, TestFn>();
    auto& m = *t;
    m["defined"] = [](Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); };
    m["undefined"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); };
    m["none"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_none(); };
    m["boolean"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); };
    m["false"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); };
    m["true"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); };
    m["integer"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_int(); };
    m["float"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_float(); };
    m["number"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_number(); };
    m["string"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_string(); };
    m["mapping"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); };
    // iter() succeeds on strings, lists, dicts, the loop object and (jinja2 quirk) undefined.
    m["iterable"] = [](Interpreter&, const Value& v, CallArgs&) {
      return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_loop() || v.is_namespace();
    };
    // len() and __getitem__: strings, lists, tuples, dicts, and undefined.
    m["sequence"] = [](Interpreter&, const Value& v, CallArgs&) {
      return v.is_string() || v.is_sequence_list() || v.is_dict() || v.is_undefined();
    };
    m["callable"] = [](Interpreter&, const Value& v, CallArgs&) {
      return v.is_callable() || v.is_undefined() ;
    };
    m["escaped"] = [](Interpreter&, const Value& v, CallArgs&) { return v.is_markup(); };
    m["lower"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      bool cased = false;
      for (char32_t c : utf8_decode(py_str(v))) {
        if (py_isupper_char(c)) return false;
        if (py_islower_char(c)) cased = true;
      }
      return cased;
    };
    m["upper"] = [](Interpreter&, const Value& v, CallArgs&) {
      bool cased = false;
      for (char32_t c : utf8_decode(py_str(v))) {
        if (py_islower_char(c)) return false;
        if (py_isupper_char(c)) cased = true;
      }
      return cased;
    };
    m["odd"] = [](Interpreter& in, const Value& v, CallArgs&) { return py_equal(py_mod(in, v, Value(2)), Value(1)); };
    m["even"] = [](Interpreter& in, const Value& v, CallArgs&) { return py_equal(py_mod(in, v, Value(2)), Value(0)); };
    m["divisibleby"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      return py_equal(py_mod(in, v, one_arg(a, "test_divisibleby")), Value(0));
    };
    TestFn eq = [](Interpreter&, const Value& v, CallArgs& a) { return py_equal(v, one_arg(a, "eq")); };
    TestFn ne = [](Interpreter&, const Value& v, CallArgs& a) { return !py_equal(v, one_arg(a, "ne")); };
    TestFn lt = [](Interpreter&, const Value& v, CallArgs& a) {
      Value o = one_arg(a, "lt");
      check_orderable(v, o, "<");
      return py_less(v, o, "<");
    };
    TestFn gt = [](Interpreter&, const Value& v, CallArgs& a) {
      Value o = one_arg(a, "gt");
      check_orderable(v, o, ">");
      return py_less(o, v, ">");
    };
    TestFn le = [](Interpreter&, const Value& v, CallArgs& a) {
      Value o = one_arg(a, "le");
      check_orderable(v, o, "<=");
      return py_less(v, o, "<=") || py_equal(v, o);
    };
    TestFn ge = [](Interpreter&, const Value& v, CallArgs& a) {
      Value o = one_arg(a, "ge");
      check_orderable(v, o, ">=");
      return py_less(o, v, ">=") || py_equal(v, o);
    };
    for (const char* n : {"eq", "==", "equalto"}) m[n] = eq;
    for (const char* n : {"ne", "!="}) m[n] = ne;
    for (const char* n : {"lt", "<", "lessthan"}) m[n] = lt;
    for (const char* n : {"gt", ">", "greaterthan"}) m[n] = gt;
    for (const char* n : {"le", "<="}) m[n] = le;
    for (const char* n : {"ge", ">="}) m[n] = ge;
    m["sameas"] = [](Interpreter&, const Value& v, CallArgs& a) {
      Value o = one_arg(a, "sameas");
      // `is`: singletons compare by value; containers by identity, which py_equal gives for
      // callables/namespaces but not lists/dicts.
      if (v.is_none() || v.is_bool() || v.is_undefined()) return v.kind() == o.kind() && py_equal(v, o);
      if (v.is_list()) return o.is_list() && &v.list_data() == &o.list_data();
      if (v.is_dict()) return o.is_dict() && &v.dict_data() == &o.dict_data();
      return v.kind() == o.kind() && py_equal(v, o);
    };
    m["in"] = [](Interpreter& in, const Value& v, CallArgs& a) {
      Value seq = one_arg(a, "in");
      switch (seq.kind()) {
        case Kind::String:
          if (!v.is_string()) type_error("'in <string>' requires string as left operand, not " + py_type_name(v));
          return seq.str().find(v.str()) != std::string::npos;
        case Kind::Dict: return seq.dict_data().find(v) != nullptr;
        case Kind::List:
          for (const auto& x : iterate(seq))
            if (py_equal(x, v)) return true;
          return false;
        case Kind::Undefined: return false;
        default: type_error("argument of type '" + py_type_name(seq) + "' is not iterable");
      }
    };
    m["filter"] = [](Interpreter&, const Value& v, CallArgs&) {
      return v.is_string() && builtin_filters().count(v.str()) > 0;
    };
    m["test"] = [](Interpreter&, const Value& v, CallArgs&) {
      return v.is_string() && builtin_tests().count(v.str()) > 0;
    };
    return t;
  }();
  return *tests;
}

}  // namespace sparkserve::jinja
