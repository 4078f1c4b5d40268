#include "server/structured_request.h"

#include "text/json_schema_compiler.h"

namespace sparkserve {
namespace {

std::optional<ApiError> set_once(StructuredOutput& out, std::shared_ptr<const JsonGrammar> g, const std::string& param) {
  if (out.grammar)
    return bad_request("`" + param + "` cannot be combined with `" + out.param + "`: send one structured-output option.",
                       param);
  out.grammar = std::move(g);
  out.param = param;
  return std::nullopt;
}

std::optional<ApiError> read_choice(const RequestJson& v, const std::string& param, StructuredOutput& out) {
  if (!v.is_array() || v.empty()) return bad_request("`" + param + "` must be a non-empty list of strings.", param);
  std::vector<std::string> choices;
  for (const auto& c : v) {
    if (!c.is_string()) return bad_request("`" + param + "` must be a non-empty list of strings.", param);
    choices.push_back(c.get<std::string>());
  }
  auto g = choice_grammar(choices);
  if (!g.ok()) return bad_request("`" + param + "`: " + g.message(), param);
  return set_once(out, *g, param);
}

std::optional<ApiError> read_regex(const RequestJson& v, const std::string& param, StructuredOutput& out) {
  if (!v.is_string()) return bad_request("`" + param + "` must be a string (a regular expression).", param);
  auto g = regex_grammar(v.get<std::string>());
  if (!g.ok()) return bad_request("`" + param + "`: " + g.message(), param);
  return set_once(out, *g, param);
}

}  // namespace

std::optional<ApiError> compile_schema_field(const RequestJson& schema, const std::string& param, StructuredOutput& out) {
  OrderedJson s;
  if (schema.is_string()) {  // vLLM accepts the schema as JSON text too
    try {
      s = OrderedJson::parse(schema.get<std::string>());
    } catch (const std::exception& e) {
      return bad_request("`" + param + "` is a string but not JSON: " + e.what(), param);
    }
  } else if (schema.is_object() || schema.is_boolean()) {
    s = schema;
  } else {
    return bad_request("`" + param + "` must be a JSON Schema object.", param);
  }
  auto g = compile_json_schema(s);
  if (!g.ok()) return bad_request("`" + param + "`: " + g.message(), param);
  return set_once(out, *g, param);
}

std::optional<ApiError> read_structured_output(FieldReader& r, StructuredOutput& out) {
  if (const RequestJson* rf = r.raw("response_format")) {
    if (!rf->is_object()) return bad_request("`response_format` must be an object.", "response_format");
    auto t = rf->find("type");
    if (t == rf->end() || !t->is_string())
      return bad_request("`response_format.type` must be a string.", "response_format.type");
    const std::string type = t->get<std::string>();
    if (type == "json_object") {
      if (auto e = set_once(out, json_object_grammar(), "response_format")) return e;
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad_request("`response_format.json_schema` must be an object with a `schema`.", "response_format.json_schema");
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null())
        return bad_request("`response_format.json_schema.schema` is required.", "response_format.json_schema.schema");
      if (auto e = compile_schema_field(*schema, "response_format.json_schema.schema", out)) return e;
    } else if (type != "text") {
      return bad_request("`response_format.type` \"" + type +
                             "\" is not supported; use \"text\", \"json_object\" or \"json_schema\".",
                         "response_format.type");
    }
  }
  if (const RequestJson* so = r.raw("structured_outputs")) {
    if (!so->is_object()) return bad_request("`structured_outputs` must be an object.", "structured_outputs");
    for (const auto& [key, value] : so->items()) {
      const std::string param = "structured_outputs." + key;
      if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;
      if (key == "json") {
        if (auto e = compile_schema_field(value, param, out)) return e;
      } else if (key == "json_object") {
        if (auto e = set_once(out, json_object_grammar(), param)) return e;
      } else if (key == "choice") {
        if (auto e = read_choice(value, param, out)) return e;
      } else if (key == "regex") {
        if (auto e = read_regex(value, param, out)) return e;
      } else if (key == "disable_any_whitespace" || key == "disable_additional_properties" ||
                 key == "disable_fallback") {
        // Options of vLLM's backends; this grammar already bounds whitespace and writes no
        // undeclared properties.
      } else {
        return bad_request("`" + param + "` is not supported (supported: json, json_object, choice, regex).", param);
      }
    }
  }
  // vLLM's fields before structured_outputs (removed in v0.12; some clients still send them).
  if (const RequestJson* v = r.raw("guided_json"))
    if (auto e = compile_schema_field(*v, "guided_json", out)) return e;
  if (const RequestJson* v = r.raw("guided_regex"))
    if (auto e = read_regex(*v, "guided_regex", out)) return e;
  if (const RequestJson* v = r.raw("guided_choice"))
    if (auto e = read_choice(*v, "guided_choice", out)) return e;
  return std::nullopt;
}

}  // namespace sparkserve
