// Public entry point of the Jinja engine: parse once, render many times. Semantics are those of
// Python jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]) as transformers configures it for chat templates (its `tojson`,
// `raise_exception`, `strftime_now`, and the `{% generation %}` tag).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/jinja/lexer.h"
#include "text/py_json.h"

namespace sparkserve::jinja {

struct TemplateOptions {
  LexOptions lex;
  RenderLimits limits;
};

class Template {
 public:
  // Fails with "template syntax error: line L, column C: <what was expected>".
  static Expected<Template> parse(const std::string& source, const TemplateOptions& options = {});

  // `context` must be a JSON object; its entries become template variables. A template that
  // calls raise_exception(msg) fails with exactly msg; other failures are "<Kind>: <message>"
  // (UndefinedError, TypeError, ... as jinja2 names them).
  Expected<std::string> render(const OrderedJson& context) const;
  Expected<std::string> render(const Value& context) const;

 private:
  std::shared_ptr<const Body> body_;
  TemplateOptions options_;
};

}  // namespace sparkserve::jinja
