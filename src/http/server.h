// An event-driven HTTP/1.1 server (Boost.Asio sockets, Boost.Beast's request parser) for the
// routes of exchange.h. An open connection costs a socket and a few KiB, not a thread: idle and
// slow clients never hold a worker. What it enforces while reading, before any handler runs:
//   - request head (start line + fields) at most header_limit bytes in all -> 431;
//   - body at most body_limit bytes, Content-Length or chunked, checked as the bytes arrive
//     (a too-large Content-Length is refused before reading the body) -> 413;
//   - malformed framing (Content-Length that is not a number, negative, conflicting with
//     Transfer-Encoding, bad chunk sizes) -> 400;
//   - head_timeout from the first byte of a request to the end of its head, body_timeout as
//     the longest pause inside a body -> 408; keepalive_timeout idle between requests -> close;
//   - at most max_connections open connections; one more gets a 503 with Retry-After.
// One request per connection is handled at a time; pipelined requests are parsed after the
// previous response was queued, so responses leave in request order. While a request is in
// flight the connection keeps reading: a reset or failed write marks the client gone; an
// orderly end of input (a client that half-closed and waits for its answer, or one that left)
// is answered with a `102 Processing` probe for HTTP/1.1, so a client that left resets the
// connection and is noticed within ~100 ms, while a half-closed client still gets its response.
// A response that closes the connection (errors while reading, `Connection: close`, HTTP/1.0)
// shuts down the sending side and lingers up to linger_s before closing, so the client can read
// the answer instead of a reset.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "http/exchange.h"
#include "http/task_pool.h"

namespace sparkserve::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0: any free port
  int io_threads = 1;       // threads running the sockets (the work is small: parse + copy)
  int worker_threads = 4;   // Run::kWorker handlers and whatever the routes post()
  int max_connections = 1024;
  int listen_backlog = 4096;  // the kernel caps it at net.core.somaxconn
  size_t header_limit = 64 << 10;
  size_t body_limit = 8 << 20;
  double head_timeout_s = 30;
  double body_timeout_s = 30;
  double keepalive_timeout_s = 60;
  double write_timeout_s = 60;  // a write that makes no progress this long: the client is gone
  double linger_s = 1;
  // The body of errors the server answers itself (400, 408, 413, 431, 503, 505), as JSON.
  std::function<std::string(int status, std::string_view message)> error_body;
};

class Server {
 public:
  Server(ServerOptions options, Router router);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens, starts the I/O and worker threads. Returns the bound port.
  Expected<int> start();
  // No new connections; open ones keep being served.
  void stop_accepting();
  // Closes every connection (in-flight handlers see gone()), joins the I/O threads, then the
  // workers (after their queued tasks).
  void stop();

  // Runs `task` on a worker thread (never an I/O thread).
  void post(std::function<void()> task);
  size_t open_connections() const;
  const ServerOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The reason phrase of a status code ("OK", "Not Found", ...; "" when unknown).
std::string_view status_reason(int status);

}  // namespace sparkserve::http
