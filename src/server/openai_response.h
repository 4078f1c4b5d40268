// Response bodies of the OpenAI-compatible API in vLLM's shapes: chat.completion and its
// chunks, text_completion and its chunks, the model list, /tokenize and /detokenize, errors.
// Builders return JSON values; serialize_json() writes them (invalid UTF-8 in generated text
// becomes U+FFFD instead of throwing).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace sparkserve {

using ResponseJson = nlohmann::ordered_json;

// "chatcmpl-" / "cmpl-" + 32 random hex digits.
std::string make_response_id(std::string_view prefix);
int64_t unix_time_seconds();

std::string serialize_json(const ResponseJson& value);

// id, created and model are the same on every chunk of one response.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

struct UsageInfo {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::optional<int64_t> cached_tokens;  // prompt_tokens_details.cached_tokens when set
};
ResponseJson usage_json(const UsageInfo& usage);

// One generated token's logprobs, its text already decoded by the caller.
struct LogprobToken {
  std::string text;
  float logprob = 0.0f;  // -inf is written as -9999.0, as vLLM does
};
struct TokenLogprobs {
  LogprobToken chosen;
  std::vector<LogprobToken> top;
};
// Chat: {"content": [{"token","logprob","bytes","top_logprobs":[...]}, ...]}.
ResponseJson chat_logprobs_json(const std::vector<TokenLogprobs>& tokens);
// Completions: {"text_offset","token_logprobs","tokens","top_logprobs":[{text: logprob}]};
// text offsets count bytes from `text_offset_start`.
ResponseJson completion_logprobs_json(const std::vector<TokenLogprobs>& tokens,
                                      int64_t text_offset_start = 0);

// Completions with echo: the prompt's tokens first (the first has no logprob: null, as vLLM),
// then the generated ones. prompt_lps[i] belongs to prompt token i + 1; its top dict also holds
// the prompt token itself (vLLM reports the token and the top k).
ResponseJson echo_logprobs_json(const std::vector<std::string>& prompt_tokens,
                                const std::vector<TokenLogprobs>& prompt_lps,
                                const std::vector<TokenLogprobs>& generated, int64_t text_offset_start = 0);

// Several single-choice responses as one: choice i is responses[i]'s, with index i; usage set.
ResponseJson merge_choices(std::vector<ResponseJson> responses, const UsageInfo& usage);
// The (single) choice of a chunk gets index i.
ResponseJson with_choice_index(ResponseJson chunk, size_t index);

// How a choice ended. stop_reason (vLLM extension): the matched stop string, the stop token id,
// or null (EOS / length).
struct ChoiceEnd {
  std::string finish_reason;  // "stop" | "length" | "tool_calls" | "abort"
  ResponseJson stop_reason = nullptr;
};

// The assistant message of a finished chat completion. tool_calls holds OpenAI tool-call
// objects ({"id","type":"function","function":{"name","arguments"}}) and is omitted when empty.
// reasoning is written as both `reasoning` and `reasoning_content` (serving-api.md 4.3).
struct ChatMessageOut {
  std::optional<std::string> content;
  std::optional<std::string> reasoning;
  ResponseJson tool_calls = ResponseJson::array();
};

// Optional parts of a choice.
struct ChoiceExtras {
  const ResponseJson* logprobs = nullptr;            // from *_logprobs_json
  const std::vector<int32_t>* token_ids = nullptr;   // return_token_ids
};

ResponseJson chat_completion_json(const ResponseMeta& meta, const ChatMessageOut& message,
                                  const ChoiceEnd& end, const UsageInfo& usage,
                                  ChoiceExtras extras = {},
                                  const std::vector<int32_t>* prompt_token_ids = nullptr);

// One streamed delta. role=true on the first chunk (with content ""). tool_calls holds
// ToolCallDelta objects ({"index", "id"?, "type"?, "function": {"name"?, "arguments"}}).
struct ChatDelta {
  bool role = false;
  std::optional<std::string> content;
  std::optional<std::string> reasoning;
  ResponseJson tool_calls = ResponseJson::array();
};

// A chat.completion.chunk with one choice. `end` set on the last choice chunk. `usage` only
// with continuous_usage_stats. prompt_token_ids on the first chunk when return_token_ids.
ResponseJson chat_chunk_json(const ResponseMeta& meta, const ChatDelta& delta,
                             const std::optional<ChoiceEnd>& end = std::nullopt,
                             ChoiceExtras extras = {}, const UsageInfo* usage = nullptr,
                             const std::vector<int32_t>* prompt_token_ids = nullptr);
// The final usage chunk (stream_options.include_usage): "choices": [] and usage.
ResponseJson chat_usage_chunk_json(const ResponseMeta& meta, const UsageInfo& usage);

ResponseJson text_completion_json(const ResponseMeta& meta, const std::string& text,
                                  const ChoiceEnd& end, const UsageInfo& usage,
                                  ChoiceExtras extras = {},
                                  const std::vector<int32_t>* prompt_token_ids = nullptr);
ResponseJson text_completion_chunk_json(const ResponseMeta& meta, const std::string& text,
                                        const std::optional<ChoiceEnd>& end = std::nullopt,
                                        ChoiceExtras extras = {}, const UsageInfo* usage = nullptr,
                                        const std::vector<int32_t>* prompt_token_ids = nullptr);
ResponseJson text_completion_usage_chunk_json(const ResponseMeta& meta, const UsageInfo& usage);

// GET /v1/models: one entry per served name; root = the checkpoint path or HF id.
ResponseJson models_list_json(const std::vector<std::string>& served_names, const std::string& root,
                              int64_t max_model_len, int64_t created);

// POST /tokenize -> {"count","max_model_len","tokens","token_strs"?}; /detokenize -> {"prompt"}.
ResponseJson tokenize_response_json(const std::vector<int32_t>& tokens, int64_t max_model_len,
                                    const std::vector<std::string>* token_strs = nullptr);
ResponseJson detokenize_response_json(const std::string& prompt);

// {"error": {"message","type","param","code"}}; code is the HTTP status (vLLM).
ResponseJson error_json(const ApiError& error);

}  // namespace sparkserve
