// Filters, tests, methods of built-in types, globals, and the argument binding they share.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/value.h"

namespace sparkserve::jinja {

using FilterFn = std::function<Value(Interpreter&, const Value&, CallArgs&)>;
using TestFn = std::function<bool(Interpreter&, const Value&, CallArgs&)>;

const std::unordered_map<std::string, FilterFn>& builtin_filters();
const std::unordered_map<std::string, TestFn>& builtin_tests();

// The globals every render sees (range, dict, namespace, raise_exception, strftime_now, ...).
DictData builtin_globals();

// Python attribute lookup on built-in types: bound methods of str, dict and list. Sets *unsafe
// when the ImmutableSandboxedEnvironment would refuse the attribute (list.append, dict.update...).
std::optional<Value> builtin_method(const Value& obj, const std::string& name, bool* unsafe);

// Binds call arguments to named parameters the way a Python signature does.
// `names` lists the parameters after the operand; returns one slot per name.
std::vector<std::optional<Value>> bind_args(const std::string& func, CallArgs& args,
                                            const std::vector<std::string>& names);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) on template values.
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // already converted from int to spaces
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);

// Python's `format % args` for str.
std::string percent_format(const std::string& format, const Value& args);
// markupsafe.escape(s) on text.
std::string html_escape(const std::string& s);

// int(v) with Python's rules for the int filter; nullopt when Python would raise.
std::optional<int64_t> py_int_of_string(const std::string& s, int base);
std::optional<double> py_float_of_string(const std::string& s);

}  // namespace sparkserve::jinja
