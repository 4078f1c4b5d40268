// Tool calls in the Qwen3-Coder XML form that Qwen3.5 emits, into OpenAI `tool_calls`:
//
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//
// Semantics follow vLLM's `qwen3_coder` parser (reference notes serving-api.md §3.2), written as
// one grammar that both the one-shot and the incremental parser implement, so that streamed
// deltas always add up to the one-shot result:
//  - Content is the text before the first call. A call starts at a `<tool_call>` whose block
//    (up to the first `</tool_call>`, or the end) contains `<function=`, or at a bare
//    `<function=` outside any block (vLLM's fallback for outputs without `<tool_call>` tags).
//    A `<tool_call>` block without `<function=` before the first call stays content.
//  - After the first call, text outside functions (whitespace between calls, stray text) is
//    dropped, as vLLM's non-streaming parser does; XML never reaches content.
//  - Inside a block, functions are `<function=(.*?)</function>` or `<function=(.*)$`; a bare
//    function ends at `</function>` or the end of the text. An unterminated call is accepted.
//  - The name is the text up to the first `>`; a function without `>` (cut off) or with a name
//    that cannot be an identifier ({ } < > quotes or whitespace, or empty: an unrendered
//    template) is dropped, as current vLLM does.
//  - Parameters: `<parameter=NAME>VALUE` ending at the first `</parameter>`, `<parameter=`,
//    `</function>` or the end of the function; a value running to the end of its region loses one
//    trailing "\n" first (Python's `$` matches before a final newline); then exactly one leading
//    and one trailing "\n" are stripped. A parameter without `>` ends the function's parameters.
//  - A repeated parameter name keeps its first value (deviation from vLLM's last-wins: streamed
//    argument fragments can never be retracted).
//  - Values convert by the tool's JSON schema (convert_tool_param_value), and arguments are
//    Python's json.dumps(params, ensure_ascii=False) with parameters in their emitted order.
#pragma once

#include "core/status.h"
#include "text/py_json.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparkserve {

// The `properties` of each tool's parameters, from the request's OpenAI `tools` array.
class ToolSchemas {
 public:
  ToolSchemas() = default;
  // tools: [{"type":"function","function":{"name":..,"parameters":{"properties":{..}}}}, ...].
  // Entries without a function name are ignored (the request layer validates tools).
  static ToolSchemas from_openai_tools(const OrderedJson& tools);
  static ToolSchemas from_openai_tools(const nlohmann::json& tools);
  // The properties object of the first tool named `name`, or nullptr when there is none.
  const OrderedJson* properties(std::string_view name) const;

 private:
  std::vector<std::pair<std::string, OrderedJson>> props_;
};

// One parameter value converted as vLLM's _convert_param_value does (serving-api.md §3.2):
// "null" (any case) -> null; a parameter the schema does not list -> the raw string; then by
// str(type).strip().lower(): string/str/text/varchar/char/enum -> string; int*/uint*/long*/
// short*/unsigned* -> Python int() or the raw string; num*/float* -> float, written as an
// integer when integral, or the raw string; boolean/bool/binary -> lower-cased == "true";
// object/array/arr/dict*/list* -> json.loads, then ast.literal_eval, else the raw string; any
// other type (type lists such as ["integer","null"]) -> ast.literal_eval, else the raw string.
// A property without "type" is a string, except `anyOf`, which takes its first non-null type
// (current vLLM).
// properties: the tool's parameters.properties object, or nullptr for an unknown tool.
OrderedJson convert_tool_param_value(const std::string& value, const std::string& name,
                                     const OrderedJson* properties);

struct ToolCall {
  std::string id;         // "call_" + 24 hex
  std::string name;
  std::string arguments;  // JSON text
  OrderedJson to_openai() const;  // {"id", "type":"function", "function":{"name","arguments"}}
};

// A streamed piece of one tool call. The first delta of a call carries id, type and name with
// arguments ""; later ones carry argument fragments only.
struct ToolCallDelta {
  int index = 0;
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;
  OrderedJson to_openai() const;  // {"index", ["id", "type", "function":{"name"}], "function":{"arguments"}}
};

struct ToolParseResult {
  std::optional<std::string> content;  // text before the first call; nullopt when empty
  std::vector<ToolCall> tool_calls;
};

// Produces tool-call ids. The default draws 24 random hex digits; tests inject a counter.
using ToolCallIdGenerator = std::function<std::string()>;
ToolCallIdGenerator random_tool_call_id_generator();

// One-shot parse of a complete model output (after reasoning has been removed).
ToolParseResult parse_tool_calls(std::string_view text, const ToolSchemas& schemas,
                                 const ToolCallIdGenerator& ids = random_tool_call_id_generator());

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// Incremental parser: feed text pieces of any size (no assumption about token boundaries).
// Content that could still turn out to be the start of a call (a partial `<tool_call>` or
// `<function=`, or an open `<tool_call>` block not yet known to hold a function) is held back.
// Over any split of a text, the concatenated content equals parse_tool_calls' content and the
// concatenated arguments of each index equal its arguments.
class StreamingToolParser {
 public:
  explicit StreamingToolParser(ToolSchemas schemas,
                               ToolCallIdGenerator ids = random_tool_call_id_generator());
  ToolStreamDelta feed(std::string_view text);
  // End of output: releases held text and completes an unterminated call.
  ToolStreamDelta finish();
  // The calls seen so far (complete after finish()).
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 private:
  enum class Mode { kContent, kCalls };
  struct OpenFunction {
    size_t body_start = 0;       // index in buf_ just after `<function=`
    bool header_sent = false;    // name complete and valid, header delta sent
    bool dropped = false;        // name invalid: parse to its end, emit nothing
    size_t params_pos = 0;       // where to look for the next parameter (index in buf_)
    bool params_done = false;    // a malformed parameter ended parameter parsing
    int index = -1;
    OrderedJson params = OrderedJson::object();
  };

  void process(bool at_end, ToolStreamDelta& out);
  bool process_content(bool at_end, ToolStreamDelta& out);
  bool process_calls(bool at_end, ToolStreamDelta& out);
  // Advances the open function; returns true when it ended (pos_ moves past it).
  bool advance_function(size_t region_end, bool region_closed, bool at_end, ToolStreamDelta& out);
  void emit_param(const std::string& name, std::string value, ToolStreamDelta& out);
  void close_function(ToolStreamDelta& out);
  // Adds a fragment to call `index`'s arguments and to the deltas going out.
  void append_arguments(int index, std::string frag, ToolStreamDelta& out);
  void compact();

  ToolSchemas schemas_;
  ToolCallIdGenerator ids_;
  std::string buf_;      // text not yet fully consumed; indices below are into it
  size_t pos_ = 0;       // parse position in buf_
  Mode mode_ = Mode::kContent;
  bool in_block_ = false;            // inside a `<tool_call>` block (calls mode)
  std::optional<OpenFunction> fn_;   // function being parsed
  std::vector<ToolCall> calls_;
  bool finished_ = false;
};

}  // namespace sparkserve
