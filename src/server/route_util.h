// What every generating route shares (OpenAI chat and completions, Anthropic Messages, OpenAI
// Responses): encoding the prompt, sampling parameters and constraints, starting the engine
// requests (one per choice), and driving them to one JSON response or an SSE stream with the
// route's own formats, filling the request's log record on the way.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "http/exchange.h"
#include "server/api_error.h"
#include "server/generation.h"
#include "server/handlers.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace sparkserve {

using ResponderPtr = std::shared_ptr<http::Responder>;
using GenerationPtr = std::shared_ptr<Generation>;

void send_error(http::Responder& res, const ApiError& e, std::vector<http::Header> extra = {});
// The headers an error response carries: Retry-After on a 503 (overload, shutdown).
std::vector<http::Header> error_headers(const ApiError& e);
void send_json(http::Responder& res, const ResponseJson& j);

ApiError no_chat_template(const ServeContext& ctx);
ApiError shutdown_error();
ApiError drained_error();
// A bounded engine queue: past it a new generation is refused at once (503 + Retry-After).
std::optional<ApiError> overloaded(const ServeContext& ctx);

// Text longer than this cannot fit in the context whatever it holds (each token covers at most
// ctx.max_token_bytes bytes, and NFC normalization shrinks UTF-8 at most 3x: three 3-byte Hangul
// jamo compose into one 3-byte syllable), so it is refused before tokenizing: the work and the
// memory of a request stay proportional to the context, not to the body.
std::optional<ApiError> over_context_bytes(const ServeContext& ctx, size_t bytes, const char* what, const char* param);

// Plain text -> ids (BOS first when the tokenizer adds one and add_special is set).
ApiResult<std::vector<int32_t>> encode_text(const ServeContext& ctx, const std::string& text, bool add_special,
                                            const char* param);

// A chat prompt: token ids (each image placeholder expanded to its image's token count) and the
// images with their M-RoPE positions (null for text).
struct ChatPrompt {
  std::vector<int32_t> ids;
  std::shared_ptr<MultimodalPrompt> mm;
};

// Chat messages rendered with the model's chat template (ctx.chat_template must be set), then
// tokenized; the messages' images decoded and their placeholders expanded. Errors are 400s on
// "messages" (or the image part at fault). generation_prompt_start (optional): where the template's
// generation prompt begins in the ids (-1 when there is none or it cannot be told), the point from
// which the next turn of the conversation renders this turn's reply differently.
ApiResult<ChatPrompt> encode_chat(const ServeContext& ctx, const RequestJson& messages, const RequestJson& tools,
                                  bool add_generation_prompt, const RequestJson& chat_template_kwargs,
                                  int64_t* generation_prompt_start = nullptr);

// chat_template_kwargs.enable_thinking is not exactly false.
bool thinking_enabled(const RequestJson& chat_template_kwargs);

// The `n` generations of a chat request (not yet submitted): prompt rendered and tokenized (with
// its images, and the prefix cache's hint where the generation prompt starts), context checked,
// sampling resolved (choice i > 0 of a seeded request uses seed + i), the constraint of
// tool_choice required / named or of structured outputs, and the output parser.
ApiResult<std::vector<GenerationPtr>> start_chat(ServeContext& ctx, const ChatRequest& r);
// The generations of a completion request: n per prompt, prompt-major.
ApiResult<std::vector<GenerationPtr>> start_completion(ServeContext& ctx, const CompletionRequest& r);

// Usage over choices: prompt tokens (and cached tokens, once known) once per distinct prompt,
// completion tokens of all.
UsageInfo usage_of(const std::vector<GenerationPtr>& gens, size_t choices_per_prompt = 0);

// How a route answers failures (its own error object).
using ErrorSender = std::function<void(http::Responder&, const ApiError&)>;

// Submits the generations and answers once all are done: `respond` (or `fail` with the first
// generation error).
void run_to_json(ServeContext& ctx, std::vector<GenerationPtr> gens, ResponderPtr res, std::function<void()> respond,
                 ErrorSender fail = nullptr);  // null: OpenAI's error object

struct StreamFns {
  std::function<std::string()> opening;                             // sent at once (may be empty)
  std::function<std::string(size_t choice, const Piece&)> chunk;    // one piece's events ("": nothing)
  std::function<std::string()> closing;                             // after every choice ended
  std::function<std::string(const ApiError&)> error;                // ends a failed stream
};

// Submits the generations and streams them as SSE: the opening, one event string per piece,
// then the closing events. A reader that falls behind pauses the stream (the engine's tokens
// wait in the channels). A generation error mid-stream ends it with fns.error.
void run_to_stream(ServeContext& ctx, std::vector<GenerationPtr> gens, ResponderPtr res, StreamFns fns);

}  // namespace sparkserve
