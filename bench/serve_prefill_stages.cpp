// The server's own work on a chat request before generation starts and after the first token,
// stage by stage, on the real code: the routes of `sparkserve serve` (make_router) on a worker pool
// as the HTTP server runs them, an Engine with prefix caching on a model runner that does no math
// (it writes a fixed reply), and the request's stages called one by one.
//   bench_serve_prefill_stages MODEL_DIR BODIES.jsonl [SESSIONS] [WORKERS]
// MODEL_DIR: tokenizer.json, tokenizer_config.json and chat_template.jinja (e.g. the serve-tiny
// fixture). BODIES.jsonl: one chat request body per line, the turns of one conversation in order
// (`bench/prefix_cache_bench.py bodies --out FILE` writes the agent session's). Every session
// starts from a fresh tokenizer, engine and prefix cache; per turn the median over sessions is
// printed, in ms:
//   parse    parse_chat_request (JSON parse of the body, validation, message normalization)
//   context  build_chat_context (the render context of the messages, tools and kwargs)
//   value    the context as template values (jinja Value::from_json)
//   render   the chat template's render
//   tokenize the rendered prompt's ids (first time in the session, as the server meets it)
//   start    start_chat as a route calls it (all of the above, generation-prompt suffix, parsers)
//   route    the whole route: dispatch on a worker -> the engine's first forward call (what a
//            client waits for before the model runs, HTTP transport excepted)
//   admit    engine submit -> the first forward call (queue, admission, prefix lookup), for the
//            prompt the route just ran (so all but its last token are cached)
//   event    the forward's return -> its token event received by a thread waiting on the
//            request's channel (the engine's post-processing and one thread wake-up)
//   after    the forward's return -> the first SSE chunk handed to the transport (sampling,
//            detokenizer, output parser, event JSON)
//   json     non-streamed: the last forward's return -> the response handed to the transport
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "http/task_pool.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "server/handlers.h"
#include "server/request_log.h"
#include "server/route_util.h"
#include "text/chat_template.h"
#include "text/jinja/value.h"

using namespace sparkserve;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

// Writes `reply` then `eos`; records when each forward starts and ends.
class ReplyRunner final : public ModelRunner {
 public:
  ReplyRunner(std::vector<int32_t> reply, int32_t eos, int64_t vocab, CacheGeometry g)
      : reply_(std::move(reply)), eos_(eos), vocab_(vocab), geometry_(g) {}
  CacheGeometry geometry() const override { return geometry_; }
  Expected<StepOutput> execute(const StepPlan& plan) override {
    const auto enter = Clock::now();
    StepOutput out;
    Logits& l = out.logits;
    l.vocab = vocab_;
    // Rows that asked for argmax_vocab get only their argmax back, as the real runners do.
    for (const ScheduledChunk& c : plan.chunks)
      for (int64_t r = 0; r < c.num_logits; ++r) {
        const int64_t n = c.start_pos + static_cast<int64_t>(c.tokens.size()) - c.num_logits + r + 1 - c.seq->prompt_len;
        const int32_t next = n < static_cast<int64_t>(reply_.size()) ? reply_[static_cast<size_t>(n)] : eos_;
        l.argmax.push_back(RowArgmax{next, -1});
        if (c.argmax_vocab > 0) {
          l.data_row.push_back(-1);
        } else {
          l.data_row.push_back(static_cast<int64_t>(l.data.size()) / vocab_);
          l.data.resize(l.data.size() + static_cast<size_t>(vocab_), 0.0f);
          l.data[l.data.size() - static_cast<size_t>(vocab_) + static_cast<size_t>(next)] = 30.0f;
        }
        ++l.rows;
      }
    std::lock_guard<std::mutex> lock(mu);
    if (!first_enter) first_enter = enter;
    if (!first_exit) first_exit = Clock::now();
    last_exit = Clock::now();
    return out;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu);
    first_enter.reset(), first_exit.reset(), last_exit.reset();
  }
  std::mutex mu;
  std::optional<Clock::time_point> first_enter, first_exit, last_exit;

 private:
  std::vector<int32_t> reply_;
  int32_t eos_;
  int64_t vocab_;
  CacheGeometry geometry_;
};

// Records when the route hands its answer to the transport.
class TimedResponder final : public http::Responder {
 public:
  void add_header(std::string, std::string) override {}
  void send(int status, std::string_view, std::string body, std::vector<http::Header>) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent = Clock::now();
    this->status = status;
    if (status != 200) error = body;
    finish_locked();
  }
  void start_stream(std::string_view, std::vector<http::Header>) override { status = 200; }
  bool write(std::string data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_write) first_write = Clock::now();
    if (data.find("\"error\"") != std::string::npos) error = data;
    return true;
  }
  void end() override {
    std::lock_guard<std::mutex> lock(mu_);
    finish_locked();
  }
  size_t pending_bytes() const override { return 0; }
  bool gone() const override { return false; }
  void on_wake(std::function<void()>) override {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }
  int status = 0;
  std::string error;
  std::optional<Clock::time_point> first_write, sent;

 private:
  void finish_locked() {
    done_ = true;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// A thread of its own for one tokenizer: the tokenizer's caches may be per thread, and a thread
// that alternates between tokenizers would keep evicting them (a server has one).
class Lane {
 public:
  template <class F>
  auto run(F&& f) {
    std::promise<decltype(f())> done;
    pool_.post([&] { done.set_value(f()); });
    return done.get_future().get();
  }

 private:
  http::TaskPool pool_{1};
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR BODIES.jsonl [SESSIONS] [WORKERS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int sessions = argc > 3 ? std::atoi(argv[3]) : 5;
  const int workers = argc > 4 ? std::atoi(argv[4]) : 4;  // serve's --http-workers default
  std::vector<std::string> bodies;
  {
    std::ifstream in(argv[2], std::ios::binary);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) bodies.push_back(line);
  }
  if (bodies.empty()) die(std::string("no bodies in ") + argv[2]);
  set_request_logging(false);
  auto tmpl = load_chat_template(dir);
  if (!tmpl.ok()) die(tmpl.message());

  const char* names[] = {"parse", "context", "value", "render", "tokenize", "start", "route", "admit", "event", "after", "json"};
  std::map<std::string, std::vector<std::vector<double>>> t;  // stage -> turn -> sessions
  for (const char* n : names) t[n].resize(bodies.size());
  std::vector<size_t> prompt_tokens(bodies.size());

  for (int s = 0; s < sessions; ++s) {
    // Fresh tokenizers (their caches start empty, as a server's do): the routes', and one each for
    // the tokenize and start stages, which thus meet exactly the session's earlier turns first.
    auto tok = Tokenizer::load(dir), tok_stage = Tokenizer::load(dir), tok_start = Tokenizer::load(dir);
    if (!tok.ok() || !tok_stage.ok() || !tok_start.ok()) die(tok.message());
    Lane stage_lane, start_lane;
    auto reply = tok->encode("I will read the failing test first, then the loader module it exercises.");
    const auto eos = tok->eos_token_id();
    if (!reply.ok() || !eos) die("cannot encode the reply / no eos token");
    const int64_t vocab = static_cast<int64_t>(tok->vocab_size());
    ReplyRunner runner(std::vector<int32_t>(reply->begin(), reply->end()), *eos, vocab, CacheGeometry{8192, 16, 8, 32});
    EngineConfig ec;
    ec.max_num_seqs = 8;
    ec.max_num_batched_tokens = 8192;
    ec.max_model_len = 32768;
    ec.vocab_size = vocab;
    // Declared in serve's order, so the pool finishes its tasks while the context and engine live.
    ServeContext ctx;
    ServerMetrics metrics("bench", ec.max_model_len);
    Engine engine(runner, ec);
    http::TaskPool pool(workers);
    GenerationJobs jobs([&pool](std::function<void()> task) { pool.post(std::move(task)); });
    ctx.engine = &engine;
    ctx.tokenizer = &*tok;
    ctx.chat_template = &*tmpl;
    ctx.jobs = &jobs;
    ctx.metrics = &metrics;
    ctx.info.names = {"bench"};
    ctx.info.max_model_len = ec.max_model_len;
    ctx.info.vocab_size = vocab;
    ctx.max_token_bytes = 256;
    ctx.defaults.eos_token_ids = {*eos};
    http::Router router = make_router(ctx);
    engine.start();

    for (size_t turn = 0; turn < bodies.size(); ++turn) {
      for (bool stream : {true, false}) {
        auto req = std::make_shared<http::Request>();
        req->method = "POST";
        req->path = req->target = "/v1/chat/completions";
        req->body = bodies[turn];
        if (!stream) {  // the same conversation again, answered as one JSON body
          auto j = nlohmann::ordered_json::parse(req->body);
          j["stream"] = false;
          j.erase("stream_options");
          req->body = j.dump();
        }
        runner.reset();
        auto res = std::make_shared<TimedResponder>();
        const auto t0 = Clock::now();
        const http::Router::Route* route = router.dispatch(*req, *res);
        if (!route) die("no route");
        pool.post([route, req, res] { route->handler(*req, res); });
        res->wait();
        if (res->status != 200 || !res->error.empty()) die("turn " + std::to_string(turn + 1) + ": " + res->error);
        std::lock_guard<std::mutex> lock(runner.mu);
        if (stream) {
          t["route"][turn].push_back(ms(t0, *runner.first_enter));
          t["after"][turn].push_back(ms(*runner.first_exit, *res->first_write));
        } else {
          t["json"][turn].push_back(ms(*runner.last_exit, *res->sent));
        }
      }
      // The stages one by one, then the engine alone (admitting the prompt the route just ran).
      auto a = Clock::now();
      auto parsed = parse_chat_request(bodies[turn], ctx.info);
      auto b = Clock::now();
      if (!parsed.ok()) die(parsed.error().message);
      t["parse"][turn].push_back(ms(a, b));
      OrderedJson tmpl_req = OrderedJson::object();
      a = Clock::now();
      tmpl_req["messages"] = parsed->messages;
      tmpl_req["tools"] = parsed->tools;
      tmpl_req["add_generation_prompt"] = true;
      tmpl_req["chat_template_kwargs"] = parsed->chat_template_kwargs;
      auto context = build_chat_context(std::move(tmpl_req), tmpl->special_tokens);
      b = Clock::now();
      if (!context.ok()) die(context.message());
      t["context"][turn].push_back(ms(a, b));
      a = Clock::now();
      jinja::Value value = jinja::Value::from_json(*context);
      b = Clock::now();
      t["value"][turn].push_back(ms(a, b));
      a = Clock::now();
      auto rendered = tmpl->compiled.render(value);
      b = Clock::now();
      if (!rendered.ok()) die(rendered.message());
      t["render"][turn].push_back(ms(a, b));
      auto [tokenize_ms, ids_ok] = stage_lane.run([&] {
        const auto t1 = Clock::now();
        auto ids = tok_stage->encode(*rendered);
        return std::make_pair(ms(t1, Clock::now()), ids.ok());
      });
      if (!ids_ok) die("cannot tokenize the rendered prompt");
      t["tokenize"][turn].push_back(tokenize_ms);
      ctx.tokenizer = &*tok_start;
      auto [start_ms, gens] = start_lane.run([&] {
        const auto t1 = Clock::now();
        auto g = start_chat(ctx, *parsed);
        return std::make_pair(ms(t1, Clock::now()), std::move(g));
      });
      ctx.tokenizer = &*tok;
      if (!gens.ok()) die(gens.error().message);
      t["start"][turn].push_back(start_ms);
      prompt_tokens[turn] = (*gens)[0]->er->prompt.size();
      runner.reset();
      a = Clock::now();
      engine.submit((*gens)[0]->er);
      std::optional<Clock::time_point> first_event;
      for (bool done = false; !done;)
        for (auto& ev : (*gens)[0]->er->out.pop_all(std::chrono::milliseconds(100))) {
          if (!first_event) first_event = Clock::now();
          done = done || ev.finished;
        }
      std::lock_guard<std::mutex> lock(runner.mu);
      t["admit"][turn].push_back(ms(a, *runner.first_enter));
      t["event"][turn].push_back(ms(*runner.first_exit, *first_event));
    }
    engine.shutdown();
  }

  std::printf("%d sessions, %d workers; median ms per turn\nturn  prompt", sessions, workers);
  for (const char* n : names) std::printf(" %8s", n);
  std::printf("\n");
  std::map<std::string, std::vector<double>> later;
  for (size_t turn = 0; turn < bodies.size(); ++turn) {
    std::printf("%4zu %7zu", turn + 1, prompt_tokens[turn]);
    for (const char* n : names) {
      const double m = median(t[n][turn]);
      std::printf(" %8.3f", m);
      if (turn > 0) later[n].push_back(m);
    }
    std::printf("\n");
  }
  std::printf("2..%-9zu", bodies.size());
  for (const char* n : names) std::printf(" %8.3f", median(later[n]));
  std::printf("   (median of the later turns)\n");
  return 0;
}
