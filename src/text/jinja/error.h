// The one error type inside the Jinja engine. Evaluation is deeply recursive, so errors unwind as
// an exception and are turned into Status/Expected at the public boundary (template.h).
#pragma once

#include <stdexcept>
#include <string>

namespace sparkserve::jinja {

// `kind` mirrors the Python exception class jinja2 would raise (TemplateError for
// raise_exception, UndefinedError, TypeError, TemplateSyntaxError, SecurityError, ...), so callers
// can tell a template's own refusal from a bug in the template.
class JinjaError : public std::runtime_error {
 public:
  JinjaError(std::string kind, const std::string& message)
      : std::runtime_error(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

[[noreturn]] inline void throw_error(const std::string& kind, const std::string& message) {
  throw JinjaError(kind, message);
}
[[noreturn]] inline void type_error(const std::string& message) { throw_error("TypeError", message); }

}  // namespace sparkserve::jinja
