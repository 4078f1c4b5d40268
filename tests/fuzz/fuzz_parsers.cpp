// libFuzzer entry point for the output parsers. The first byte picks the options (thinking,
// tools), the second seeds how the rest is cut into streamed pieces. Checks, beyond "no crash":
// the streamed deltas add up to the one-shot parse, every call's arguments are JSON, a call's
// first delta alone carries id/name, and the parameter converters accept any value text.
// Input bytes are decoded as UTF-8 with replacement first: the parsers get detokenizer output.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/python_literal.h"

namespace {

using namespace sparkserve;

const ToolSchemas& schemas() {
  static const ToolSchemas s = ToolSchemas::from_openai_tools(OrderedJson::parse(R"([
    {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{
      "s":{"type":"string"},"i":{"type":"integer"},"n":{"type":"number"},"b":{"type":"boolean"},
      "o":{"type":"object"},"a":{"type":"array"},"u":{"type":["integer","null"]},
      "y":{"anyOf":[{"type":"null"},{"type":"number"}]}}}}}])"));
  return s;
}

ToolCallIdGenerator counter() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

OutputParserOptions make_options(uint8_t flags) {
  OutputParserOptions o;
  o.thinking_enabled = flags & 1;
  o.parse_tools = flags & 2;
  o.tool_schemas = schemas();
  o.tool_call_ids = counter();
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  uint32_t rng = data[1] * 2654435761u + 1;
  // The parsers' input contract is valid UTF-8 (what the detokenizer emits), so the bytes are
  // decoded the same way first.
  const std::string decoded =
      decode_utf8_replace(std::string(reinterpret_cast<const char*>(data + 2), size - 2), true);
  std::string_view text = decoded;

  ParsedOutput one = parse_output(text, make_options(flags));

  StreamingOutputParser p(make_options(flags));
  std::string reasoning, content;
  std::vector<std::string> names, args;
  auto take = [&](const OutputDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    for (const auto& t : d.tool_calls) {
      if (t.index < 0 || static_cast<size_t>(t.index) > names.size()) __builtin_trap();
      if (static_cast<size_t>(t.index) == names.size()) {
        if (!t.id || !t.name || !t.arguments.empty()) __builtin_trap();
        names.push_back(*t.name);
        args.emplace_back();
      } else {
        if (t.id || t.name) __builtin_trap();
        args[static_cast<size_t>(t.index)] += t.arguments;
      }
    }
  };
  size_t pos = 0;
  while (pos < text.size()) {
    rng = rng * 1103515245u + 12345u;
    size_t len = 1 + (rng >> 16) % 9;
    take(p.feed(text.substr(pos, len)));
    pos += len;
  }
  take(p.finish());

  if (reasoning != one.reasoning.value_or("")) __builtin_trap();
  if (content != one.content.value_or("")) __builtin_trap();
  if (names.size() != one.tool_calls.size()) __builtin_trap();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] != one.tool_calls[i].name || args[i] != one.tool_calls[i].arguments) __builtin_trap();
    if (!OrderedJson::accept(args[i])) __builtin_trap();
  }
  if (p.result().tool_calls.size() != one.tool_calls.size()) __builtin_trap();

  // The converters on the raw text: any value must give some JSON-writable result.
  std::string value(text.substr(0, 256));
  for (const char* param : {"s", "i", "n", "b", "o", "a", "u", "y", "unknown"}) {
    OrderedJson v = convert_tool_param_value(value, param, schemas().properties("f"));
    (void)py_json_dumps(v);
  }
  if (auto lit = parse_python_literal(value)) (void)py_json_dumps(*lit);
  return 0;
}
