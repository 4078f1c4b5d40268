#include "text/jinja/interpreter.h"

#include <cmath>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/py_str.h"

namespace sparkserve::jinja {

Value* Frame::find_local(const std::string& name) {
  for (auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

void Frame::set(const std::string& name, Value v) {
  if (Value* slot = find_local(name)) *slot = std::move(v);
  else vars.emplace_back(name, std::move(v));
}

namespace {

FramePtr child_frame(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

// Whether a macro body refers to varargs / kwargs / caller (jinja2 accepts extra arguments only
// then).
void scan_names(const Expr* e, std::vector<bool>& uses);
void scan_body(const Body& b, std::vector<bool>& uses) {
  for (const auto& s : b) {
    scan_names(s->expr.get(), uses);
    scan_names(s->target.get(), uses);
    scan_names(s->filter.get(), uses);
    for (const auto& [t, body] : s->branches) {
      scan_names(t.get(), uses);
      scan_body(body, uses);
    }
    for (const auto& d : s->defaults) scan_names(d.get(), uses);
    if (s->kind != StmtKind::Macro) scan_body(s->body, uses);  // nested macros have their own
    scan_body(s->else_body, uses);
  }
}
void scan_names(const Expr* e, std::vector<bool>& uses) {
  if (!e) return;
  if (e->kind == ExprKind::Name) {
    if (e->name == "varargs") uses[0] = true;
    if (e->name == "kwargs") uses[1] = true;
    if (e->name == "caller") uses[2] = true;
  }
  for (const auto& c : e->children) scan_names(c.get(), uses);
  for (const auto& [k, c] : e->kwargs) scan_names(c.get(), uses);
  scan_names(e->star_args.get(), uses);
  scan_names(e->star_kwargs.get(), uses);
}

[[noreturn]] void overflow() {
  throw_error("OverflowError", "integer result does not fit in 64 bits (Python would switch to a big integer)");
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    throw_error("OutputLimitError", "template output exceeds the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
  // Everything built counts, freed or not: many strings under the per-string limit cannot add
  // up to unbounded memory.
  built_bytes_ += bytes;
  if (built_bytes_ > limits_.max_built_bytes)
    throw_error("OutputLimitError", "template built more than " + std::to_string(limits_.max_built_bytes) +
                                        " bytes of strings and lists in all");
}

void Interpreter::append(std::string& out, const std::string& s) const {
  if (out.size() + s.size() > limits_.max_output_bytes)
    throw_error("OutputLimitError", "template output exceeds the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
  out += s;
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps)
    throw_error("StepLimitError", "template exceeded " + std::to_string(limits_.max_steps) + " evaluation steps");
}

std::string Interpreter::render(const Body& body, const Value& context) {
  auto globals = std::make_shared<Frame>();
  for (auto& [k, v] : builtin_globals().items) globals->set(k.str(), v);
  auto ctx = child_frame(globals);
  if (context.is_dict())
    for (const auto& [k, v] : context.dict_data().items)
      if (k.is_string()) ctx->set(k.str(), v);
  auto top = child_frame(ctx);
  std::string out;
  std::vector<FramePtr> frames_with_macros;
  try {
    exec(body, top, out);
  } catch (...) {
    top->vars.clear();
    throw;
  }
  top->vars.clear();  // breaks macro <-> frame reference cycles
  return out;
}

namespace {
struct DepthScope {
  int& depth;
  DepthScope(int& d, int limit) : depth(d) {
    if (++depth > limit) {
      --depth;
      throw_error("RecursionError", "maximum recursion depth exceeded (template evaluation nested deeper than " +
                                        std::to_string(limit) + ")");
    }
  }
  ~DepthScope() { --depth; }
};
}  // namespace

Interpreter::Flow Interpreter::exec(const Body& body, const FramePtr& f, std::string& out) {
  DepthScope guard(eval_depth_, limits_.max_eval_depth);
  for (const auto& s : body) {
    Flow r = exec_stmt(*s, f, out);
    if (r != Flow::Normal) return r;
  }
  return Flow::Normal;
}

Value Interpreter::lookup(const std::string& name, const FramePtr& f) {
  for (Frame* fr = f.get(); fr; fr = fr->parent.get())
    if (Value* v = fr->find_local(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const Expr& target, const Value& v, const FramePtr& f) {
  if (target.kind == ExprKind::Name) {
    f->set(target.name, v);
    return;
  }
  if (target.kind == ExprKind::Getattr) {
    Value ns = lookup(target.children[0]->name, f);
    if (!ns.is_namespace()) throw_error("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    ns.namespace_data().set(Value(target.name), v);
    return;
  }
  // Tuple unpacking.
  std::vector<Value> items = iterate(v);
  size_t n = target.children.size();
  if (items.size() < n)
    throw_error("ValueError", "not enough values to unpack (expected " + std::to_string(n) + ", got " +
                                  std::to_string(items.size()) + ")");
  if (items.size() > n) throw_error("ValueError", "too many values to unpack (expected " + std::to_string(n) + ")");
  for (size_t i = 0; i < n; ++i) assign(*target.children[i], items[i], f);
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const FramePtr& f, std::string& out) {
  step();
  switch (s.kind) {
    case StmtKind::Data: append(out, s.text); return Flow::Normal;
    case StmtKind::Print: {
      const Value v = eval(*s.expr, f);
      // str() of a string is the string: appended without py_str's copy (message contents, the
      // system prompt).
      if (v.is_string()) append(out, v.str());
      else append(out, py_str(v));
      return Flow::Normal;
    }
    case StmtKind::If:
      for (const auto& [test, body] : s.branches)
        if (!test || truthy(eval(*test, f))) return exec(body, f, out);
      return Flow::Normal;
    case StmtKind::For: {
      Flow flow = Flow::Normal;
      exec_for(s, f, out, flow);
      return Flow::Normal;
    }
    case StmtKind::Set: assign(*s.target, eval(*s.expr, f), f); return Flow::Normal;
    case StmtKind::SetBlock: {
      std::string text;
      exec(s.body, child_frame(f), text);
      Value v(std::move(text));
      if (s.filter) {
        // The filter chain's innermost operand is the block's text.
        std::vector<const Expr*> chain;
        for (const Expr* e = s.filter.get(); e; e = e->children[0].get()) chain.push_back(e);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args = eval_args(**it, f, 1);
          v = filter((*it)->name, v, args);
        }
      }
      assign(*s.target, v, f);
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      std::string text;
      exec(s.body, child_frame(f), text);
      Value v(std::move(text));
      std::vector<const Expr*> chain;
      for (const Expr* e = s.filter.get(); e; e = e->children[0].get()) chain.push_back(e);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args = eval_args(**it, f, 1);
        v = filter((*it)->name, v, args);
      }
      append(out, py_str(v));
      return Flow::Normal;
    }
    case StmtKind::Macro: f->set(s.name, make_macro(s, f)); return Flow::Normal;
    case StmtKind::CallBlock: {
      Value caller = make_macro(s, f);
      const Expr& call = *s.expr;
      Value callee = eval(*call.children[0], f);
      CallArgs args = eval_args(call, f, 1);
      args.kwargs.emplace_back("caller", caller);
      append(out, py_str(this->call(callee, args)));
      return Flow::Normal;
    }
    case StmtKind::With: {
      auto w = child_frame(f);
      for (size_t i = 0; i < s.params.size(); ++i) w->set(s.params[i], eval(*s.defaults[i], f));
      return exec(s.body, w, out);
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
    case StmtKind::Generation: return exec(s.body, f, out);
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& s, const FramePtr& f, std::string& out, Flow& flow) {
  Value seq = eval(*s.expr, f);
  if (seq.is_undefined() && !seq.str().empty()) {
    // jinja2 iterates an undefined value as empty.
  }
  std::vector<Value> items = iterate(seq);
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      step();
      auto fr = child_frame(f);
      assign(*s.target, item, fr);
      if (truthy(eval(*s.filter, fr))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.else_body, child_frame(f), out);
    return;
  }
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  auto loop = std::make_shared<LoopData>();
  loop->items = data;
  loop->last_changed = std::make_shared<std::vector<Value>>();
  Value loop_value = Value::loop(loop);
  for (size_t i = 0; i < data->items.size(); ++i) {
    step();
    loop->index0 = i;
    auto fr = child_frame(f);
    assign(*s.target, data->items[i], fr);
    fr->set("loop", loop_value);
    Flow r = exec(s.body, fr, out);
    if (r == Flow::Break) break;
  }
  flow = Flow::Normal;
}

Value Interpreter::make_macro(const Stmt& s, const FramePtr& f, const Body* body_override) {
  auto it = macro_uses_.find(&s);
  if (it == macro_uses_.end()) {
    std::vector<bool> uses(3, false);
    scan_body(s.body, uses);
    it = macro_uses_.emplace(&s, uses).first;
  }
  std::vector<bool> uses = it->second;
  const Stmt* sp = &s;
  const Body* body = body_override ? body_override : &s.body;
  std::weak_ptr<Frame> defining = f;
  std::string name = s.kind == StmtKind::CallBlock ? "caller" : s.name;
  return Value::callable(
      name,
      [sp, body, defining, uses, name](Interpreter& in, CallArgs& args) -> Value {
        FramePtr parent = defining.lock();
        if (!parent) throw_error("TemplateRuntimeError", "macro '" + name + "' outlived the scope it was defined in");
        if (++in.call_depth_ > in.limits_.max_call_depth) {
          --in.call_depth_;
          throw_error("RecursionError", "maximum recursion depth exceeded (macro calls nested deeper than " +
                                            std::to_string(in.limits_.max_call_depth) + ")");
        }
        struct Depth {
          int& d;
          ~Depth() { --d; }
        } depth{in.call_depth_};
        auto fr = child_frame(parent);
        const auto& params = sp->params;
        size_t n = params.size();
        size_t first_default = n - sp->defaults.size();
        std::vector<bool> filled(n, false);
        std::vector<Value> extra_pos;
        for (size_t i = 0; i < args.args.size(); ++i) {
          if (i < n) {
            fr->set(params[i], args.args[i]);
            filled[i] = true;
          } else if (uses[0]) {
            extra_pos.push_back(args.args[i]);
          } else {
            type_error("macro '" + name + "' takes not more than " + std::to_string(n) + " argument(s)");
          }
        }
        DictData extra_kw;
        Value caller;
        for (auto& [k, v] : args.kwargs) {
          bool matched = false;
          for (size_t i = 0; i < n; ++i)
            if (params[i] == k) {
              if (filled[i]) type_error("macro '" + name + "' got multiple values for argument '" + k + "'");
              fr->set(k, v);
              filled[i] = true;
              matched = true;
            }
          if (matched) continue;
          if (k == "caller" && uses[2]) {
            caller = v;
            continue;
          }
          if (uses[1]) extra_kw.set(Value(k), v);
          else type_error("macro '" + name + "' takes no keyword argument '" + k + "'");
        }
        for (size_t i = 0; i < n; ++i) {
          if (filled[i]) continue;
          if (i >= first_default) fr->set(params[i], in.eval(*sp->defaults[i - first_default], fr));
          else fr->set(params[i], Value::undefined("parameter '" + params[i] + "' was not provided"));
        }
        if (uses[0]) fr->set("varargs", Value::list(std::move(extra_pos), true));
        if (uses[1]) fr->set("kwargs", Value::dict(std::move(extra_kw)));
        if (uses[2]) fr->set("caller", caller.is_undefined() ? Value::undefined("No caller defined") : caller);
        std::string text;
        in.exec(*body, fr, text);
        return Value(std::move(text));
      },
      CallableKind::Macro);
}

CallArgs Interpreter::eval_args(const Expr& e, const FramePtr& f, size_t first_arg) {
  CallArgs a;
  for (size_t i = first_arg; i < e.children.size(); ++i) a.args.push_back(eval(*e.children[i], f));
  if (e.star_args)
    for (auto& v : iterate(eval(*e.star_args, f))) a.args.push_back(v);
  for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v, f));
  if (e.star_kwargs) {
    Value d = eval(*e.star_kwargs, f);
    if (!d.is_dict()) type_error("argument after ** must be a mapping, not " + py_type_name(d));
    for (const auto& [k, v] : d.dict_data().items) a.kwargs.emplace_back(py_str(k), v);
  }
  return a;
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (!callee.is_callable()) type_error("'" + py_type_name(callee) + "' object is not callable");
  return callee.callable_data().fn(*this, args);
}

Value Interpreter::filter(const std::string& name, const Value& operand, CallArgs& args) {
  const auto& filters = builtin_filters();
  auto it = filters.find(name);
  if (it == filters.end()) throw_error("TemplateRuntimeError", "No filter named '" + name + "'.");
  return it->second(*this, operand, args);
}

bool Interpreter::test(const std::string& name, const Value& operand, CallArgs& args) {
  const auto& tests = builtin_tests();
  auto it = tests.find(name);
  if (it == tests.end()) throw_error("TemplateRuntimeError", "No test named '" + name + "'.");
  return it->second(*this, operand, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::Dict: {
      bool unsafe = false;
      if (auto m = builtin_method(obj, name, &unsafe)) return *m;
      if (unsafe)
        return Value::callable(name, [name](Interpreter&, CallArgs&) -> Value {
          throw_error("SecurityError", "access to attribute '" + name + "' of 'dict' object is unsafe.");
        });
      if (const Value* v = obj.dict_data().find(name)) return *v;
      break;
    }
    case Kind::Namespace:
      if (const Value* v = obj.namespace_data().find(name)) return *v;
      break;
    case Kind::Loop: {
      const LoopData& l = obj.loop_data();
      size_t len = l.items->items.size();
      if (name == "index0") return Value(static_cast<int64_t>(l.index0));
      if (name == "index") return Value(static_cast<int64_t>(l.index0 + 1));
      if (name == "revindex") return Value(static_cast<int64_t>(len - l.index0));
      if (name == "revindex0") return Value(static_cast<int64_t>(len - l.index0 - 1));
      if (name == "first") return Value(l.index0 == 0);
      if (name == "last") return Value(l.index0 + 1 == len);
      if (name == "length") return Value(static_cast<int64_t>(len));
      if (name == "depth") return Value(static_cast<int64_t>(l.depth0 + 1));
      if (name == "depth0") return Value(static_cast<int64_t>(l.depth0));
      if (name == "previtem")
        return l.index0 > 0 ? l.items->items[l.index0 - 1] : Value::undefined("there is no previous item");
      if (name == "nextitem")
        return l.index0 + 1 < len ? l.items->items[l.index0 + 1] : Value::undefined("there is no next item");
      if (name == "cycle") {
        size_t idx = l.index0;
        return Value::callable("cycle", [idx](Interpreter&, CallArgs& a) -> Value {
          if (a.args.empty()) type_error("no items for cycling given");
          return a.args[idx % a.args.size()];
        }, CallableKind::Method);
      }
      if (name == "changed") {
        auto mem = l.last_changed;
        return Value::callable("changed", [mem](Interpreter&, CallArgs& a) -> Value {
          bool same = mem->size() == a.args.size();
          for (size_t i = 0; same && i < a.args.size(); ++i) same = py_equal((*mem)[i], a.args[i]);
          if (same && !mem->empty()) return Value(false);
          if (same && mem->empty() && a.args.empty()) {
            // first call with no args: jinja2 compares against a sentinel, so it reports a change
          }
          *mem = a.args;
          return Value(true);
        }, CallableKind::Method);
      }
      break;
    }
    case Kind::String:
    case Kind::List: {
      bool unsafe = false;
      if (auto m = builtin_method(obj, name, &unsafe)) return *m;
      if (unsafe) {
        std::string tn = py_type_name(obj);
        return Value::callable(name, [name, tn](Interpreter&, CallArgs&) -> Value {
          throw_error("SecurityError", "access to attribute '" + name + "' of '" + tn + "' object is unsafe.");
        });
      }
      break;
    }
    default: break;
  }
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::Dict:
      if (const Value* v = obj.dict_data().find(key)) return *v;
      break;
    case Kind::List:
    case Kind::String: {
      if ((key.is_int() || key.is_bool()) && !obj.is_iterator()) {
        int64_t i = key.as_int();
        if (obj.is_list()) {
          int64_t n = static_cast<int64_t>(obj.items().size());
          int64_t j = i < 0 ? i + n : i;
          if (j >= 0 && j < n) return obj.items()[static_cast<size_t>(j)];
        } else {
          std::u32string u = utf8_decode(obj.str());
          int64_t n = static_cast<int64_t>(u.size());
          int64_t j = i < 0 ? i + n : i;
          if (j >= 0 && j < n) {
            std::string s;
            utf8_append(s, u[static_cast<size_t>(j)]);
            return Value(std::move(s), obj.is_markup());
          }
        }
      }
      break;
    }
    default: break;
  }
  if (key.is_string()) {
    // jinja2 falls back to attribute lookup for string subscripts (ns['x'], loop['index'], d['items']).
    Value v = getattr(obj, key.str());
    if (!v.is_undefined()) return v;
    return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + key.str() + "'");
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + py_repr(key));
}

Value Interpreter::slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto as_index = [](const Value& v, bool& present) -> int64_t {
    present = !(v.is_none() || (v.is_undefined() && v.str() == "\x01" "absent"));
    if (!present) return 0;
    if (v.is_int() || v.is_bool()) return v.as_int();
    type_error("slice indices must be integers or None or have an __index__ method");
  };
  // jinja2 compiles slices to a plain Python subscript, so non-sequences raise.
  if (obj.is_dict()) type_error("unhashable type: 'slice'");
  if (!obj.is_sequence_list() && !obj.is_string()) type_error("'" + py_type_name(obj) + "' object is not subscriptable");
  bool has_start, has_stop, has_step;
  int64_t step = as_index(step_v, has_step);
  if (!has_step) step = 1;
  if (step == 0) throw_error("ValueError", "slice step cannot be zero");
  std::u32string u;
  int64_t len;
  if (obj.is_string()) {
    u = utf8_decode(obj.str());
    len = static_cast<int64_t>(u.size());
  } else {
    len = static_cast<int64_t>(obj.items().size());
  }
  auto adjust = [&](int64_t v, bool present, bool is_start) -> int64_t {
    if (!present) return step < 0 ? (is_start ? len - 1 : -1) : (is_start ? 0 : len);
    if (v < 0) {
      v += len;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= len) {
      v = step < 0 ? len - 1 : len;
    }
    return v;
  };
  int64_t start_raw = as_index(start_v, has_start);
  int64_t stop_raw = as_index(stop_v, has_stop);
  int64_t start = adjust(start_raw, has_start, true);
  int64_t stop = adjust(stop_raw, has_stop, false);
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  else
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  if (obj.is_string()) {
    std::u32string r;
    for (int64_t i : idx) r.push_back(u[static_cast<size_t>(i)]);
    return Value(utf8_encode(r), obj.is_markup());
  }
  std::vector<Value> r;
  r.reserve(idx.size());
  for (int64_t i : idx) r.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(r), obj.is_tuple());
}

Value Interpreter::binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto unsupported = [&]() {
    type_error("unsupported operand type(s) for " + op + ": '" + py_type_name(a) + "' and '" + py_type_name(b) + "'");
  };
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) overflow();
      return Value(r);
    }
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      // markupsafe: adding to Markup escapes the plain operand.
      if (a.is_markup() != b.is_markup()) {
        std::string r = a.is_markup() ? a.str() + html_escape(b.str()) : html_escape(a.str()) + b.str();
        check_size(r.size());
        return Value(std::move(r), true);
      }
      check_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str(), a.is_markup());
    }
    if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
      // Items are copied, strings with them: all of it counts towards the render's budget.
      size_t bytes = (a.items().size() + b.items().size()) * sizeof(Value);
      for (const Value* l : {&a, &b})
        for (const Value& v : l->items())
          if (v.is_string()) bytes += v.str().size();
      check_size(bytes);
      std::vector<Value> r = a.items();
      r.insert(r.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(r), a.is_tuple());
    }
    if (a.is_string() || a.is_sequence_list())
      type_error("can only concatenate " + py_type_name(a) + " (not \"" + py_type_name(b) + "\") to " + py_type_name(a));
    unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) overflow();
      return Value(r);
    }
    if (nums) return Value(a.as_double() - b.as_double());
    unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) overflow();
      return Value(r);
    }
    if (nums) return Value(a.as_double() * b.as_double());
    const Value* seq = nullptr;
    const Value* times = nullptr;
    if ((a.is_string() || a.is_sequence_list()) && (b.is_int() || b.is_bool())) { seq = &a; times = &b; }
    if ((b.is_string() || b.is_sequence_list()) && (a.is_int() || a.is_bool())) { seq = &b; times = &a; }
    if (seq) {
      // The size is checked before any work: an empty sequence repeated 10**15 times is empty at
      // once, a non-empty one past the limit fails without looping.
      const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(0, times->as_int()));
      const uint64_t unit = seq->is_string() ? seq->str().size() : seq->items().size() * sizeof(Value);
      if (unit == 0 || n == 0) return seq->is_string() ? Value(std::string(), seq->is_markup()) : Value::list({}, seq->is_tuple());
      if (n > limits_.max_output_bytes / unit + 1) check_size(limits_.max_output_bytes + 1);
      check_size(static_cast<size_t>(unit * n));
      if (seq->is_string()) {
        std::string r;
        r.reserve(static_cast<size_t>(unit * n));
        for (uint64_t i = 0; i < n; ++i) r += seq->str();
        return Value(std::move(r), seq->is_markup());
      }
      std::vector<Value> r;
      r.reserve(static_cast<size_t>(seq->items().size() * n));
      for (uint64_t i = 0; i < n; ++i) r.insert(r.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(r), seq->is_tuple());
    }
    if (a.is_string() || a.is_sequence_list()) type_error("can't multiply sequence by non-int of type '" + py_type_name(b) + "'");
    if (b.is_string() || b.is_sequence_list()) type_error("can't multiply sequence by non-int of type '" + py_type_name(a) + "'");
    unsupported();
  }
  if (op == "/") {
    if (!nums) unsupported();
    if (b.as_double() == 0.0) throw_error("ZeroDivisionError", ints ? "division by zero" : "float division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!nums) unsupported();
    if (ints) {
      if (b.as_int() == 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
      if (a.as_int() == INT64_MIN && b.as_int() == -1) overflow();
      return Value(floor_div(a.as_int(), b.as_int()));
    }
    if (b.as_double() == 0.0) throw_error("ZeroDivisionError", "float floor division by zero");
    return Value(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (a.is_string()) {
      std::string r = percent_format(a.str(), b);
      check_size(r.size());
      return Value(std::move(r));
    }
    if (!nums) unsupported();
    if (ints) {
      if (b.as_int() == 0) throw_error("ZeroDivisionError", "integer modulo by zero");
      if (b.as_int() == -1) return Value(static_cast<int64_t>(0));
      int64_t r = a.as_int() % b.as_int();
      if (r != 0 && ((r < 0) != (b.as_int() < 0))) r += b.as_int();
      return Value(r);
    }
    double y = b.as_double();
    if (y == 0.0) throw_error("ZeroDivisionError", "float modulo");
    double r = std::fmod(a.as_double(), y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    else if (r == 0) r = std::copysign(0.0, y);
    return Value(r);
  }
  if (op == "**") {
    if (!nums) unsupported();
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), r = 1;
      while (e > 0) {
        if (e & 1)
          if (__builtin_mul_overflow(r, base, &r)) overflow();
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base)) overflow();
      }
      return Value(r);
    }
    if (a.as_double() == 0.0 && b.as_double() < 0)
      throw_error("ZeroDivisionError", "0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  unsupported();
  return Value();  // unreachable: unsupported() throws
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") check_orderable(a, b, op.c_str());
  if (op == "<") return py_less(a, b, "<");
  if (op == ">") return py_less(b, a, ">");
  if (op == "<=") return py_less(a, b, "<=") || py_equal(a, b);
  if (op == ">=") return py_less(b, a, ">=") || py_equal(a, b);
  bool negate = op == "notin";
  // `a in b`
  bool found = false;
  switch (b.kind()) {
    case Kind::Undefined: found = false; break;
    case Kind::String:
      if (!a.is_string()) type_error("'in <string>' requires string as left operand, not " + py_type_name(a));
      found = b.str().find(a.str()) != std::string::npos;
      break;
    case Kind::List:
      for (const auto& x : iterate(b))
        if (py_equal(x, a)) { found = true; break; }
      break;
    case Kind::Dict: found = b.dict_data().find(a) != nullptr; break;
    case Kind::Loop:
      for (const auto& x : b.loop_data().items->items)
        if (py_equal(x, a)) { found = true; break; }
      break;
    default: type_error("argument of type '" + py_type_name(b) + "' is not iterable");
  }
  return negate ? !found : found;
}

Value Interpreter::eval_call(const Expr& e, const FramePtr& f) {
  Value callee = eval(*e.children[0], f);
  CallArgs args = eval_args(e, f, 1);
  return call(callee, args);
}

Value Interpreter::eval(const Expr& e, const FramePtr& f) {
  DepthScope guard(eval_depth_, limits_.max_eval_depth);
  switch (e.kind) {
    case ExprKind::Const: return e.value;
    case ExprKind::Name: return lookup(e.name, f);
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c, f));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      DictData d;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i], f);
        if (k.is_list() && !k.is_tuple()) type_error("unhashable type: 'list'");
        if (k.is_dict()) type_error("unhashable type: 'dict'");
        d.set(std::move(k), eval(*e.children[i + 1], f));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::Getattr: return getattr(eval(*e.children[0], f), e.name);
    case ExprKind::Getitem: return getitem(eval(*e.children[0], f), eval(*e.children[1], f));
    case ExprKind::Slice: {
      Value obj = eval(*e.children[0], f);
      Value absent = Value::undefined("\x01" "absent");
      Value start = e.children[1] ? eval(*e.children[1], f) : absent;
      Value stop = e.children[2] ? eval(*e.children[2], f) : absent;
      Value stp = e.children[3] ? eval(*e.children[3], f) : absent;
      for (const Value* v : {&start, &stop, &stp})
        if (v->is_undefined() && v->str() != "\x01" "absent")
          type_error("slice indices must be integers or None or have an __index__ method");
      return slice(obj, start, stop, stp);
    }
    case ExprKind::Call: return eval_call(e, f);
    case ExprKind::Filter: {
      Value operand = e.children[0] ? eval(*e.children[0], f) : Value();
      CallArgs args = eval_args(e, f, 1);
      return filter(e.name, operand, args);
    }
    case ExprKind::Test: {
      Value operand = eval(*e.children[0], f);
      CallArgs args = eval_args(e, f, 1);
      bool r = test(e.name, operand, args);
      return Value(e.negated ? !r : r);
    }
    case ExprKind::Unary: {
      Value v = eval(*e.children[0], f);
      if (e.name == "not") return Value(!truthy(v));
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) type_error("bad operand type for unary " + e.name + ": '" + py_type_name(v) + "'");
      if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == INT64_MIN) overflow();
      return Value(-v.as_int());
    }
    case ExprKind::Binary: {
      if (e.name == "and") {
        Value l = eval(*e.children[0], f);
        return truthy(l) ? eval(*e.children[1], f) : l;
      }
      if (e.name == "or") {
        Value l = eval(*e.children[0], f);
        return truthy(l) ? l : eval(*e.children[1], f);
      }
      Value l = eval(*e.children[0], f);
      Value r = eval(*e.children[1], f);
      return binary(e.name, l, r);
    }
    case ExprKind::Compare: {
      Value left = eval(*e.children[0], f);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.children[i + 1], f);
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::CondExpr: {
      if (truthy(eval(*e.children[0], f))) return eval(*e.children[1], f);
      if (e.children[2]) return eval(*e.children[2], f);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
    case ExprKind::Concat: {
      std::string s;
      for (const auto& c : e.children) {
        s += py_str(eval(*c, f));
        check_size(s.size());
      }
      return Value(std::move(s));
    }
  }
  return Value();
}

}  // namespace sparkserve::jinja
