// Syntax tree of a parsed template. Nodes are plain structs owned through unique_ptr; the
// interpreter walks them directly.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace sparkserve::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Const,     // value
  Name,      // name
  List,      // children
  Tuple,     // children
  Dict,      // children = k0, v0, k1, v1, ...
  Getattr,   // children[0].name
  Getitem,   // children[0][children[1]]
  Slice,     // children[0][children[1]:children[2]:children[3]] (null parts allowed)
  Call,      // children[0](children[1..], kwargs)
  Filter,    // children[0] | name(children[1..], kwargs); children[0] null inside {% filter %}
  Test,      // children[0] is [not] name(children[1..], kwargs)
  Unary,     // name in {"not", "-", "+"}, children[0]
  Binary,    // name in {"+", "-", "*", "/", "//", "%", "**", "and", "or"}
  Compare,   // children[0] ops[0] children[1] ops[1] children[2] ...
  CondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
  Concat,    // children joined with ~
};

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  ExprPtr star_args;    // *args in a call
  ExprPtr star_kwargs;  // **kwargs in a call
  bool negated = false;
  int depth = 1;  // height of this subtree; bounded so evaluation and destruction cannot overflow the stack
};

enum class StmtKind {
  Data,         // text
  Print,        // expr
  If,           // branches (test, body); a null test is the else branch
  For,          // target in expr [if filter]: body, else_body
  Set,          // target = expr
  SetBlock,     // target = rendered body, piped through filter (Filter chain with null operand)
  Macro,        // name(params = defaults): body
  CallBlock,    // {% call(params) expr %} body: `caller` in expr's macro renders body
  FilterBlock,  // body rendered, then piped through filter
  With,         // targets/values (as params/defaults) then body
  Break,
  Continue,
  Generation,   // transformers' {% generation %}: renders its body
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
};

}  // namespace sparkserve::jinja
