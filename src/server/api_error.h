// Errors an HTTP request can end in, in vLLM's shape: an HTTP status, a type name
// (BadRequestError, NotFoundError, ...), a message that says what is wrong and the field it is
// about. openai_response.h turns one into {"error": {"message","type","param","code"}}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sparkserve {

struct ApiError {
  int status = 400;
  std::string type = "BadRequestError";
  std::string message;
  std::optional<std::string> param;  // the request field at fault, e.g. "messages[2].role"
};

ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt);
ApiError model_not_found(const std::string& model);                 // 404
ApiError body_too_large(uint64_t body_bytes, uint64_t limit_bytes);  // 413
ApiError not_implemented(std::string message);                      // 501
ApiError internal_error(std::string message);                       // 500
ApiError engine_unavailable(std::string message);                   // 503

// A value or an ApiError (the request-path analogue of Expected<T>).
template <class T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}     // NOLINT: implicit by design
  ApiResult(ApiError e) : v_(std::move(e)) {}      // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const ApiError& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, ApiError> v_;
};

}  // namespace sparkserve
