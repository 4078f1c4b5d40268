// Server-Sent Events framing for streamed completions (serving-api.md 5.4): each event is
// `data: <json>\n\n`, the stream ends with `data: [DONE]\n\n`, and an error after the stream
// has started (HTTP 200 already sent) goes out as `data: {"error": {...}}` before [DONE].
#pragma once

#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/openai_response.h"

namespace sparkserve {

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

std::string sse_event(const ResponseJson& payload);
// An event with a name (Anthropic's and the Responses API's streams): "event: NAME\ndata: JSON\n\n".
std::string named_sse_event(std::string_view name, const ResponseJson& payload);
// The error event followed by [DONE]: what a stream that fails midway ends with.
std::string sse_error_and_done(const ApiError& error);

}  // namespace sparkserve
