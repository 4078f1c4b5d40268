// Walks the syntax tree and renders output, with jinja2's scoping: a for loop's body gets a fresh
// scope on every iteration, if-blocks do not scope, macros see the scope they were defined in.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace sparkserve::jinja {

struct RenderLimits {
  size_t max_output_bytes = 32u << 20;   // any string the template builds, and the output
  uint64_t max_built_bytes = 128u << 20; // all strings and lists built in one render, added up
  int max_call_depth = 100;              // nested macro calls
  int max_eval_depth = 1500;             // nested evaluation frames of any kind (stack safety)
  uint64_t max_steps = 500'000;          // statements + loop iterations (~0.4 s on this 2-core machine)
};

struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;
  Value* find_local(const std::string& name);
  void set(const std::string& name, Value v);
};
using FramePtr = std::shared_ptr<Frame>;

class Interpreter {
 public:
  explicit Interpreter(RenderLimits limits) : limits_(limits) {}

  // Renders `body` with `context` (a dict value) layered over the built-in globals.
  std::string render(const Body& body, const Value& context);

  Value eval(const Expr& e, const FramePtr& f);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& callee, CallArgs& args);
  Value filter(const std::string& name, const Value& operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  // Checks a string the template built against the output limit.
  void check_size(size_t bytes) const;
  const RenderLimits& limits() const { return limits_; }

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const FramePtr& f, std::string& out);
  Flow exec_stmt(const Stmt& s, const FramePtr& f, std::string& out);
  void exec_for(const Stmt& s, const FramePtr& f, std::string& out, Flow& flow);
  void assign(const Expr& target, const Value& v, const FramePtr& f);
  Value lookup(const std::string& name, const FramePtr& f);
  Value make_macro(const Stmt& s, const FramePtr& f, const Body* body_override = nullptr);
  Value eval_call(const Expr& e, const FramePtr& f);
  CallArgs eval_args(const Expr& e, const FramePtr& f, size_t first_arg);
  Value binary(const std::string& op, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  void append(std::string& out, const std::string& s) const;
  void step();

  RenderLimits limits_;
  uint64_t steps_ = 0;
  mutable uint64_t built_bytes_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  std::unordered_map<const Stmt*, std::vector<bool>> macro_uses_;  // varargs, kwargs, caller
};

}  // namespace sparkserve::jinja
