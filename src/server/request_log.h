// One log line per finished HTTP request (serve logs at INFO): id, method and route, status,
// prompt / cached / generated tokens, time to first token, duration, finish reason. Routes are
// wrapped in a LoggedResponder (logged_handler); the generation code fills its record.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "http/exchange.h"

namespace sparkserve {

struct RequestRecord {
  std::string id;  // the response id when there is one (chatcmpl-..., msg_..., resp_...)
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  std::optional<double> ttft_s;
  std::string finish_reason;
};

class LoggedResponder : public http::Responder {
 public:
  LoggedResponder(std::shared_ptr<http::Responder> inner, std::string method, std::string path);
  ~LoggedResponder() override;

  void add_header(std::string name, std::string value) override { inner_->add_header(std::move(name), std::move(value)); }
  void send(int status, std::string_view content_type, std::string body, std::vector<http::Header> extra) override;
  void start_stream(std::string_view content_type, std::vector<http::Header> extra) override;
  bool write(std::string data) override { return inner_->write(std::move(data)); }
  void end() override;
  size_t pending_bytes() const override { return inner_->pending_bytes(); }
  bool gone() const override { return inner_->gone(); }
  void on_wake(std::function<void()> fn) override { inner_->on_wake(std::move(fn)); }

  // Filled by the route (under the lock: a generation step may run on any worker).
  void update(const std::function<void(RequestRecord&)>& fn);

 private:
  void log_once(int status, const char* how);
  std::shared_ptr<http::Responder> inner_;
  std::string method_, path_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  RequestRecord rec_;
  int status_ = 0;
  bool logged_ = false;
};

// The handler with its responder wrapped, so the request is logged when it is answered.
http::Handler logged_handler(std::string method, std::string path, http::Handler handler);

// serve --disable-log-requests turns the lines off.
void set_request_logging(bool on);

// The record of a logged request (nullptr for a responder that is not a LoggedResponder).
LoggedResponder* request_log(http::Responder& res);

}  // namespace sparkserve
