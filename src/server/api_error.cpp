#include "server/api_error.h"

namespace sparkserve {

ApiError bad_request(std::string message, std::optional<std::string> param) {
  return ApiError{400, "BadRequestError", std::move(message), std::move(param)};
}

ApiError model_not_found(const std::string& model) {
  return ApiError{404, "NotFoundError", "The model `" + model + "` does not exist.", "model"};
}

ApiError body_too_large(uint64_t body_bytes, uint64_t limit_bytes) {
  return ApiError{413, "RequestEntityTooLargeError",
                  "Request body is " + std::to_string(body_bytes) + " bytes; the limit is " +
                      std::to_string(limit_bytes) + " bytes.",
                  std::nullopt};
}

ApiError not_implemented(std::string message) {
  return ApiError{501, "NotImplementedError", std::move(message), std::nullopt};
}

ApiError internal_error(std::string message) {
  return ApiError{500, "InternalServerError", std::move(message), std::nullopt};
}

ApiError engine_unavailable(std::string message) {
  return ApiError{503, "ServiceUnavailableError", std::move(message), std::nullopt};
}

}  // namespace sparkserve
