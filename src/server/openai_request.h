// Parsing and validation of OpenAI-style request bodies (/v1/chat/completions, /v1/completions,
// /tokenize, /detokenize) into typed structs, following vLLM's request models. Every invalid
// request becomes an ApiError whose message names the field and says what is wrong. Unknown
// fields are accepted and listed in `unknown_fields` (for debug logging). Checks that need the
// tokenizer (prompt length against the context) happen after tokenizing: check_context_length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampling_params.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/structured_request.h"

namespace sparkserve {

// What validation needs to know about the served model.
struct ServedModelInfo {
  std::vector<std::string> names;  // accepted values of "model" (the first is reported)
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;          // token ids must be < vocab_size
};

// Caps on request lists whose cost is paid per generated token (stop strings by the
// detokenizer, stop ids by the engine's stop check).
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;
inline constexpr size_t kMaxStopTokenIds = 1024;

// Fields shared by chat and text completions.
struct GenerationRequest {
  std::optional<std::string> model;
  SamplingOptions sampling;          // validated; defaults are applied later
  std::vector<std::string> stop;     // stop strings (non-empty)
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  bool continuous_usage_stats = false;
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  bool include_stop_str_in_output = false;
  bool return_token_ids = false;     // vLLM: token_ids per choice / chunk (llama-benchy uses it)
  bool return_tokens_as_token_ids = false;  // logprob tokens written as "token_id:<id>"
  bool echo = false;
  int64_t n = 1;                     // choices per prompt
  bool prompt_only = false;          // completions: echo with max_tokens 0 (prompt logprobs only)
  // Anthropic max_tokens / Responses max_output_tokens are upper bounds: past what the context
  // leaves they are lowered to it (agents send 32000 whatever the model), not refused.
  bool clamp_max_tokens = false;
  StructuredOutput structured;       // response_format / structured_outputs / guided_*
  // sparkserve extension: drafts per step for this request with speculative decoding on (at most
  // the server's --speculative-tokens; 0 opts out); unset: the server's setting.
  std::optional<int64_t> num_speculative_tokens;
  std::vector<std::string> unknown_fields;
};

// Choices one request may ask for (n times the prompts of a completion request).
inline constexpr int64_t kMaxChoices = 128;

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ChatRequest : GenerationRequest {
  // Messages as the chat template wants them: roles checked; content a string, null or a list
  // of {"type":"text","text"} parts; `reasoning` copied to `reasoning_content`; tool-call
  // `arguments` JSON strings parsed into objects (as vLLM does before rendering).
  RequestJson messages = RequestJson::array();
  RequestJson tools;                 // null or the validated array of {"type":"function",...}
  ToolChoice tool_choice = ToolChoice::kNone;  // default: auto when tools are given
  std::string tool_choice_name;      // kNamed only
  bool parallel_tool_calls = true;
  RequestJson chat_template_kwargs = RequestJson::object();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = false;
  bool include_reasoning = true;
  bool logprobs = false;             // top_logprobs lands in sampling.logprobs
  std::optional<std::string> reasoning_effort;
};

struct CompletionRequest : GenerationRequest {
  struct Prompt {
    std::optional<std::string> text;  // text, or else token ids
    std::vector<int32_t> tokens;
  };
  std::vector<Prompt> prompts;       // one or more (a batch: lm-eval sends several)
  bool add_special_tokens = true;
};

ApiResult<ChatRequest> parse_chat_request(std::string_view body, const ServedModelInfo& model);
ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                      const ServedModelInfo& model);

// /tokenize: either a prompt or chat messages (vLLM's two shapes).
struct TokenizeRequest {
  std::optional<std::string> model;
  std::optional<std::string> prompt;
  RequestJson messages;              // null unless the chat shape was sent (normalized as above)
  RequestJson tools;
  RequestJson chat_template_kwargs = RequestJson::object();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool add_special_tokens = true;    // default true for prompt, false for messages (vLLM)
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};

ApiResult<TokenizeRequest> parse_tokenize_request(std::string_view body, const ServedModelInfo& model);
ApiResult<DetokenizeRequest> parse_detokenize_request(std::string_view body,
                                                      const ServedModelInfo& model);

// After tokenizing: the prompt must leave room for at least one token, and prompt +
// max_tokens must fit max_model_len. Returns the completion budget to pass as
// resolve_sampling_params' max_tokens_limit (the requested max_tokens, else what is left).
ApiResult<int64_t> check_context_length(int64_t prompt_tokens, std::optional<int64_t> max_tokens,
                                        int64_t max_model_len);

}  // namespace sparkserve
