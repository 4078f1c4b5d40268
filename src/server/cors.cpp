#include "server/cors.h"

#include <nlohmann/json.hpp>

namespace sparkserve {
namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '/')) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

bool CorsPolicy::allows(std::string_view origin) const {
  if (!enabled) return false;
  if (any_origin) return true;
  const std::string o = trim(origin);
  for (const auto& a : origins)
    if (a == o) return true;
  return false;
}

Expected<CorsPolicy> parse_allowed_origins(std::string_view value, bool allow_credentials) {
  CorsPolicy p;
  p.allow_credentials = allow_credentials;
  std::vector<std::string> items;
  const std::string v = trim(value);
  if (v.empty()) {
    p.enabled = false;
    return p;
  }
  if (v.front() == '[') {
    try {
      for (const auto& x : nlohmann::json::parse(v)) {
        if (!x.is_string()) return make_error("--allowed-origins: the JSON list must hold strings");
        items.push_back(trim(x.get<std::string>()));
      }
    } catch (const nlohmann::json::exception& e) {
      return make_error(std::string("--allowed-origins: not a JSON list: ") + e.what());
    }
  } else {
    size_t start = 0;
    while (start <= v.size()) {
      size_t comma = v.find(',', start);
      if (comma == std::string::npos) comma = v.size();
      std::string item = trim(std::string_view(v).substr(start, comma - start));
      if (!item.empty()) items.push_back(item);
      start = comma + 1;
    }
  }
  p.any_origin = false;
  for (auto& o : items) {
    if (o == "*") p.any_origin = true;
    else if (o.find("://") == std::string::npos)
      return make_error("--allowed-origins: \"" + o + "\" is not an origin (scheme://host[:port]) or \"*\"");
    else p.origins.push_back(o);
  }
  if (items.empty()) p.enabled = false;
  return p;
}

bool apply_cors(const CorsPolicy& policy, const http::Request& req, http::Responder& res) {
  const auto origin = req.header("Origin");
  const bool preflight = req.method == "OPTIONS" && origin && req.header("Access-Control-Request-Method");
  if (!origin || !policy.enabled) {
    if (preflight) {
      res.send(400, "text/plain", "CORS is disabled on this server (--allowed-origins)");
      return true;
    }
    return false;
  }
  if (!policy.allows(*origin)) {
    if (preflight) {
      res.send(400, "text/plain", "Disallowed CORS origin");
      return true;
    }
    return false;  // no CORS headers: the browser refuses the response
  }
  // With credentials the origin must be echoed, never "*".
  const std::string allow = policy.any_origin && !policy.allow_credentials ? "*" : std::string(*origin);
  std::vector<http::Header> h = {{"Access-Control-Allow-Origin", allow}};
  if (allow != "*") h.push_back({"Vary", "Origin"});
  if (policy.allow_credentials) h.push_back({"Access-Control-Allow-Credentials", "true"});
  if (preflight) {
    h.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
    const auto asked = req.header("Access-Control-Request-Headers");
    h.push_back({"Access-Control-Allow-Headers", asked ? std::string(*asked) : std::string("*")});
    h.push_back({"Access-Control-Max-Age", "600"});
    res.send(204, "", "", std::move(h));
    return true;
  }
  h.push_back({"Access-Control-Expose-Headers", "*"});
  for (auto& x : h) res.add_header(std::move(x.name), std::move(x.value));
  return false;
}

}  // namespace sparkserve
