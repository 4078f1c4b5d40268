#include "text/jinja/parser.h"

#include <algorithm>

#include "text/jinja/error.h"

namespace sparkserve::jinja {

namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Name: case Tok::Op: return "'" + t.text + "'";
    case Tok::String: return "string";
    case Tok::Int: case Tok::Float: return "'" + t.text + "'";
    default: return token_type_name(t.type);
  }
}

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const ParseOptions& opt) : t_(toks), opt_(opt) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) fail(cur(), "unexpected " + describe(cur()));
    return body;
  }

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  const Token& next() { return t_[pos_ < t_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const Token& at, const std::string& msg) const {
    throw_error("TemplateSyntaxError",
                "line " + std::to_string(at.line) + ", column " + std::to_string(at.column) + ": " + msg);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur(), std::string("expected token '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(cur(), "expected token 'name', got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail(cur(), "expected token 'end of statement block', got " + describe(cur()));
    next();
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.opt_.max_nesting) p.fail(p.cur(), "template nesting too deep");
    }
    ~DepthGuard() { --p.depth_; }
  };

  ExprPtr node(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  // Records the subtree height; left-leaning chains (1 + 1 + ..., x|f|f|..., a.b.c...) are built
  // by loops, not recursion, so the nesting guard alone would not bound them.
  ExprPtr finish(ExprPtr e) {
    int d = 0;
    for (const auto& c : e->children)
      if (c) d = std::max(d, c->depth);
    for (const auto& [k, c] : e->kwargs) d = std::max(d, c->depth);
    if (e->star_args) d = std::max(d, e->star_args->depth);
    if (e->star_kwargs) d = std::max(d, e->star_kwargs->depth);
    e->depth = d + 1;
    if (e->depth > opt_.max_nesting) {
      Token at;
      at.line = e->line;
      at.column = e->column;
      fail(at, "expression nested too deeply");
    }
    return e;
  }

  StmtPtr stmt(StmtKind k, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // ---- statements --------------------------------------------------------------------------
  // Parses until a block tag whose name is in `end_tags` (left unconsumed, positioned on the
  // name) or the end of the template.
  Body subparse(const std::vector<std::string>& end_tags) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!end_tags.empty()) {
          std::string want;
          for (size_t i = 0; i < end_tags.size(); ++i) want += (i ? " or '" : "'") + end_tags[i] + "'";
          fail(t, "Unexpected end of template. Jinja was looking for the following tags: " + want + ".");
        }
        return body;
      }
      if (t.type == Tok::Data) {
        auto s = stmt(StmtKind::Data, t);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = stmt(StmtKind::Print, t);
        s->expr = parse_tuple(true, {});
        if (cur().type != Tok::VarEnd) fail(cur(), "expected token 'end of print statement', got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) fail(cur(), "tag name expected");
        if (std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) return body;
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  // Consumes `{% name %}` ending a block, where the BlockBegin was already consumed by subparse.
  void end_block(const char* name) {
    if (!skip_name(name)) fail(cur(), std::string("expected '") + name + "'");
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    const std::string& tag = t.text;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "call") return parse_call_block();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") {
      next();
      expect_block_end();
      auto s = stmt(StmtKind::Generation, t);
      s->body = subparse({"endgeneration"});
      end_block("endgeneration");
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(t, "'" + tag + "' outside of a loop");  // jinja2 checks at compile time
      auto s = stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, t);
      next();
      expect_block_end();
      return s;
    }
    fail(t, "Encountered unknown tag '" + tag + "'.");
  }

  StmtPtr parse_if() {
    auto s = stmt(StmtKind::If, cur());
    next();
    ExprPtr test = parse_tuple(false, {});
    expect_block_end();
    while (true) {
      Body body = subparse({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(test), std::move(body));
      std::string tag = next().text;
      if (tag == "elif") {
        test = parse_tuple(false, {});
        expect_block_end();
        continue;
      }
      if (tag == "else") {
        expect_block_end();
        Body eb = subparse({"endif"});
        s->branches.emplace_back(nullptr, std::move(eb));
        next();
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for() {
    auto s = stmt(StmtKind::For, cur());
    next();
    s->target = parse_assign_target(true, {"in"});
    if (!skip_name("in")) fail(cur(), "expected token 'in', got " + describe(cur()));
    s->expr = parse_tuple(false, {"recursive"});
    if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
    if (skip_name("if")) s->filter = parse_expression(true);
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in a for-else refer to no loop of this for
      s->else_body = subparse({"endfor"});
      loop_depth_ = saved;
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set() {
    const Token& at = cur();
    next();
    ExprPtr target = parse_assign_target(true, {}, true);
    if (skip_op("=")) {
      auto s = stmt(StmtKind::Set, at);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {});
      expect_block_end();
      return s;
    }
    auto s = stmt(StmtKind::SetBlock, at);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    s->body = subparse({"endset"});
    end_block("endset");
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      if (skip_op("=")) s.defaults.push_back(parse_expression(true));
      else if (!s.defaults.empty()) fail(cur(), "non-default argument follows default argument");
      s.params.push_back(name);
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    auto s = stmt(StmtKind::Macro, cur());
    next();
    s->name = expect_name();
    parse_signature(*s);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved;
    end_block("endmacro");
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = stmt(StmtKind::CallBlock, cur());
    next();
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::Call) fail(cur(), "expected call");
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endcall"});
    loop_depth_ = saved;
    end_block("endcall");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = stmt(StmtKind::FilterBlock, cur());
    next();
    s->filter = parse_filter_chain(nullptr, true);
    expect_block_end();
    s->body = subparse({"endfilter"});
    end_block("endfilter");
    return s;
  }

  StmtPtr parse_with() {
    auto s = stmt(StmtKind::With, cur());
    next();
    while (cur().type != Tok::BlockEnd) {
      if (!s->params.empty()) expect_op(",");
      ExprPtr target = parse_assign_target(false, {});
      if (target->kind != ExprKind::Name) fail(cur(), "with only assigns plain names");
      s->params.push_back(target->name);
      expect_op("=");
      s->defaults.push_back(parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    end_block("endwith");
    return s;
  }

  // name | name.attr (set only) | tuple of names.
  ExprPtr parse_assign_target(bool with_tuple, const std::vector<std::string>& extra_end, bool allow_ns = false) {
    const Token& at = cur();
    if (allow_ns && cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      auto obj = node(ExprKind::Name, at);
      obj->name = next().text;
      next();
      auto e = node(ExprKind::Getattr, at);
      e->children.push_back(std::move(obj));
      e->name = expect_name();
      return e;
    }
    auto one = [&]() {
      auto n = node(ExprKind::Name, cur());
      std::string nm = expect_name();
      if (nm == "true" || nm == "false" || nm == "none" || nm == "True" || nm == "False" || nm == "None")
        fail(at, "Can't assign to '" + nm + "'");
      n->name = nm;
      return n;
    };
    if (!with_tuple) return one();
    bool paren = skip_op("(");
    auto tup = node(ExprKind::Tuple, at);
    bool comma = false;
    while (true) {
      if (!tup->children.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (cur().type != Tok::Name || is_end(extra_end)) {
        if (tup->children.empty()) fail(cur(), "expected token 'name', got " + describe(cur()));
        break;
      }
      tup->children.push_back(one());
    }
    if (paren) expect_op(")");
    if (!comma && !paren && tup->children.size() == 1) return std::move(tup->children[0]);
    if (paren && !comma && tup->children.size() == 1) return std::move(tup->children[0]);
    return tup;
  }

  // ---- expressions ---------------------------------------------------------------------------
  bool is_end(const std::vector<std::string>& extra) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.type == Tok::Eof) return true;
    if (t.type == Tok::Op && (t.text == ")")) return true;
    if (t.type == Tok::Name) return std::find(extra.begin(), extra.end(), t.text) != extra.end();
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_paren = false) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (is_end(extra_end)) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (!comma) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_paren) fail(cur(), "Expected an expression, got " + describe(cur()));
    }
    auto t = node(ExprKind::Tuple, at);
    t->children = std::move(items);
    return finish(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    if (!with_condexpr) return parse_or();
    const Token& at = cur();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      next();
      auto c = node(ExprKind::CondExpr, at);
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      if (skip_name("else")) c->children.push_back(parse_expression(true));
      else c->children.push_back(nullptr);
      e = finish(std::move(c));
    }
    return e;
  }

  ExprPtr binary(const char* op, ExprPtr l, ExprPtr r, const Token& at) {
    auto b = node(ExprKind::Binary, at);
    b->name = op;
    b->children.push_back(std::move(l));
    b->children.push_back(std::move(r));
    return finish(std::move(b));
  }

  ExprPtr parse_or() {
    const Token& at = cur();
    ExprPtr l = parse_and();
    while (skip_name("or")) l = binary("or", std::move(l), parse_and(), at);
    return l;
  }
  ExprPtr parse_and() {
    const Token& at = cur();
    ExprPtr l = parse_not();
    while (skip_name("and")) l = binary("and", std::move(l), parse_not(), at);
    return l;
  }
  ExprPtr parse_not() {
    DepthGuard g(*this);
    const Token& at = cur();
    if (skip_name("not")) {
      auto u = node(ExprKind::Unary, at);
      u->name = "not";
      u->children.push_back(parse_not());
      return finish(std::move(u));
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        ops.push_back(next().text);
      } else if (skip_name("in")) {
        ops.push_back("in");
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto c = node(ExprKind::Compare, at);
    c->children.push_back(std::move(first));
    for (auto& r : rest) c->children.push_back(std::move(r));
    c->ops = std::move(ops);
    return finish(std::move(c));
  }
  ExprPtr parse_math1() {
    const Token& at = cur();
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      l = binary(op == "+" ? "+" : "-", std::move(l), parse_concat(), at);
    }
    return l;
  }
  ExprPtr parse_concat() {
    const Token& at = cur();
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto c = node(ExprKind::Concat, at);
    c->children.push_back(std::move(first));
    while (skip_op("~")) c->children.push_back(parse_math2());
    return finish(std::move(c));
  }
  ExprPtr parse_math2() {
    const Token& at = cur();
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      auto b = binary("", std::move(l), parse_pow(), at);
      b->name = op;
      l = std::move(b);
    }
    return l;
  }
  ExprPtr parse_pow() {
    const Token& at = cur();
    ExprPtr l = parse_unary(true);
    while (skip_op("**")) l = binary("**", std::move(l), parse_unary(true), at);
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    const Token& at = cur();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      std::string op = next().text;
      e = node(ExprKind::Unary, at);
      e->name = op;
      e->children.push_back(parse_unary(false));
      e = finish(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.type == Tok::Name) {
      next();
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        auto c = node(ExprKind::Const, t);
        c->value = Value(t.text[0] == 't' || t.text[0] == 'T');
        return c;
      }
      if (t.text == "none" || t.text == "None") {
        auto c = node(ExprKind::Const, t);
        c->value = Value::none();
        return c;
      }
      auto n = node(ExprKind::Name, t);
      n->name = t.text;
      return n;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
      auto c = node(ExprKind::Const, t);
      c->value = Value(std::move(s));
      return c;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      next();
      auto c = node(ExprKind::Const, t);
      c->value = t.type == Tok::Int ? Value(t.int_value) : Value(t.float_value);
      return c;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto l = node(ExprKind::List, t);
      while (!is_op("]")) {
        if (!l->children.empty()) expect_op(",");
        if (is_op("]")) break;
        l->children.push_back(parse_expression(true));
      }
      expect_op("]");
      return finish(std::move(l));
    }
    if (skip_op("{")) {
      auto d = node(ExprKind::Dict, t);
      while (!is_op("}")) {
        if (!d->children.empty()) expect_op(",");
        if (is_op("}")) break;
        d->children.push_back(parse_expression(true));
        expect_op(":");
        d->children.push_back(parse_expression(true));
      }
      expect_op("}");
      return finish(std::move(d));
    }
    fail(t, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& at = cur();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          auto g = node(ExprKind::Getattr, at);
          g->children.push_back(std::move(e));
          g->name = next().text;
          e = finish(std::move(g));
        } else if (cur().type == Tok::Int) {
          auto g = node(ExprKind::Getitem, at);
          g->children.push_back(std::move(e));
          auto k = node(ExprKind::Const, cur());
          k->value = Value(next().int_value);
          g->children.push_back(std::move(k));
          e = finish(std::move(g));
        } else {
          fail(cur(), "expected name or number");
        }
      } else if (is_op("[")) {
        next();
        e = finish(parse_subscript(std::move(e), at));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, const Token& at) {
    std::vector<ExprPtr> keys;
    while (!is_op("]")) {
      if (!keys.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      keys.push_back(parse_subscribed());
    }
    expect_op("]");
    if (keys.empty()) fail(at, "expected subscript expression");
    if (keys.size() == 1 && keys[0]->kind == ExprKind::Slice) {
      keys[0]->children[0] = std::move(obj);
      return std::move(keys[0]);
    }
    auto g = node(ExprKind::Getitem, at);
    g->children.push_back(std::move(obj));
    if (keys.size() == 1) {
      g->children.push_back(std::move(keys[0]));
    } else {
      auto tup = node(ExprKind::Tuple, at);
      for (auto& k : keys) {
        if (k->kind == ExprKind::Slice) fail(at, "slices inside tuple subscripts are not supported");
        tup->children.push_back(std::move(k));
      }
      g->children.push_back(std::move(tup));
    }
    return g;
  }

  ExprPtr parse_subscribed() {
    const Token& at = cur();
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto s = node(ExprKind::Slice, at);
    s->children.push_back(nullptr);  // object, filled in by the caller
    s->children.push_back(std::move(start));
    ExprPtr stop, step;
    if (!is_op("]") && !is_op(",") && !is_op(":")) stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) step = parse_expression(true);
    }
    s->children.push_back(std::move(stop));
    s->children.push_back(std::move(step));
    return s;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (skip_op("**")) {
        call.star_kwargs = parse_expression(true);
      } else if (skip_op("*")) {
        call.star_args = parse_expression(true);
      } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = next().text;
        next();
        call.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!call.kwargs.empty() || call.star_kwargs) fail(cur(), "positional argument follows keyword argument");
        call.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(ExprKind::Call, cur());
    c->children.push_back(std::move(callee));
    parse_call_args(*c);
    return finish(std::move(c));
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      name += "." + next().text;
    }
    return name;
  }

  // `| name(args) | name ...`; with `first_without_pipe` the leading `|` is absent ({% filter %}).
  ExprPtr parse_filter_chain(ExprPtr operand, bool first_without_pipe = false) {
    while (first_without_pipe || is_op("|")) {
      if (!first_without_pipe) next();
      first_without_pipe = false;
      const Token& at = cur();
      auto f = node(ExprKind::Filter, at);
      f->name = dotted_name();
      if (opt_.has_filter && !opt_.has_filter(f->name)) fail(at, "No filter named '" + f->name + "'.");
      f->children.push_back(std::move(operand));
      if (is_op("(")) parse_call_args(*f);
      operand = finish(std::move(f));
    }
    return operand;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        const Token& at = next();
        auto t = node(ExprKind::Test, at);
        t->negated = skip_name("not");
        const Token& name_at = cur();
        t->name = dotted_name();
        if (opt_.has_test && !opt_.has_test(t->name)) fail(name_at, "No test named '" + t->name + "'.");
        t->children.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur(), "You cannot chain multiple tests with is");
          t->children.push_back(parse_postfix(parse_primary()));
        }
        e = finish(std::move(t));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const ParseOptions& opt_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens, const ParseOptions& options) {
  return Parser(tokens, options).parse_all();
}

}  // namespace sparkserve::jinja
