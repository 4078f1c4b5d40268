#include "server/generation.h"

#include <algorithm>



namespace sparkserve {
namespace {

std::string token_text(const Tokenizer& tok, int32_t id) { return decode_utf8_replace(tok.token_bytes(id), true); }

void add_text(Generation& g, const std::string& t, Piece& p) {
  if (t.empty()) return;
  p.text += t;
  g.text += t;
  if (g.parser) {
    OutputDelta d = g.parser->feed(t);
    p.delta.reasoning += d.reasoning;
    p.delta.content += d.content;
    for (auto& c : d.tool_calls) p.delta.tool_calls.push_back(std::move(c));
  }
}

void end_text(Generation& g, Piece& p) {
  add_text(g, g.detok->finish().text, p);
  if (g.parser) {
    OutputDelta d = g.parser->finish();
    p.delta.reasoning += d.reasoning;
    p.delta.content += d.content;
    for (auto& c : d.tool_calls) p.delta.tool_calls.push_back(std::move(c));
  }
}

}  // namespace

void pump(Generation& g, const Tokenizer& tok, double timeout_s, Piece& p) {
  if (g.done) return;
  auto events = g.er->out.pop_all(std::chrono::milliseconds(0));
  for (auto& ev : events) {
    if (g.done) break;
    if (!ev.finished && !ev.prompt.empty()) {
      for (auto& pl : ev.prompt) g.prompt_logprobs.push_back(std::move(pl));
      continue;
    }
    if (!ev.finished) {
      if (ev.num_cached_tokens >= 0) g.cached_tokens = ev.num_cached_tokens;
      if (!g.first_token) g.first_token = std::chrono::steady_clock::now();
      g.token_ids.push_back(ev.token);
      p.token_ids.push_back(ev.token);
      if (g.num_logprobs >= 0 && ev.sample.logprob) {
        TokenLogprobs lp;
        lp.chosen = {token_text(tok, ev.token), *ev.sample.logprob};
        for (const auto& t : ev.sample.top) lp.top.push_back({token_text(tok, t.token), t.logprob});
        g.logprobs.push_back(lp);
        p.logprobs.push_back(std::move(lp));
      }
      DetokenizerStep st = g.detok->push(ev.token);
      add_text(g, st.text, p);
      if (st.stopped) {
        g.er->stopped_by_string.store(true);
        g.er->cancelled.store(true);  // the engine frees it; its final event is ignored
        g.finish_reason = "stop";
        g.stop_reason = st.stop_string;
        end_text(g, p);
        g.done = true;
      }
      continue;
    }
    if (ev.finish_reason == "error") g.error = internal_error("generation failed: " + ev.error);
    g.finish_reason = ev.finish_reason;
    if (ev.stop_token) g.stop_reason = *ev.stop_token;
    end_text(g, p);
    g.done = true;
  }
  if (!g.done && timeout_s > 0 &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() - g.start).count() > timeout_s) {
    g.er->cancelled.store(true);
    g.finish_reason = "abort";
    end_text(g, p);
    g.done = true;
  }
}

// state: 0 idle, 1 queued or running, 2 running and woken again (run once more).
struct GenerationJobs::Job {
  std::function<bool()> step;
  std::atomic<int> state{0};
  std::atomic<bool> finished{false};
};

GenerationJobs::GenerationJobs(std::function<void(std::function<void()>)> post) : post_(std::move(post)) {
  ticker_ = std::thread([this] { tick_loop(); });
}

GenerationJobs::~GenerationJobs() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  ticker_.join();
}

std::function<void()> GenerationJobs::add(OutputChannel& channel, std::function<bool()> step) {
  auto job = std::make_shared<Job>();
  job->step = std::move(step);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  std::weak_ptr<Job> weak = job;
  auto wake_fn = [this, weak] {
    if (auto j = weak.lock()) wake(j);
  };
  channel.set_on_push(wake_fn);
  wake(job);  // a first step at once (e.g. to send a stream's headers)
  return wake_fn;
}

size_t GenerationJobs::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

void GenerationJobs::wake(const std::shared_ptr<Job>& job) {
  if (job->finished.load()) return;
  int s = job->state.load();
  for (;;) {
    if (s == 2) return;
    if (job->state.compare_exchange_weak(s, s + 1)) break;
  }
  if (s == 1) return;  // running: it runs once more when done
  post_([job] {
    for (;;) {
      job->state.store(1);
      if (!job->finished.load() && job->step()) {
        job->finished.store(true);
        job->step = nullptr;  // releases the generation and the responder now
      }
      int expect = 1;
      if (job->state.compare_exchange_strong(expect, 0)) return;
    }
  });
}

void GenerationJobs::tick_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kTick);
    if (stop_) break;
    std::erase_if(jobs_, [](const std::shared_ptr<Job>& j) { return j->finished.load(); });
    auto jobs = jobs_;
    lock.unlock();
    for (auto& j : jobs) wake(j);
    lock.lock();
  }
}

}  // namespace sparkserve
