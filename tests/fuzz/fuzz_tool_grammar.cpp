// libFuzzer entry point for constrained decoding's tool-call grammar (text/tool_call_grammar.h),
// reached the way the server reaches it: the tools array comes from a request body that
// parse_chat_request validated. Input: byte 0 = options (bit 0 thinking, bit 1 a named function,
// bit 2 parallel_tool_calls=false); then the tools JSON up to the first 0xFF byte; the bytes after
// it are a model's output, walked byte by byte (a rejected byte is skipped, as the mask would have
// forbidden it). Checks, beyond "no crash": build errors say something; an accepting state means
// the accepted text parses (output_parser, detokenized first) into exactly that many tool calls,
// of offered (or the named) functions, with JSON arguments that hold every required parameter.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/openai_request.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tool_call_grammar.h"

using namespace sparkserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = rest.find('\xff');
  const std::string_view tools_text = rest.substr(0, cut);
  const std::string_view output = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 1);

  static const ServedModelInfo info{{"qwen"}, 4096, 512};
  const std::string body = R"({"model":"qwen","messages":[{"role":"user","content":"x"}],"tool_choice":"required","tools":)" +
                           std::string(tools_text) + "}";
  auto req = parse_chat_request(body, info);
  if (!req.ok()) return 0;  // the request parser's own fuzz target covers its errors

  ToolCallGrammarOptions opt;
  opt.thinking = flags & 1;
  opt.parallel_tool_calls = !(flags & 4);
  if ((flags & 2) && req->tools.is_array() && !req->tools.empty())
    opt.only_function = req->tools[0]["function"]["name"].get<std::string>();
  auto grammar = ToolCallGrammar::build(OrderedJson(req->tools), opt);
  if (!grammar.ok()) {
    if (grammar.message().empty()) __builtin_trap();
    return 0;
  }

  ToolCallState s = grammar->initial();
  std::string accepted;
  for (char c : output) {
    if (grammar->step(s, static_cast<uint8_t>(c))) accepted.push_back(c);
  }
  if (!grammar->accepting(s)) return 0;

  OutputParserOptions popt;
  popt.thinking_enabled = opt.thinking;
  popt.parse_tools = true;
  popt.tool_schemas = ToolSchemas::from_openai_tools(req->tools);
  const ParsedOutput parsed = parse_output(decode_utf8_replace(accepted, true), popt);
  if (parsed.tool_calls.empty() || parsed.tool_calls.size() != s.calls) __builtin_trap();
  if (!opt.parallel_tool_calls && parsed.tool_calls.size() != 1) __builtin_trap();
  for (const ToolCall& call : parsed.tool_calls) {
    const ToolFunctionSpec* fn = nullptr;
    for (const ToolFunctionSpec& f : grammar->functions())
      if (f.name == call.name) fn = &f;
    if (!fn || (opt.only_function && call.name != *opt.only_function)) __builtin_trap();
    if (!OrderedJson::accept(call.arguments)) __builtin_trap();
    const OrderedJson args = OrderedJson::parse(call.arguments);
    for (size_t i = 0; i < fn->params.size(); ++i)
      if ((fn->required_mask >> i & 1) && !args.contains(fn->params[i].name)) __builtin_trap();
  }
  return 0;
}
