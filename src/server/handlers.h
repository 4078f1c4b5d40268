// The routes of `sparkserve serve` (serving-api.md §5) on the transport-independent interface of
// http/exchange.h: request parsing and validation (openai_request.h), chat-template rendering and
// tokenizing on a worker thread, submission to the engine, and the response (JSON or SSE) built
// from the engine's events through the streaming detokenizer (stop strings) and the output parser
// (reasoning, tool calls), stepped by GenerationJobs (generation.h). No thread waits on a request.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "http/exchange.h"
#include "runtime/engine.h"
#include "runtime/sampling_params.h"
#include "runtime/token_constraint.h"
#include "server/cors.h"
#include "server/generation.h"
#include "server/generation_prompt_suffixes.h"
#include "server/image_input.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sparkserve {

struct ServeContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  std::shared_ptr<const VocabTexts> vocab_texts;  // token texts for constrained decoding
  const ChatTemplate* chat_template = nullptr;
  std::string chat_template_error;       // why there is no chat template (missing, or its parse error)
  ServerMetrics* metrics = nullptr;
  GenerationJobs* jobs = nullptr;
  ServedModelInfo info;
  ImageInputOptions image_input;         // what image parts may use, and the model's preprocessing
  std::string model_root;                // /v1/models "root"
  GenerationDefaults defaults;           // eos ids already merged with the tokenizer's
  std::string api_key;                   // empty: no authentication ("Authorization: Bearer" or "x-api-key")
  CorsPolicy cors;                       // --allowed-origins
  size_t max_body_bytes = 0;
  size_t max_token_bytes = 0;            // bytes of the longest token (bounds text per context)
  double request_timeout_s = 0;          // 0: none
  int64_t max_waiting_requests = 0;      // engine queue beyond which new generations get 503; 0: none
  std::atomic<bool> shutting_down{false};  // new requests get 503
  std::atomic<bool> drain_expired{false};  // in-flight requests end now, with an error
  mutable GenerationPromptSuffixes generation_prompts;  // where a chat prompt's generation prompt starts
};

// Every route, the API-key check and the JSON error bodies.
http::Router make_router(ServeContext& ctx);

// The body of an error the transport answers itself (OpenAI's error object).
std::string transport_error_body(int status, std::string_view message);

}  // namespace sparkserve
