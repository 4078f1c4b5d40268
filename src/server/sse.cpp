#include "server/sse.h"

namespace sparkserve {

std::string sse_event(const ResponseJson& payload) {
  // serialize_json never emits a raw newline (JSON escapes them inside strings), so one
  // `data:` line per event is always well-formed.
  return "data: " + serialize_json(payload) + "\n\n";
}

std::string sse_error_and_done(const ApiError& error) {
  return sse_event(error_json(error)) + std::string(kSseDone);
}

std::string named_sse_event(std::string_view name, const ResponseJson& payload) {
  return "event: " + std::string(name) + "\ndata: " + serialize_json(payload) + "\n\n";
}

}  // namespace sparkserve
