// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the chat pipeline:
// a Messages request becomes the ChatRequest the OpenAI route uses (same template, tools,
// parsers, constraints), and the parsed output goes back as a Messages response or stream.
//
// Request mapping: system (string or text blocks) -> the system message; user text blocks ->
// user content, tool_result blocks -> tool messages (before the user's text, as the turn
// reads); assistant text / thinking / tool_use blocks -> content / reasoning_content /
// tool_calls; tools {name, description, input_schema} -> functions (server tools such as
// web_search_* or bash_* have nothing to run them here: skipped, with a note in the log);
// tool_choice auto / any / tool / none -> auto / required / named / none, with
// disable_parallel_tool_use -> parallel_tool_calls false; thinking enabled, adaptive or
// between_tools -> the template's enable_thinking (absent or disabled: no thinking, as the API
// defines; budget_tokens is accepted and not enforced); output_config.format (or output_format)
// json_schema -> structured outputs; stop_sequences -> stop; max_tokens is an upper bound,
// lowered to what the context leaves; temperature / top_p / top_k as sent; metadata,
// cache_control, service_tier, output_config.effort and other fields without an effect here are
// accepted and ignored. Image and document blocks are refused (400) until the model's vision
// tower is served.
//
// Responses: content blocks thinking (signature ""), text (not when it is only whitespace, such
// as the "\n\n" before a tool call), tool_use (id "toolu_..."); stop_reason
// end_turn / max_tokens / stop_sequence (+ stop_sequence) / tool_use; usage input_tokens,
// output_tokens, cache_read_input_tokens. Streams: message_start, ping, content_block_start /
// _delta (thinking_delta, text_delta, input_json_delta) / _stop per block, message_delta with
// stop_reason and usage, message_stop. Errors: {"type":"error","error":{"type","message"}}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "text/output_parser.h"

namespace sparkserve {

struct AnthropicRequest {
  ChatRequest chat;                 // what the chat pipeline runs
  bool thinking = false;            // thinking enabled, adaptive or between_tools
  bool omit_thinking = false;       // thinking.display "omitted": thinking blocks come back empty
  std::vector<std::string> notes;   // skipped tools and the like, for the log
};

// count_tokens: max_tokens is not required there.
ApiResult<AnthropicRequest> parse_anthropic_request(std::string_view body, const ServedModelInfo& model,
                                                    bool count_tokens = false);

// {"type":"error","error":{"type":"invalid_request_error",...,"message"}} for an ApiError.
ResponseJson anthropic_error_json(const ApiError& e);

// end_turn / max_tokens / stop_sequence / tool_use from how the generation ended.
std::string anthropic_stop_reason(bool tool_calls, const std::string& finish_reason, const ResponseJson& stop_reason);

// Anthropic ids for a tool call (the parser's "call_<hex>" -> "toolu_<hex>").
std::string anthropic_tool_id(const std::string& call_id);

struct AnthropicUsage {
  int64_t input_tokens = 0, output_tokens = 0, cached_tokens = 0;
};

ResponseJson anthropic_message_json(const std::string& id, const std::string& model, const ParsedOutput& out,
                                    bool include_thinking, const std::string& stop_reason,
                                    const ResponseJson& stop_sequence, const AnthropicUsage& usage);

// The event stream of one message: start() once, delta() per piece of parsed output, finish()
// at the end (or error() instead).
class AnthropicStream {
 public:
  AnthropicStream(std::string id, std::string model, bool include_thinking);
  std::string start(const AnthropicUsage& usage);
  std::string delta(const OutputDelta& d);
  std::string finish(const std::string& stop_reason, const ResponseJson& stop_sequence, const AnthropicUsage& usage);
  static std::string error(const ApiError& e);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open(Block b, ResponseJson content_block);
  std::string close();

  std::string id_, model_;
  bool include_thinking_;
  Block block_ = Block::kNone;
  int index_ = -1;       // index of the open (or last) content block
  int tool_ = -1;        // the parser's tool-call index of the open tool_use block
  BlankContentHold blank_;
};

}  // namespace sparkserve
