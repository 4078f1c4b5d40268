// The whole post-processing of one Qwen3.5 completion, as the server needs it: text in, OpenAI
// fields out. Reasoning is split off first (reasoning_parser.h); the content that follows goes
// through the tool-call parser (tool_parser.h) when tools are parsed. Because a `<tool_call>`
// inside the thinking block ends the reasoning, such a call is returned as a tool call.
#pragma once

#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparkserve {

struct OutputParserOptions {
  bool thinking_enabled = true;  // chat_template_kwargs.enable_thinking (default true)
  bool parse_tools = false;      // tools given and tool_choice is not "none"
  ToolSchemas tool_schemas;      // ToolSchemas::from_openai_tools(request["tools"])
  ToolCallIdGenerator tool_call_ids = random_tool_call_id_generator();
};

struct ParsedOutput {
  std::optional<std::string> reasoning;  // message.reasoning / reasoning_content; nullopt if empty
  std::optional<std::string> content;    // message.content; nullopt if empty
  std::vector<ToolCall> tool_calls;      // message.tool_calls (omit when empty)
  // "tool_calls" when calls were parsed (vLLM rewrites any engine reason then), else the
  // engine's reason ("stop" / "length").
  std::string finish_reason(const std::string& engine_reason) const {
    return tool_calls.empty() ? engine_reason : "tool_calls";
  }
};

// One-shot parse of a complete output text.
ParsedOutput parse_output(std::string_view text, const OutputParserOptions& options);

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Agent APIs put content in blocks (Anthropic text blocks, Responses message items): whitespace
// before a tool call (the model writes "\n\n" after </think>) should open none. `pass` holds
// content that is only whitespace while no text block is open and returns what to emit now.
class BlankContentHold {
 public:
  std::string pass(const std::string& content, bool block_open) {
    std::string text = held_ + content;
    held_.clear();
    if (!block_open && is_blank(text)) {
      held_ = std::move(text);
      return "";
    }
    return text;
  }
  static bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

 private:
  std::string held_;
};

// Incremental form for streaming responses: feed each new piece of detokenized text, send the
// returned delta (skip it when empty()); at the end call finish() for the held-back rest, then
// result() for the complete message (same as parse_output over the whole text, ids included).
class StreamingOutputParser {
 public:
  explicit StreamingOutputParser(OutputParserOptions options);
  OutputDelta feed(std::string_view text);
  OutputDelta finish();
  const ParsedOutput& result() const { return result_; }  // complete after finish()

 private:
  void route_content(std::string_view content, bool at_end, OutputDelta& out);
  void record(const OutputDelta& d);

  OutputParserOptions options_;
  StreamingReasoningParser reasoning_;
  std::optional<StreamingToolParser> tools_;
  std::string reasoning_text_;
  std::string content_text_;
  ParsedOutput result_;
  bool finished_ = false;
};

}  // namespace sparkserve
