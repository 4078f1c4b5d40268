// OpenAI's Responses API (POST /v1/responses, what Codex speaks) on the chat pipeline.
//
// Request mapping: instructions, and system / developer messages anywhere in `input`, -> the
// leading system message (the Qwen template takes one, first); `input` as a string -> a user
// message; message items (content a string or input_text / output_text parts) -> messages;
// function_call items -> tool_calls of an assistant turn; function_call_output -> tool
// messages; reasoning items (content reasoning_text, else summary text) -> reasoning_content
// of the assistant turn that follows. Function tools -> functions; other tool types
// (web_search, image_generation, local_shell, custom, namespace, mcp, ...) are skipped with a
// note in the log, as are input items of types this server cannot render (their calls never
// come from it). tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p as in
// chat completions; reasoning.effort "none" / "minimal" turns thinking off (Qwen3.5 thinks or
// not); text.format json_object / json_schema -> structured outputs. previous_response_id and
// conversation are refused (400): responses are not stored; send the whole conversation.
//
// Output items: reasoning (content: reasoning_text), message (output_text; none for text that is
// only whitespace, such as the "\n\n" before a call), function_call.
// Streams: response.created, response.in_progress, then per item output_item.added,
// content_part.added, *.delta events (reasoning_text, output_text, function_call_arguments),
// *.done events, output_item.done; then response.completed (response.incomplete when
// max_output_tokens ended it). Every event carries a sequence_number.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "text/output_parser.h"

namespace sparkserve {

struct ResponsesRequest {
  ChatRequest chat;
  RequestJson echo = RequestJson::object();  // request fields the response object repeats
  std::vector<std::string> notes;             // skipped tools and items, for the log
};

ApiResult<ResponsesRequest> parse_responses_request(std::string_view body, const ServedModelInfo& model);

struct ResponsesUsage {
  int64_t input_tokens = 0, cached_tokens = 0, output_tokens = 0, reasoning_tokens = 0;
};

// The response object. status "completed" or "incomplete" (max_output_tokens reached).
ResponseJson responses_object_json(const std::string& id, int64_t created_at, const std::string& model,
                                   const RequestJson& echo, const std::string& status, ResponseJson output,
                                   const ResponsesUsage* usage);

// The output items of a finished generation (ids derived from the response id).
ResponseJson responses_output_items(const std::string& response_id, const ParsedOutput& out, bool include_reasoning);

class ResponsesStream {
 public:
  ResponsesStream(std::string id, int64_t created_at, std::string model, RequestJson echo, bool include_reasoning);
  std::string start();
  std::string delta(const OutputDelta& d);
  std::string finish(const std::string& status, const ResponsesUsage& usage);
  std::string error(const ApiError& e);

 private:
  enum class Item { kNone, kReasoning, kMessage, kFunctionCall };
  std::string event(const std::string& type, ResponseJson body);
  std::string open(Item kind, int tool_index, const ToolCallDelta* call);
  std::string close();
  ResponseJson current_item(const char* status) const;

  std::string id_, model_;
  int64_t created_at_;
  RequestJson echo_;
  bool include_reasoning_;
  int64_t seq_ = 0;
  Item item_ = Item::kNone;
  int output_index_ = -1;
  int tool_ = -1;
  std::string item_id_, text_, call_id_, name_;
  BlankContentHold blank_;
  ResponseJson done_items_ = ResponseJson::array();
};

}  // namespace sparkserve
