#include "server/request_log.h"

#include <atomic>
#include <cstdio>

#include "core/log.h"

namespace sparkserve {
namespace {
std::atomic<bool> g_log_requests{true};
}  // namespace

void set_request_logging(bool on) { g_log_requests.store(on); }

LoggedResponder::LoggedResponder(std::shared_ptr<http::Responder> inner, std::string method, std::string path)
    : inner_(std::move(inner)), method_(std::move(method)), path_(std::move(path)) {}

LoggedResponder::~LoggedResponder() {
  // A stream that never ended: the client went away (or the server dropped it).
  log_once(status_ != 0 ? status_ : 500, inner_->gone() ? "client gone" : "unfinished");
}

void LoggedResponder::send(int status, std::string_view content_type, std::string body, std::vector<http::Header> extra) {
  log_once(status, nullptr);  // before the answer leaves: whoever got it can read the line
  inner_->send(status, content_type, std::move(body), std::move(extra));
}

void LoggedResponder::start_stream(std::string_view content_type, std::vector<http::Header> extra) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = 200;
  }
  inner_->start_stream(content_type, std::move(extra));
}

void LoggedResponder::end() {
  log_once(200, nullptr);
  inner_->end();
}

void LoggedResponder::update(const std::function<void(RequestRecord&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  fn(rec_);
}

void LoggedResponder::log_once(int status, const char* how) {
  RequestRecord r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (logged_) return;
    logged_ = true;
    r = rec_;
  }
  if (!g_log_requests.load() || !log_enabled(LogLevel::kInfo)) return;
  const double dur = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char times[96];
  if (r.ttft_s) std::snprintf(times, sizeof times, "ttft=%.3fs duration=%.3fs", *r.ttft_s, dur);
  else std::snprintf(times, sizeof times, "ttft=- duration=%.3fs", dur);
  std::string line = "request " + (r.id.empty() ? std::string("-") : r.id) + " " + method_ + " " + path_ + " " +
                     std::to_string(status) + " prompt=" + std::to_string(r.prompt_tokens) +
                     " cached=" + std::to_string(r.cached_tokens) + " generated=" + std::to_string(r.generated_tokens) +
                     " " + times + " finish=" + (r.finish_reason.empty() ? std::string("-") : r.finish_reason);
  if (how) line += std::string(" (") + how + ")";
  log_line(LogLevel::kInfo, line);
}

http::Handler logged_handler(std::string method, std::string path, http::Handler handler) {
  return [method = std::move(method), path = std::move(path), handler = std::move(handler)](
             const http::Request& req, std::shared_ptr<http::Responder> res) {
    handler(req, std::make_shared<LoggedResponder>(std::move(res), method, path));
  };
}

LoggedResponder* request_log(http::Responder& res) { return dynamic_cast<LoggedResponder*>(&res); }

}  // namespace sparkserve
