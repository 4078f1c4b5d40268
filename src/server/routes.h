// Route groups beside the OpenAI routes of handlers.cpp; make_router adds each with the same
// `add` (which logs every request).
#pragma once

#include <functional>

#include "http/exchange.h"
#include "server/handlers.h"

namespace sparkserve {

using AddRoute = std::function<void(const char* method, const char* path, http::Handler handler, http::Run run)>;

// POST /v1/messages, /v1/messages/count_tokens (anthropic_api.h).
void add_anthropic_routes(ServeContext& ctx, const AddRoute& add);
// POST /v1/responses (responses_api.h).
void add_responses_routes(ServeContext& ctx, const AddRoute& add);
// GET / (the chat page), GET /tokenizer_info.
void add_browser_routes(ServeContext& ctx, const AddRoute& add);

}  // namespace sparkserve
