// Globals every template sees: jinja2's (range, dict, namespace, cycler, joiner) and the two
// transformers adds (raise_exception, strftime_now).
#include <ctime>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/interpreter.h"

namespace sparkserve::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

int64_t int_arg(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_int() && !v.is_bool()) type_error("'" + py_type_name(v) + "' object cannot be interpreted as an integer");
  return v.as_int();
}

Value range_fn(Interpreter&, CallArgs& a) {
  if (!a.kwargs.empty()) type_error("range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3) type_error("range expected at most 3 arguments, got " + std::to_string(a.args.size()));
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = int_arg(a.args[0]);
  } else {
    start = int_arg(a.args[0]);
    stop = int_arg(a.args[1]);
    if (a.args.size() == 3) step = int_arg(a.args[2]);
  }
  if (step == 0) throw_error("ValueError", "range() arg 3 must not be zero");
  __int128 n = 0;
  if (step > 0 && stop > start) n = ((__int128)stop - start + step - 1) / step;
  if (step < 0 && stop < start) n = ((__int128)start - stop - step - 1) / -step;
  if (n > kMaxRange)
    throw_error("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) items.emplace_back(start + i * step);
  return Value::list(std::move(items));
}

Value namespace_fn(Interpreter&, CallArgs& a) {
  DictData d;
  if (a.args.size() > 1) type_error("Namespace expected at most 1 positional argument");
  if (a.args.size() == 1) {
    const Value& init = a.args[0];
    if (init.is_dict()) {
      d = init.dict_data();
    } else {
      for (const auto& pair : iterate(init)) {
        auto kv = iterate(pair);
        if (kv.size() != 2) throw_error("ValueError", "dictionary update sequence element has wrong length");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d.set(Value(k), v);
  return Value::namespace_(std::move(d));
}

Value dict_fn(Interpreter& in, CallArgs& a) {
  Value ns = namespace_fn(in, a);
  return Value::dict(ns.namespace_data());
}

}  // namespace

DictData builtin_globals() {
  DictData g;
  g.set(Value("range"), Value::callable("range", range_fn));
  g.set(Value("namespace"), Value::callable("namespace", namespace_fn));
  g.set(Value("dict"), Value::callable("dict", dict_fn));
  g.set(Value("raise_exception"), Value::callable("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
          auto p = bind_args("raise_exception", a, {"message"});
          if (!p[0]) type_error("raise_exception() missing 1 required positional argument: 'message'");
          throw_error("TemplateError", py_str(*p[0]));
        }));
  g.set(Value("strftime_now"), Value::callable("strftime_now", [](Interpreter&, CallArgs& a) -> Value {
          auto p = bind_args("strftime_now", a, {"format"});
          if (!p[0] || !p[0]->is_string()) type_error("strftime() argument 1 must be str");
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          std::string out(256 + p[0]->str().size() * 8, '\0');
          size_t n = std::strftime(out.data(), out.size(), p[0]->str().c_str(), &tm);
          out.resize(n);
          return Value(out);
        }));
  g.set(Value("cycler"), Value::callable("cycler", [](Interpreter&, CallArgs& a) -> Value {
          // A cycler object: .next() returns the items in turn, .current the pending one.
          auto items = std::make_shared<std::vector<Value>>(a.args);
          auto pos = std::make_shared<size_t>(0);
          DictData d;
          d.set(Value("next"), Value::callable("next", [items, pos](Interpreter&, CallArgs&) -> Value {
                  if (items->empty()) return Value::none();
                  Value v = (*items)[*pos % items->size()];
                  ++*pos;
                  return v;
                }));
          return Value::namespace_(std::move(d));
        }));
  g.set(Value("joiner"), Value::callable("joiner", [](Interpreter&, CallArgs& a) -> Value {
          std::string sep = a.args.empty() ? ", " : py_str(a.args[0]);
          auto used = std::make_shared<bool>(false);
          return Value::callable("joiner", [sep, used](Interpreter&, CallArgs&) -> Value {
            if (!*used) {
              *used = true;
              return Value("");
            }
            return Value(sep);
          });
        }));
  return g;
}

}  // namespace sparkserve::jinja
