#include "http/server.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace sparkserve::http {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string_view status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 102: return "Processing";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
  }
}

namespace {

using Clock = std::chrono::steady_clock;
using Parser = bhttp::request_parser<bhttp::string_body>;

constexpr size_t kReadChunk = 64 << 10;
// Bytes of pipelined input kept while a request is in flight; reading pauses above it.
constexpr size_t kPipelinedLimit = 64 << 10;
constexpr auto kGonePoll = std::chrono::milliseconds(100);
// Rejected connections (over max_connections) lingering at once; more are closed at once.
constexpr int kMaxLingeringRejects = 256;

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

std::string_view sv(boost::beast::string_view s) { return {s.data(), s.size()}; }

std::string head_line(int status) {
  std::string s = "HTTP/1.1 " + std::to_string(status) + " ";
  s += status_reason(status);
  s += "\r\n";
  return s;
}

class Connection;

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  Router router;
  asio::io_context ioc;
  tcp::acceptor acceptor{asio::make_strand(ioc)};  // accepts, retries and the close: one strand
  asio::steady_timer accept_retry{acceptor.get_executor()};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  std::mutex workers_mu;
  std::unique_ptr<TaskPool> workers;  // null once stopped: tasks posted then are dropped
  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(workers_mu);
    if (workers) workers->post(std::move(task));
  }
  std::atomic<int> open{0};
  std::atomic<int> lingering_rejects{0};
  std::atomic<bool> accepting{false};
  std::atomic<bool> stopped{false};
  std::mutex conns_mu;
  uint64_t next_conn_id = 0;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> conns;

  std::string error_json(int status, std::string_view message) const;
  // A complete error response the server answers itself.
  std::string error_response(int status, std::string_view message, bool close, std::string_view extra = {}) const;
  void do_accept();
  void on_accept(error_code ec, tcp::socket sock);
};

namespace {

// One client connection; every member is used on its strand only, except the atomics and the
// wake callback (its own mutex), which Responder calls read from other threads.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server::Impl& srv, tcp::socket sock, bool counted)
      : srv_(srv), sock_(std::move(sock)), timer_(sock_.get_executor()), write_timer_(sock_.get_executor()),
        poll_timer_(sock_.get_executor()), buf_(srv.opt.header_limit + kReadChunk), counted_(counted) {}

  // rejected: over max_connections: the connection gets a 503 and is closed.
  void start(uint64_t id, bool rejected) {
    id_ = id;
    error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    if (rejected) {
      phase_ = Phase::kInFlight;  // nothing is parsed; after the answer it lingers and closes
      keep_alive_ = false;
      answered_ = true;
      queue(srv_.error_response(503, "too many open connections (--max-connections " +
                                         std::to_string(srv_.opt.max_connections) + "); retry later",
                                true, "Retry-After: 1\r\n"));
      close_after_write_ = true;
      return;
    }
    arm(Phase::kIdle, srv_.opt.head_timeout_s);
    do_read();
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    mark_gone();
    error_code ec;
    timer_.cancel();
    write_timer_.cancel();
    poll_timer_.cancel();
    sock_.close(ec);
    if (counted_) srv_.open.fetch_sub(1);
    else srv_.lingering_rejects.fetch_sub(1);
    std::lock_guard<std::mutex> lock(srv_.conns_mu);
    srv_.conns.erase(id_);
  }

  // ---- called by ResponderImpl (any thread) ----
  std::atomic<size_t> pending{0};
  std::atomic<bool> gone{false};
  // Set by a producer that saw pending above kStreamHighWater: the next drain under
  // kStreamLowWater wakes it.
  std::atomic<bool> want_wake{false};
  // The wake callback of request `serial` (a finished request's Responder clears only its own).
  void set_wake(uint64_t serial, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(wake_mu_);
    if (!fn && serial != wake_serial_) return;
    wake_serial_ = serial;
    wake_ = std::move(fn);
  }
  void wake() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      fn = wake_;
    }
    if (fn) fn();
  }
  template <class F>
  void on_strand(F&& f) {
    asio::post(sock_.get_executor(), std::forward<F>(f));
  }

  // ---- strand only ----
  void add_header(uint64_t serial, std::string line) {
    if (serial == serial_ && !answered_) extra_headers_ += line;
  }
  void send(uint64_t serial, int status, std::string_view ctype, std::string body, const std::vector<Header>& extra) {
    if (serial != serial_ || answered_ || closed_) return;
    answered_ = true;
    std::string head = head_line(status);
    head += extra_headers_;
    for (const auto& h : extra) head += h.name + ": " + h.value + "\r\n";
    if (!ctype.empty()) head += "Content-Type: " + std::string(ctype) + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    if (!keep_alive_) head += "Connection: close\r\n";
    else if (version_ == 10) head += "Connection: keep-alive\r\n";
    head += "\r\n";
    if (!head_only_) head += body;
    queue(std::move(head));
    response_done();
  }
  void start_stream(uint64_t serial, std::string_view ctype, const std::vector<Header>& extra) {
    if (serial != serial_ || answered_ || closed_) return;
    answered_ = true;
    streaming_ = true;
    chunked_ = version_ == 11 && !head_only_;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the stream is the end of the connection
    std::string head = head_line(200);
    head += extra_headers_;
    for (const auto& h : extra) head += h.name + ": " + h.value + "\r\n";
    head += "Content-Type: " + std::string(ctype) + "\r\nCache-Control: no-cache\r\n";
    if (chunked_) head += "Transfer-Encoding: chunked\r\n";
    if (!keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    queue(std::move(head));
    if (head_only_) response_done();
  }
  void write(uint64_t serial, std::string data, size_t counted) {
    if (serial != serial_ || !streaming_ || stream_ended_ || closed_ || head_only_) {
      settle(counted);
      return;
    }
    if (data.empty()) {
      settle(counted);
      return;
    }
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      std::string framed = size;
      framed += data;
      framed += "\r\n";
      queue(std::move(framed), counted);
    } else {
      queue(std::move(data), counted);
    }
  }
  void end(uint64_t serial) {
    if (serial != serial_ || !streaming_ || stream_ended_ || closed_) return;
    stream_ended_ = true;
    if (head_only_) return;
    if (chunked_) queue("0\r\n\r\n");
    response_done();
  }
  // The Responder was dropped without answering: a route bug; the client still gets an answer.
  void abandoned(uint64_t serial) {
    if (serial != serial_ || closed_) return;
    if (!answered_) {
      keep_alive_ = false;
      send(serial, 500, "application/json", srv_.error_json(500, "the request handler gave no response"), {});
    } else if (streaming_ && !stream_ended_) {
      keep_alive_ = false;  // the stream cannot be finished properly: cut the connection
      stream_ended_ = true;
      close_after_write_ = true;
      after_writes();
    }
  }

 private:
  enum class Phase { kIdle, kHead, kBody, kInFlight, kClosing };

  void arm(Phase p, double seconds) {
    phase_ = p;
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(ms(seconds));
    timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->timer_gen_ || self->closed_) return;
      self->on_timeout();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void on_timeout() {
    switch (phase_) {
      case Phase::kIdle:
        if (!writing_) close_now();
        else arm(Phase::kIdle, srv_.opt.keepalive_timeout_s);
        break;
      case Phase::kHead:
        fail(408, "the request head did not arrive within " + fmt(srv_.opt.head_timeout_s) + " s");
        break;
      case Phase::kBody:
        fail(408, "the request body stalled for " + fmt(srv_.opt.body_timeout_s) + " s");
        break;
      case Phase::kClosing:
        close_now();
        break;
      case Phase::kInFlight:
        break;
    }
  }
  static std::string fmt(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
  }

  void do_read() {
    if (reading_ || closed_ || peer_eof_) return;
    size_t cap = buf_.max_size() - buf_.size();
    if (phase_ == Phase::kInFlight) cap = buf_.size() >= kPipelinedLimit ? 0 : kPipelinedLimit - buf_.size();
    if (phase_ == Phase::kClosing) buf_.consume(buf_.size()), cap = kReadChunk;
    const size_t n = std::min(cap, kReadChunk);
    if (n == 0) {  // pipelined input is full: stop reading, but still notice a reset
      start_gone_poll();
      return;
    }
    reading_ = true;
    sock_.async_read_some(buf_.prepare(n), [self = shared_from_this()](error_code ec, size_t got) {
      self->on_read(ec, got);
    });
  }

  void on_read(error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec == asio::error::eof) return on_eof();
    if (ec) return close_now();  // reset or another socket error: the client is gone
    buf_.commit(n);
    switch (phase_) {
      case Phase::kClosing:
        buf_.consume(buf_.size());
        break;
      case Phase::kIdle:
        arm(Phase::kHead, srv_.opt.head_timeout_s);
        parse();
        break;
      case Phase::kHead:
        parse();
        break;
      case Phase::kBody:
        arm(Phase::kBody, srv_.opt.body_timeout_s);  // the body timeout is per pause
        parse();
        break;
      case Phase::kInFlight:
        break;  // pipelined: parsed once the current response is queued
    }
    do_read();
  }

  void on_eof() {
    peer_eof_ = true;
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kClosing:
        close_after_write_ = true;
        after_writes();
        break;
      case Phase::kHead:
      case Phase::kBody: {
        // The client stopped sending in the middle of a request. Tell it, if it still listens.
        fail(400, "the connection ended in the middle of a request");
        break;
      }
      case Phase::kInFlight:
        // Half-closed and waiting, or gone: probe with an interim response (HTTP/1.1 clients
        // must accept 1xx before the final one); a client that left answers it with a reset.
        if (!answered_ && version_ == 11) queue(head_line(102) + "\r\n");
        start_gone_poll();
        break;
    }
  }

  // While a request is in flight and the reader cannot tell (end of input seen, or reading
  // paused), poll the socket for a reset / hang-up.
  void start_gone_poll() {
    if (polling_ || closed_) return;
    polling_ = true;
    poll_timer_.expires_after(kGonePoll);
    poll_timer_.async_wait([self = shared_from_this()](error_code ec) {
      self->polling_ = false;
      if (ec || self->closed_) return;
      pollfd p{self->sock_.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return self->close_now();
      if (self->phase_ == Phase::kInFlight || self->writing_) self->start_gone_poll();
    });
  }

  void parse() {
    while (!closed_ && (phase_ == Phase::kHead || phase_ == Phase::kBody) && buf_.size() > 0) {
      if (!parser_) {
        parser_.emplace();
        parser_->header_limit(static_cast<std::uint32_t>(srv_.opt.header_limit));
        parser_->body_limit(srv_.opt.body_limit);
      }
      error_code ec;
      const size_t used = parser_->put(buf_.data(), ec);
      buf_.consume(used);
      if (ec == bhttp::error::need_more) {
        if (phase_ == Phase::kHead && buf_.size() > srv_.opt.header_limit)
          return fail(431, "the request head is over the limit of " + std::to_string(srv_.opt.header_limit) + " bytes");
        break;
      }
      if (ec) return fail_parse(ec);
      if (phase_ == Phase::kHead && parser_->is_header_done()) {
        if (!on_header()) return;
        arm(Phase::kBody, srv_.opt.body_timeout_s);
      }
      if (parser_->is_done()) return dispatch();
      if (used == 0) break;
    }
  }

  void fail_parse(const error_code& ec) {
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
      return fail(431, "the request head is over the limit of " + std::to_string(srv_.opt.header_limit) + " bytes");
    if (ec == bhttp::error::body_limit) {
      std::string what = "the request body is over the limit of " + std::to_string(srv_.opt.body_limit) + " bytes";
      if (parser_ && parser_->is_header_done())
        if (auto len = parser_->content_length()) what += " (Content-Length: " + std::to_string(*len) + ")";
      return fail(413, what);
    }
    if (ec == bhttp::error::bad_version) return fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    if (ec == bhttp::error::bad_content_length) return fail(400, "malformed Content-Length");
    if (ec == bhttp::error::bad_transfer_encoding)
      return fail(400, "unsupported or conflicting Transfer-Encoding / Content-Length");
    fail(400, "malformed HTTP request: " + ec.message());
  }

  bool on_header() {
    const auto& h = parser_->get();
    const unsigned v = h.version();
    if (v != 10 && v != 11) {
      fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
      return false;
    }
    auto expect = h.find(bhttp::field::expect);
    if (expect != h.end() && v == 11 && !parser_->is_done()) {
      if (!iequals(sv(expect->value()), "100-continue")) {
        fail(417, "unsupported Expect: " + std::string(sv(expect->value())));
        return false;
      }
      queue(head_line(100) + "\r\n");
    }
    return true;
  }

  void dispatch() {
    auto msg = parser_->release();
    parser_.reset();
    disarm();
    phase_ = Phase::kInFlight;
    ++serial_;
    answered_ = streaming_ = chunked_ = stream_ended_ = false;
    extra_headers_.clear();
    version_ = msg.version();
    keep_alive_ = msg.keep_alive() && srv_.accepting.load();  // draining: close after this one
    auto req = std::make_shared<Request>();
    req->method = std::string(sv(msg.method_string()));
    req->target = std::string(sv(msg.target()));
    const size_t q = req->target.find('?');
    req->path = req->target.substr(0, q);
    if (q != std::string::npos) req->query = req->target.substr(q + 1);
    for (const auto& f : msg) req->headers.push_back(Header{std::string(sv(f.name_string())), std::string(sv(f.value()))});
    req->body = std::move(msg.body());
    req->version = static_cast<int>(version_);
    error_code ec;
    auto ep = sock_.remote_endpoint(ec);
    if (!ec) req->remote = ep.address().to_string() + ":" + std::to_string(ep.port());
    head_only_ = req->method == "HEAD";
    auto res = make_responder();
    const Router::Route* route = srv_.router.dispatch(*req, *res);
    if (route) {
      if (route->run == Run::kInline) {
        route->handler(*req, std::move(res));
      } else {
        const Handler* h = &route->handler;
        srv_.post([h, req, res = std::move(res)]() mutable { (*h)(*req, std::move(res)); });
      }
    }
  }

  std::shared_ptr<Responder> make_responder();

  void fail(int status, const std::string& message) {
    parser_.reset();
    phase_ = Phase::kInFlight;
    ++serial_;
    answered_ = true;
    keep_alive_ = false;
    queue(srv_.error_response(status, message, true));
    close_after_write_ = true;
    after_writes();
  }

  // The current response is fully queued: go on with the next request (pipelined bytes may
  // already be here) or close.
  void response_done() {
    phase_ = Phase::kIdle;
    if (!keep_alive_) {
      close_after_write_ = true;
      after_writes();
      return;
    }
    arm(Phase::kIdle, srv_.opt.keepalive_timeout_s);
    if (buf_.size() > 0) {
      arm(Phase::kHead, srv_.opt.head_timeout_s);
      parse();
    }
    if (closed_) return;
    if (peer_eof_ && phase_ == Phase::kIdle) {  // nothing more will come
      close_after_write_ = true;
      after_writes();
      return;
    }
    if (peer_eof_ && (phase_ == Phase::kHead || phase_ == Phase::kBody))
      return fail(400, "the connection ended in the middle of a request");
    do_read();
  }

  void queue(std::string s, size_t counted = 0) {
    if (closed_) {
      settle(counted);
      return;
    }
    // Bytes not counted by Responder::write are counted here, so pending covers all queued output.
    if (s.size() > counted) pending.fetch_add(s.size() - counted);
    else if (counted > s.size()) pending.fetch_sub(counted - s.size());
    outq_.push_back(std::move(s));
    if (!writing_) do_write();
  }
  // Bytes a write() counted that will never be queued.
  void settle(size_t counted) {
    if (counted) pending.fetch_sub(counted);
  }

  void do_write() {
    if (outq_.empty() || closed_) return;
    writing_ = true;
    std::vector<asio::const_buffer> bufs;
    size_t bytes = 0;
    for (size_t i = 0; i < outq_.size() && i < 64; ++i) {
      bufs.push_back(asio::buffer(outq_[i]));
      bytes += outq_[i].size();
    }
    const size_t count = bufs.size();
    const uint64_t gen = ++write_gen_;
    write_timer_.expires_after(ms(srv_.opt.write_timeout_s));
    write_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (!ec && gen == self->write_gen_ && self->writing_) self->close_now();  // stalled reader
    });
    asio::async_write(sock_, bufs, [self = shared_from_this(), count, bytes](error_code ec, size_t) {
      self->on_write(ec, count, bytes);
    });
  }

  void on_write(error_code ec, size_t count, size_t bytes) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    if (closed_) return;
    if (ec) return close_now();
    outq_.erase(outq_.begin(), outq_.begin() + static_cast<std::ptrdiff_t>(count));
    const size_t left = pending.fetch_sub(bytes) - bytes;
    if (left < Responder::kStreamLowWater && want_wake.exchange(false)) wake();
    if (!outq_.empty()) return do_write();
    after_writes();
  }

  // When everything queued is written and the connection is to close: stop sending and
  // linger, discarding input, until the client closes or linger_s passes.
  void after_writes() {
    if (writing_ || !outq_.empty() || !close_after_write_ || closed_ || phase_ == Phase::kClosing) return;
    if (peer_eof_) return close_now();
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    arm(Phase::kClosing, srv_.opt.linger_s);
    do_read();
  }

  void mark_gone() {
    if (!gone.exchange(true)) wake();
  }

  Server::Impl& srv_;
  tcp::socket sock_;
  asio::steady_timer timer_, write_timer_, poll_timer_;
  boost::beast::flat_buffer buf_;
  std::optional<Parser> parser_;
  bool counted_;
  uint64_t id_ = 0;
  Phase phase_ = Phase::kIdle;
  uint64_t timer_gen_ = 0, write_gen_ = 0;
  bool reading_ = false, writing_ = false, polling_ = false, closed_ = false, peer_eof_ = false;
  bool close_after_write_ = false;
  std::deque<std::string> outq_;
  // The request in flight.
  uint64_t serial_ = 0;
  unsigned version_ = 11;
  bool keep_alive_ = true, head_only_ = false;
  bool answered_ = false, streaming_ = false, chunked_ = false, stream_ended_ = false;
  std::string extra_headers_;
  std::mutex wake_mu_;
  uint64_t wake_serial_ = 0;
  std::function<void()> wake_;
};

class ResponderImpl : public Responder {
 public:
  ResponderImpl(std::shared_ptr<Connection> c, uint64_t serial) : c_(std::move(c)), serial_(serial) {}
  ~ResponderImpl() override {
    c_->set_wake(serial_, nullptr);
    if (!finished_.load()) c_->on_strand([c = c_, s = serial_] { c->abandoned(s); });
  }
  void add_header(std::string name, std::string value) override {
    c_->on_strand([c = c_, s = serial_, line = name + ": " + value + "\r\n"]() mutable { c->add_header(s, std::move(line)); });
  }
  void send(int status, std::string_view content_type, std::string body, std::vector<Header> extra) override {
    if (finished_.exchange(true)) return;
    c_->on_strand([c = c_, s = serial_, status, ct = std::string(content_type), b = std::move(body),
                   e = std::move(extra)]() mutable { c->send(s, status, ct, std::move(b), e); });
  }
  void start_stream(std::string_view content_type, std::vector<Header> extra) override {
    if (started_.exchange(true) || finished_.load()) return;
    c_->on_strand([c = c_, s = serial_, ct = std::string(content_type), e = std::move(extra)] {
      c->start_stream(s, ct, e);
    });
  }
  bool write(std::string data) override {
    if (c_->gone.load() || finished_.load() || !started_.load()) return false;
    const size_t n = data.size();
    if (c_->pending.fetch_add(n) + n > kStreamHighWater) c_->want_wake.store(true);
    c_->on_strand([c = c_, s = serial_, d = std::move(data), n]() mutable { c->write(s, std::move(d), n); });
    return true;
  }
  void end() override {
    if (!started_.load() || finished_.exchange(true)) return;
    c_->on_strand([c = c_, s = serial_] { c->end(s); });
  }
  size_t pending_bytes() const override { return c_->pending.load(); }
  bool gone() const override { return c_->gone.load(); }
  void on_wake(std::function<void()> fn) override { c_->set_wake(serial_, std::move(fn)); }

 private:
  std::shared_ptr<Connection> c_;
  uint64_t serial_;
  std::atomic<bool> started_{false}, finished_{false};
};

std::shared_ptr<Responder> Connection::make_responder() {
  return std::make_shared<ResponderImpl>(shared_from_this(), serial_);
}

}  // namespace

std::string Server::Impl::error_json(int status, std::string_view message) const {
  if (opt.error_body) return opt.error_body(status, message);
  std::string body = "{\"error\": {\"code\": " + std::to_string(status) + ", \"message\": \"";
  for (char c : message) body += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return body + "\"}}";
}

std::string Server::Impl::error_response(int status, std::string_view message, bool close, std::string_view extra) const {
  std::string body = error_json(status, message);
  std::string s = head_line(status);
  s += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  s += extra;
  if (close) s += "Connection: close\r\n";
  s += "\r\n";
  s += body;
  return s;
}

void Server::Impl::do_accept() {
  if (!accepting.load()) return;
  acceptor.async_accept(asio::make_strand(ioc), [this](error_code ec, tcp::socket sock) { on_accept(ec, std::move(sock)); });
}

void Server::Impl::on_accept(error_code ec, tcp::socket sock) {
  if (!accepting.load()) return;
  if (ec) {
    // Out of descriptors (EMFILE) and the like: try again shortly instead of spinning.
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](error_code e) {
      if (!e) do_accept();
    });
    return;
  }
  const bool over = open.load() >= opt.max_connections;
  if (over && lingering_rejects.load() >= kMaxLingeringRejects) {
    error_code ignored;
    sock.close(ignored);
    return do_accept();
  }
  (over ? lingering_rejects : open).fetch_add(1);
  auto c = std::make_shared<Connection>(*this, std::move(sock), !over);
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(conns_mu);
    id = ++next_conn_id;
    conns.emplace(id, c);
  }
  c->on_strand([c, id, over] { c->start(id, over); });
  do_accept();
}

Server::Server(ServerOptions options, Router router) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->router = std::move(router);
}

Server::~Server() { stop(); }

Expected<int> Server::start() {
  Impl& s = *impl_;
  error_code ec;
  auto addr = asio::ip::make_address(s.opt.host, ec);
  if (ec) return Error{"cannot listen on '" + s.opt.host + "': not an IP address"};
  tcp::endpoint ep(addr, static_cast<unsigned short>(s.opt.port));
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (!ec) s.acceptor.listen(s.opt.listen_backlog, ec);
  if (ec) return Error{"cannot listen on " + s.opt.host + ":" + std::to_string(s.opt.port) + ": " + ec.message()};
  const int port = s.acceptor.local_endpoint().port();
  {
    std::lock_guard<std::mutex> lock(s.workers_mu);
    s.workers = std::make_unique<TaskPool>(std::max(1, s.opt.worker_threads));
  }
  s.work.emplace(s.ioc.get_executor());
  s.accepting.store(true);
  asio::post(s.acceptor.get_executor(), [&s] { s.do_accept(); });
  for (int i = 0; i < std::max(1, s.opt.io_threads); ++i)
    s.io_threads.emplace_back([&s] {
      // The I/O thread's work is tiny but latency-bound (/health, accepts, stream writes) while the
      // model's threads are throughput-bound: on a busy machine a slightly higher priority keeps
      // it from waiting behind them. Needs root or CAP_SYS_NICE; otherwise it stays as it is.
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), -5);
      s.ioc.run();
    });
  return port;
}

void Server::stop_accepting() {
  Impl& s = *impl_;
  if (!s.accepting.exchange(false)) return;
  asio::post(s.acceptor.get_executor(), [&s] {
    error_code ec;
    s.acceptor.close(ec);
    s.accept_retry.cancel();
  });
}

void Server::stop() {
  Impl& s = *impl_;
  if (s.stopped.exchange(true)) return;
  stop_accepting();
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> lock(s.conns_mu);
    for (auto& [id, w] : s.conns)
      if (auto c = w.lock()) all.push_back(std::move(c));
  }
  for (auto& c : all) c->on_strand([c] { c->close_now(); });
  all.clear();
  s.work.reset();
  // Connections close on their strands; then run() returns once no handler is pending.
  for (auto& t : s.io_threads) t.join();
  s.io_threads.clear();
  std::unique_ptr<TaskPool> workers;
  {
    std::lock_guard<std::mutex> lock(s.workers_mu);
    workers = std::move(s.workers);
  }
  workers.reset();  // runs what is queued (responders of closed connections ignore it)
}

void Server::post(std::function<void()> task) { impl_->post(std::move(task)); }
size_t Server::open_connections() const { return static_cast<size_t>(impl_->open.load()); }
const ServerOptions& Server::options() const { return impl_->opt; }

}  // namespace sparkserve::http
