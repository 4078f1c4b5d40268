// Builds the syntax tree from tokens, with jinja2's grammar and operator precedence.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace sparkserve::jinja {

struct ParseOptions {
  // Unknown filter / test names are rejected at parse time, as jinja2 does at compile time.
  std::function<bool(const std::string&)> has_filter;
  std::function<bool(const std::string&)> has_test;
  int max_nesting = 200;  // bounds recursion on hostile input
};

// Throws JinjaError("TemplateSyntaxError", "line L, column C: ...").
Body parse_template(const std::vector<Token>& tokens, const ParseOptions& options);

}  // namespace sparkserve::jinja
