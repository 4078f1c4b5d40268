// Cross-origin requests from browsers (Open WebUI direct connections, web apps): the CORS
// headers on every response to an allowed Origin, and preflight OPTIONS answered on every path
// before authentication (browsers send no credentials there). As vLLM: --allowed-origins
// defaults to any origin ("*"); a list restricts it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "http/exchange.h"

namespace sparkserve {

struct CorsPolicy {
  bool enabled = true;
  bool any_origin = true;
  std::vector<std::string> origins;  // when !any_origin
  bool allow_credentials = false;

  bool allows(std::string_view origin) const;
};

// "*", "" (CORS off), "https://a.example,http://localhost:3000" or a JSON list as vLLM takes it
// ('["https://a.example"]').
Expected<CorsPolicy> parse_allowed_origins(std::string_view value, bool allow_credentials);

// Adds the CORS headers for the request's Origin; answers a preflight (OPTIONS with
// Access-Control-Request-Method) and returns true then.
bool apply_cors(const CorsPolicy& policy, const http::Request& req, http::Responder& res);

}  // namespace sparkserve
