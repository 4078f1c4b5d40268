#include "http/exchange.h"

namespace sparkserve::http {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::optional<std::string_view> Request::header(std::string_view name) const {
  for (const auto& h : headers)
    if (iequals(h.name, name)) return std::string_view(h.value);
  return std::nullopt;
}

void Router::add(std::string method, std::string path, Handler handler, Run run) {
  routes_.push_back(Route{std::move(method), std::move(path), std::move(handler), run});
}

void Router::set_filter(std::function<bool(const Request&, Responder&)> filter) { filter_ = std::move(filter); }

void Router::set_not_found(std::function<void(const Request&, Responder&, int, std::string_view)> fn) {
  not_found_ = std::move(fn);
}

const Router::Route* Router::dispatch(const Request& req, Responder& res) const {
  if (filter_ && filter_(req, res)) return nullptr;
  const std::string_view method = req.method == "HEAD" ? std::string_view("GET") : std::string_view(req.method);
  std::string allowed;
  for (const auto& r : routes_) {
    if (r.path != req.path) continue;
    if (r.method == method) return &r;
    allowed += allowed.empty() ? r.method : ", " + r.method;
  }
  const int status = allowed.empty() ? 404 : 405;
  if (not_found_) not_found_(req, res, status, allowed);
  else res.send(status, "text/plain", status == 404 ? "not found\n" : "method not allowed\n");
  return nullptr;
}

}  // namespace sparkserve::http
