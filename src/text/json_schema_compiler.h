// Structured-output languages as JsonGrammar (json_grammar.h): JSON Schema (the subset clients
// send: OpenAI strict schemas, Pydantic, LangChain), any JSON object, a fixed set of choices, a
// regular expression.
//
// JSON Schema keywords understood: type (a name or a list), enum, const, properties, required,
// additionalProperties (false, true or a schema; when absent no other keys are written, as in
// OpenAI's strict mode: the output is still valid for the schema), items, minItems, maxItems,
// minLength, maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf,
// oneOf (as anyOf: alternatives must not overlap for a oneOf to validate), allOf with one
// schema, $ref to "#", "#/$defs/..", "#/definitions/.." or any local JSON pointer (recursion
// allowed), $defs / definitions, nullable (OpenAPI). Annotations are ignored: title,
// description, default, examples, format (an annotation by default in JSON Schema),
// $schema, $id, $comment, deprecated, readOnly, writeOnly, discriminator, x-*... Any other
// keyword is an error that names it and where it is (a client is told, instead of getting
// output that may not validate).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/json_grammar.h"
#include "text/py_json.h"

namespace sparkserve {

Expected<std::shared_ptr<const JsonGrammar>> compile_json_schema(const OrderedJson& schema);
// response_format json_object: any JSON object.
std::shared_ptr<const JsonGrammar> json_object_grammar();
// structured_outputs.choice: exactly one of the strings (raw text).
Expected<std::shared_ptr<const JsonGrammar>> choice_grammar(const std::vector<std::string>& choices);
// structured_outputs.regex: the whole output matches the pattern.
Expected<std::shared_ptr<const JsonGrammar>> regex_grammar(std::string_view pattern);

}  // namespace sparkserve
