// JSON text exactly as Python's json.dumps(x, ensure_ascii=False) writes it (separators ", " and
// ": ", insertion-ordered keys, raw non-ASCII, Python float repr). Both the chat template's
// `tojson` (transformers' override) and tool-call `arguments` need this byte for byte.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace sparkserve {

using OrderedJson = nlohmann::ordered_json;

std::string py_json_dumps(const OrderedJson& value);
// Python repr() of a float ("2.0", "1e-05", "1e+16", "inf", "nan").
std::string py_float_repr(double v);
// The JSON string literal for s (quotes included), as json.dumps(s, ensure_ascii=False).
std::string py_json_quote(const std::string& s);

}  // namespace sparkserve
