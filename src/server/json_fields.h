// Typed reading of request JSON: body parsing with a nesting limit, and a reader that pulls
// optional fields of one object with type checks whose errors name the field path
// ("messages[1].content", "stream_options.include_usage"). null counts as absent, as in vLLM's
// pydantic models.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace sparkserve {

using RequestJson = nlohmann::ordered_json;

// Deeper bodies are refused before nlohmann sees them: its value copies and dumps recurse, so a
// body such as 100000 '[' would overflow the stack.
inline constexpr int kMaxJsonDepth = 64;

// Deepest nesting of [ / { outside strings in JSON text; stops counting once past `limit`.
int json_nesting_depth(std::string_view text, int limit);

// The body as a JSON object, or a 400 that says where the syntax error is.
ApiResult<RequestJson> parse_json_object_body(std::string_view body);

// "a string" / "an integer" / ... for messages.
std::string json_type_phrase(const RequestJson& v);

class FieldReader {
 public:
  // obj must be an object; path is its location ("" for the request body).
  FieldReader(const RequestJson& obj, std::string path);

  // Each leaves `out` unchanged when the key is absent or null; a wrong type records an error.
  void get(const char* key, bool& out);
  void get(const char* key, std::optional<bool>& out);
  void get(const char* key, std::optional<int64_t>& out);  // integral floats accepted (2.0)
  void get(const char* key, std::optional<double>& out);
  void get(const char* key, std::optional<std::string>& out);
  // The raw value (nullptr when absent or null); marks the key as known.
  const RequestJson* raw(const char* key);

  // Records the first error only; later reads are no-ops once one is recorded.
  void fail(ApiError e);
  void fail_type(const char* key, const char* expected, const RequestJson& got);
  const std::optional<ApiError>& error() const { return error_; }
  bool ok() const { return !error_; }

  std::string field(std::string_view key) const;  // full path of a key
  std::vector<std::string> unknown_fields() const;  // keys present but never read

 private:
  const RequestJson* find(const char* key);
  const RequestJson& obj_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
  std::optional<ApiError> error_;
};

// An integer from a JSON number (integral floats accepted); nullopt if not one.
std::optional<int64_t> json_to_int64(const RequestJson& v);

}  // namespace sparkserve
