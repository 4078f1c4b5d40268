// The HTTP routes of `sparkserve serve` (serving-api.md §5) on cpp-httplib: request parsing and
// validation (openai_request.h), chat-template rendering and tokenizing on the HTTP thread,
// submission to the engine, and the response (JSON or SSE) built from the engine's events
// through the streaming detokenizer (stop strings) and the output parser (reasoning, tool
// calls). An HTTP thread never touches the model; it only drains its request's OutputChannel.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampling_params.h"
#include "runtime/token_constraint.h"
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
  ServerMetrics* metrics = nullptr;
  ServedModelInfo info;
  std::string model_root;                // /v1/models "root"
  GenerationDefaults defaults;           // eos ids already merged with the tokenizer's
  std::string api_key;                   // empty: no authentication
  size_t max_body_bytes = 0;
  double request_timeout_s = 0;          // 0: none
  std::atomic<bool> shutting_down{false};
};

// Registers every route, the API-key check and the JSON error bodies on `server`.
void install_handlers(httplib::Server& server, ServeContext& ctx);

}  // namespace sparkserve
