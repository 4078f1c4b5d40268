// The transport-independent interface between the HTTP server (http/server.h) and the routes
// (server/handlers.cpp and any new endpoint): a parsed request, a Responder that answers it
// (one complete response, or a streamed one with backpressure and a "client gone" signal),
// and a Router that maps method + path to a handler and says where the handler runs.
//
// Threading: handlers registered with Run::kWorker run on the server's worker pool, never on
// an I/O thread, so they may parse, render templates and tokenize. Run::kInline handlers and
// the filter run on the I/O thread: they must answer at once and never block. A Responder may
// be used from any thread; its on_wake callback runs on an I/O thread and must not block.
//
// A route answers exactly once: send(), or start_stream() + write()* + end(). Calls after the
// answer, or on a Responder whose client is gone, are ignored. Dropping the last reference to a
// Responder that never answered sends a 500, so a route cannot leave a connection hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparkserve::http {

struct Header {
  std::string name;
  std::string value;
};

// Case-insensitive ASCII comparison, as header names compare.
bool iequals(std::string_view a, std::string_view b);

struct Request {
  std::string method;  // as sent ("GET", "POST", ...)
  std::string target;  // path + "?query" as sent
  std::string path;    // target up to '?'
  std::string query;   // after '?', empty when none
  std::vector<Header> headers;
  std::string body;    // decoded (chunked framing removed), at most the server's body limit
  int version = 11;    // 10: HTTP/1.0, 11: HTTP/1.1
  std::string remote;  // peer "address:port"

  // The first value of header `name` (case-insensitive), or nullopt.
  std::optional<std::string_view> header(std::string_view name) const;
};

class Responder {
 public:
  virtual ~Responder() = default;

  // Adds a header to whatever response follows (before send / start_stream; e.g. CORS).
  virtual void add_header(std::string name, std::string value) = 0;

  // One complete response. Content-Length (and, for HTTP/1.1, keep-alive) are set here; a HEAD
  // request gets the headers only.
  virtual void send(int status, std::string_view content_type, std::string body,
                    std::vector<Header> extra = {}) = 0;

  // A streamed 200 response of unknown length: chunked for HTTP/1.1, closed at the end for
  // HTTP/1.0 (which has no chunked encoding).
  virtual void start_stream(std::string_view content_type, std::vector<Header> extra = {}) = 0;
  // Queues bytes of the stream; false when the client is gone (nothing was queued). Never
  // blocks: a producer keeps pending_bytes() under kStreamHighWater and waits for on_wake.
  virtual bool write(std::string data) = 0;
  // Ends the stream (the last chunk; the connection stays open for the next request).
  virtual void end() = 0;

  // Bytes accepted by write() that the socket has not taken yet.
  virtual size_t pending_bytes() const = 0;
  // True once the client went away: reset, closed before the answer was written, a failed or
  // stalled write, or the server closing the connection.
  virtual bool gone() const = 0;
  // Called when pending bytes fall under kStreamLowWater after being above kStreamHighWater,
  // and when the client goes away. Replaces any previous callback.
  virtual void on_wake(std::function<void()> fn) = 0;

  static constexpr size_t kStreamHighWater = 256 << 10;
  static constexpr size_t kStreamLowWater = 64 << 10;
};

using Handler = std::function<void(const Request&, std::shared_ptr<Responder>)>;

enum class Run { kWorker, kInline };

class Router {
 public:
  // Exact path match. HEAD is served by the GET route.
  void add(std::string method, std::string path, Handler handler, Run run = Run::kWorker);
  // Runs first, on the I/O thread, for every request: answering here (returning true) skips the
  // route. For cheap checks only (authentication, shutdown, CORS preflight).
  void set_filter(std::function<bool(const Request&, Responder&)> filter);
  // Unknown path (404) or known path with another method (405; `allowed` lists the methods).
  void set_not_found(std::function<void(const Request&, Responder&, int status, std::string_view allowed)> fn);

  struct Route {
    std::string method, path;
    Handler handler;
    Run run;
  };
  // Used by the server: the route for a request (nullptr: not found / not allowed, already answered).
  const Route* dispatch(const Request& req, Responder& res) const;

 private:
  std::vector<Route> routes_;
  std::function<bool(const Request&, Responder&)> filter_;
  std::function<void(const Request&, Responder&, int, std::string_view)> not_found_;
};

}  // namespace sparkserve::http
