// libFuzzer entry point for the structured-output compilers and matcher (text/json_schema_compiler.h,
// text/json_grammar.h, text/regex_nfa.h), reached with what a request can send: a JSON schema
// (response_format json_schema / structured_outputs json), a regular expression (structured_outputs
// regex) or a list of choices. Input: byte 0 = kind (0 schema, 1 regex, 2 choices as a JSON array of
// strings); then the spec up to the first 0xFF byte; the bytes after it are a model's output, walked
// byte by byte (a rejected byte is skipped, as the token mask would have forbidden it). Checks, beyond
// "no crash, no hang": a refused spec says why; for a schema, an accepted output is one JSON value
// (what the server hands to the client as the response's content must parse).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/json_grammar.h"
#include "text/json_schema_compiler.h"

using namespace sparkserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t kind = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = rest.find('\xff');
  const std::string_view spec = rest.substr(0, cut);
  const std::string_view output = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);

  Expected<std::shared_ptr<const JsonGrammar>> grammar = make_error("no spec");
  if (kind == 1) {
    grammar = regex_grammar(spec);
  } else {
    const OrderedJson j = OrderedJson::parse(spec, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;  // the request parser refuses it before this point
    if (kind == 0) {
      grammar = compile_json_schema(j);
    } else {
      if (!j.is_array()) return 0;
      std::vector<std::string> choices;
      for (const auto& c : j)
        if (c.is_string()) choices.push_back(c.get<std::string>());
      grammar = choice_grammar(choices);
    }
  }
  if (!grammar.ok()) {
    if (grammar.message().empty()) __builtin_trap();
    return 0;
  }

  const JsonMatcher m(*grammar);
  JsonMatchState s = m.initial();
  std::string accepted;
  for (char c : output)
    if (m.step(s, static_cast<uint8_t>(c))) accepted.push_back(c);
  if (!m.accepting(s) || (*grammar)->raw) return 0;
  // A schema's (or json_object's) accepted output is one JSON value.
  if (OrderedJson::parse(accepted, nullptr, /*allow_exceptions=*/false).is_discarded()) __builtin_trap();
  return 0;
}
