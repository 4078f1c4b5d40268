// Python's ast.literal_eval for the literals a tool-call parameter can hold, yielding the JSON
// value json.dumps would write for the result. vLLM's qwen3_coder parser falls back to
// literal_eval when a value is not JSON (models trained on Qwen3.5 history write True/None and
// single-quoted strings), so the tool parser needs the same acceptance set.
#pragma once

#include "text/py_json.h"

#include <optional>
#include <string_view>

namespace sparkserve {

// Parses `text` as a Python literal expression: None/True/False, int (decimal, 0x/0o/0b,
// underscores), float, str (quotes ', ", triple quotes, r/u prefixes, escapes, adjacent
// concatenation), list, tuple (-> JSON array), dict (keys: str, int, float, bool, None are
// converted to strings as json.dumps does), unary +/- on numbers; leading spaces/tabs and
// surrounding newlines ignored. Returns nullopt for anything literal_eval rejects and for results
// json.dumps cannot write (sets, bytes, complex, tuple keys) or that JSON here cannot hold
// exactly (integers outside the 64-bit range, strings with lone surrogates).
std::optional<OrderedJson> parse_python_literal(std::string_view text);

}  // namespace sparkserve
