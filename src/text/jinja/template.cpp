#include "text/jinja/template.h"

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/parser.h"

namespace sparkserve::jinja {

namespace {
Error to_error(const JinjaError& e) {
  if (e.kind() == "TemplateError") return make_error(e.what());
  if (e.kind() == "TemplateSyntaxError") return make_error(std::string("template syntax error: ") + e.what());
  return make_error(e.kind() + ": " + e.what());
}
}  // namespace

Expected<Template> Template::parse(const std::string& source, const TemplateOptions& options) {
  try {
    auto tokens = tokenize(source, options.lex);
    ParseOptions po;
    po.has_filter = [](const std::string& n) { return builtin_filters().count(n) > 0; };
    po.has_test = [](const std::string& n) { return builtin_tests().count(n) > 0; };
    Template t;
    t.body_ = std::make_shared<const Body>(parse_template(tokens, po));
    t.options_ = options;
    return t;
  } catch (const JinjaError& e) {
    return to_error(e);
  }
}

Expected<std::string> Template::render(const OrderedJson& context) const {
  if (!context.is_object()) return make_error("template context must be a JSON object");
  try {
    return render(Value::from_json(context));
  } catch (const JinjaError& e) {
    return to_error(e);
  }
}

Expected<std::string> Template::render(const Value& context) const {
  if (!body_) return make_error("template was not parsed");
  try {
    Interpreter interp(options_.limits);
    return interp.render(*body_, context);
  } catch (const JinjaError& e) {
    return to_error(e);
  } catch (const std::bad_alloc&) {
    return make_error("MemoryError: template rendering ran out of memory");
  }
}

}  // namespace sparkserve::jinja
