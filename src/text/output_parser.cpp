#include "text/output_parser.h"

namespace sparkserve {
namespace {

ReasoningOptions reasoning_options(const OutputParserOptions& o) {
  ReasoningOptions r;
  r.thinking_enabled = o.thinking_enabled;
  return r;
}

std::optional<std::string> non_empty(std::string s) {
  if (s.empty()) return std::nullopt;
  return s;
}

}  // namespace

ParsedOutput parse_output(std::string_view text, const OutputParserOptions& options) {
  ParsedOutput out;
  ReasoningResult r = parse_reasoning(text, reasoning_options(options));
  out.reasoning = std::move(r.reasoning);
  if (!options.parse_tools || !r.content) {
    out.content = std::move(r.content);
    return out;
  }
  ToolParseResult t = parse_tool_calls(*r.content, options.tool_schemas, options.tool_call_ids);
  out.content = std::move(t.content);
  out.tool_calls = std::move(t.tool_calls);
  return out;
}

StreamingOutputParser::StreamingOutputParser(OutputParserOptions options)
    : options_(std::move(options)), reasoning_(reasoning_options(options_)) {
  if (options_.parse_tools) tools_.emplace(options_.tool_schemas, options_.tool_call_ids);
}

void StreamingOutputParser::route_content(std::string_view content, bool at_end, OutputDelta& out) {
  if (!tools_) {
    out.content.append(content);
    return;
  }
  ToolStreamDelta t = tools_->feed(content);
  if (at_end) {
    ToolStreamDelta rest = tools_->finish();
    t.content += rest.content;
    for (auto& d : rest.tool_calls) {
      if (!t.tool_calls.empty() && t.tool_calls.back().index == d.index && !d.id) {
        t.tool_calls.back().arguments += d.arguments;
      } else {
        t.tool_calls.push_back(std::move(d));
      }
    }
  }
  out.content += t.content;
  out.tool_calls = std::move(t.tool_calls);
}

void StreamingOutputParser::record(const OutputDelta& d) {
  reasoning_text_ += d.reasoning;
  content_text_ += d.content;
}

OutputDelta StreamingOutputParser::feed(std::string_view text) {
  OutputDelta out;
  if (finished_) return out;
  ReasoningDelta r = reasoning_.feed(text);
  out.reasoning = std::move(r.reasoning);
  if (!r.content.empty()) route_content(r.content, false, out);
  record(out);
  return out;
}

OutputDelta StreamingOutputParser::finish() {
  OutputDelta out;
  if (finished_) return out;
  ReasoningDelta r = reasoning_.finish();
  out.reasoning = std::move(r.reasoning);
  route_content(r.content, true, out);
  record(out);
  finished_ = true;
  result_.reasoning = non_empty(reasoning_text_);
  result_.content = non_empty(content_text_);
  if (tools_) result_.tool_calls = tools_->tool_calls();
  return out;
}

}  // namespace sparkserve
