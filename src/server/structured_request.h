// The structured-output fields of a request, compiled into the grammar constrained decoding
// follows (text/json_schema_compiler.h): OpenAI's response_format (json_object, json_schema),
// vLLM's structured_outputs (json, json_object, choice, regex) and its older guided_json /
// guided_regex / guided_choice. Errors are 400s that name the field, and for a schema the
// unsupported keyword and where it is.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "text/json_grammar.h"

namespace sparkserve {

struct StructuredOutput {
  std::shared_ptr<const JsonGrammar> grammar;  // null: free text
  std::string param;                           // the field it came from (for later errors)
};

// Reads the fields above from `r` (the request body's reader). At most one of them may be set.
std::optional<ApiError> read_structured_output(FieldReader& r, StructuredOutput& out);

// A JSON-Schema value (object, or JSON text of one) compiled into out; `param` names the field.
std::optional<ApiError> compile_schema_field(const RequestJson& schema, const std::string& param, StructuredOutput& out);

}  // namespace sparkserve
