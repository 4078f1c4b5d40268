#include "runtime/engine.h"

#include <algorithm>
#include <span>
#include <string>

#include "core/check.h"
#include "server/metrics.h"

namespace sparkserve {
namespace {
double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

Engine::Engine(StepModel& model, ModelState& state, int32_t total_slots, EngineConfig config,
               ServerMetrics* metrics)
    : model_(model), state_(state), config_(config), metrics_(metrics), total_slots_(total_slots) {
  stats_.total_blocks = state_.kv().allocator().num_blocks();
  stats_.total_slots = total_slots_;
  update_gauges();
}

Engine::~Engine() { shutdown(); }

void Engine::submit(std::shared_ptr<EngineRequest> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      EngineEvent e;
      e.finished = true;
      e.finish_reason = "abort";
      request->out.push(std::move(e));
      return;
    }
    incoming_.push_back(std::move(request));
    stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
  }
  cv_.notify_one();
}

void Engine::start() {
  thread_ = std::thread([this] { loop(); });
}

void Engine::loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    if (step()) continue;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || !incoming_.empty(); });
  }
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  take_submissions();
  EngineEvent abort;
  abort.finished = true;
  abort.finish_reason = "abort";
  for (auto& s : running_) finish(s, abort);
  for (auto& s : waiting_) finish(s, abort);
  running_.clear();
  waiting_.clear();
  update_gauges();
}

void Engine::take_submissions() {
  std::vector<std::shared_ptr<EngineRequest>> in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(incoming_);
  }
  for (auto& r : in) {
    Seq s;
    s.req = std::move(r);
    waiting_.push_back(std::move(s));
  }
}

void Engine::release_state(Seq& s) {
  if (s.has_state) {
    state_.close_sequence(s.st);
    s.has_state = false;
  }
  s.st = SequenceState{};
}

void Engine::finish(Seq& s, EngineEvent end) {
  release_state(s);
  end.finished = true;
  if (metrics_) {
    metrics_->count_finished_request(end.finish_reason);
    metrics_->observe_e2e_latency(seconds_between(s.req->arrival, std::chrono::steady_clock::now()));
  }
  s.req->out.push(std::move(end));
  s.req.reset();  // marks the Seq as done
}

void Engine::preempt(size_t i) {
  Seq s = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  release_state(s);  // recomputed from prompt + output on readmission
  waiting_.push_front(std::move(s));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.preemptions;
  }
  if (metrics_) metrics_->count_preemption();
}

int32_t Engine::blocks_needed(const Seq& s, int64_t new_tokens) const {
  const int64_t bs = state_.kv().block_size();
  const int64_t have = static_cast<int64_t>(s.st.block_table.size());
  const int64_t want = (s.st.num_tokens + new_tokens + bs - 1) / bs;
  return static_cast<int32_t>(std::max<int64_t>(0, want - have));
}

void Engine::drop_cancelled() {
  auto end_of = [](const Seq& s) {
    EngineEvent e;
    e.finish_reason = s.req->stopped_by_string.load() ? "stop" : "abort";
    return e;
  };
  for (auto& s : running_)
    if (s.req->cancelled.load()) finish(s, end_of(s));
  std::erase_if(running_, [](const Seq& s) { return !s.req; });
  for (auto& s : waiting_)
    if (s.req->cancelled.load()) finish(s, end_of(s));
  std::erase_if(waiting_, [](const Seq& s) { return !s.req; });
}

void Engine::update_gauges() {
  const int32_t free_blocks = state_.kv().allocator().num_free();
  const int32_t free_slots = state_.gdn().num_free();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(waiting_.size() + incoming_.size());
  stats_.free_blocks = free_blocks;
  stats_.free_slots = free_slots;
  if (metrics_) {
    metrics_->set_requests_running(stats_.running);
    metrics_->set_requests_waiting(stats_.waiting);
    const int32_t tb = stats_.total_blocks, ts = stats_.total_slots;
    metrics_->set_kv_cache_usage(tb > 0 ? 1.0 - static_cast<double>(free_blocks) / tb : 0.0);
    metrics_->set_state_slots_usage(ts > 0 ? 1.0 - static_cast<double>(free_slots) / ts : 0.0);
  }
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool Engine::step() {
  take_submissions();
  drop_cancelled();
  if (running_.empty() && waiting_.empty()) {
    update_gauges();
    return false;
  }
  const int64_t bs = state_.kv().block_size();
  int64_t budget = config_.max_num_batched_tokens;
  int32_t free_blocks = state_.kv().allocator().num_free();
  std::vector<int64_t> chunk(running_.size(), 0);  // tokens scheduled per running sequence

  // Largest chunk of up to `want` tokens whose KV blocks fit in what is free.
  auto fitting = [&](const Seq& s, int64_t want) {
    const int64_t capacity = (static_cast<int64_t>(s.st.block_table.size()) + free_blocks) * bs - s.st.num_tokens;
    return std::max<int64_t>(0, std::min(want, capacity));
  };

  // 1. Decodes, oldest first; a decode that needs a block takes it from the newest sequence.
  for (size_t i = 0; i < running_.size();) {
    Seq& s = running_[i];
    if (s.remaining() != 1 || budget < 1) {
      ++i;
      continue;
    }
    int32_t need = blocks_needed(s, 1);
    while (need > free_blocks && running_.size() - 1 > i) {
      free_blocks += static_cast<int32_t>(running_.back().st.block_table.size());
      preempt(running_.size() - 1);
      chunk.pop_back();
    }
    if (need > free_blocks) {  // it is the newest itself: it waits for recompute
      free_blocks += static_cast<int32_t>(s.st.block_table.size());
      preempt(i);
      chunk.erase(chunk.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    free_blocks -= need;
    chunk[i] = 1;
    budget -= 1;
    ++i;
  }
  // 2. Running sequences still in prefill.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Seq& s = running_[i];
    if (chunk[i] != 0 || s.remaining() <= 1) continue;
    const int64_t n = fitting(s, std::min(s.remaining(), budget));
    if (n == 0) continue;
    free_blocks -= blocks_needed(s, n);
    chunk[i] = n;
    budget -= n;
  }
  // 3. Admission, first come first served: a GDN slot and the blocks of the first chunk.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs && state_.gdn().num_free() > 0) {
    Seq& s = waiting_.front();
    const int64_t pool_tokens = static_cast<int64_t>(state_.kv().allocator().num_blocks()) * bs;
    if (s.remaining() > pool_tokens) {  // could never fit, even alone
      EngineEvent err;
      err.finish_reason = "error";
      err.error = "the request needs " + std::to_string(s.remaining()) + " KV positions; the cache holds " +
                  std::to_string(pool_tokens);
      finish(s, err);
      waiting_.pop_front();
      continue;
    }
    const int64_t n = fitting(s, std::min(s.remaining(), budget));
    if (n == 0) break;
    auto opened = state_.open_sequence();
    if (!opened.ok()) break;
    s.st = *opened;
    s.has_state = true;
    if (metrics_ && !s.prompt_counted) metrics_->add_prompt_tokens(s.req->prompt.size());
    s.prompt_counted = true;
    free_blocks -= blocks_needed(s, n);
    budget -= n;
    running_.push_back(std::move(s));
    waiting_.pop_front();
    chunk.push_back(n);
  }

  std::vector<size_t> order;
  for (size_t i = 0; i < running_.size(); ++i)
    if (chunk[i] > 0) order.push_back(i);
  if (order.empty()) {
    // Nothing fits: sequences in prefill hold every block. Free the newest so others progress;
    // a request too large for the whole pool is refused instead of waiting forever.
    if (!running_.empty()) {
      preempt(running_.size() - 1);
    }
    update_gauges();
    return true;
  }

  std::vector<SequenceInput> batch;
  batch.reserve(order.size());
  int64_t batch_tokens = 0;
  for (size_t i : order) {
    Seq& s = running_[i];
    SequenceInput in;
    in.state = &s.st;
    const int64_t start = s.st.num_tokens;
    for (int64_t p = start; p < start + chunk[i]; ++p) {
      const size_t np = s.req->prompt.size();
      in.tokens.push_back(p < static_cast<int64_t>(np) ? s.req->prompt[static_cast<size_t>(p)]
                                                       : s.output[static_cast<size_t>(p) - np]);
    }
    batch_tokens += chunk[i];
    batch.push_back(std::move(in));
  }
  auto logits = model_.forward(batch, state_);
  const auto now = std::chrono::steady_clock::now();
  if (!logits.ok()) {
    EngineEvent err;
    err.finish_reason = "error";
    err.error = logits.message();
    for (size_t i : order) finish(running_[i], err);
  } else {
    for (size_t j = 0; j < order.size(); ++j) {
      Seq& s = running_[order[j]];
      if (s.remaining() != 0) continue;  // a prefill chunk short of the end: nothing to sample
      const EngineRequest& r = *s.req;
      const int64_t vocab = std::min<int64_t>(config_.vocab_size > 0 ? config_.vocab_size : logits->vocab, logits->vocab);
      EngineEvent ev;
      if (r.forced_tokens && s.output.size() < r.forced_tokens->size()) {
        ev.token = (*r.forced_tokens)[s.output.size()];
      } else {
        std::span<const uint8_t> allowed;
        if (r.constraint) {
          mask_.resize(static_cast<size_t>(vocab));
          r.constraint->allowed_tokens(mask_);
          allowed = mask_;
        }
        ev.sample = sample_token(std::span<const float>(logits->row(static_cast<int64_t>(j)), static_cast<size_t>(vocab)),
                                 r.params, r.prompt, s.output, allowed);
        ev.token = ev.sample.token;
        if (r.constraint) r.constraint->accept(ev.token);
      }
      s.output.push_back(ev.token);
      const int64_t n_out = static_cast<int64_t>(s.output.size());
      const int64_t seq_len = static_cast<int64_t>(r.prompt.size()) + n_out;
      std::optional<TokenStop> stop;
      if (r.forced_tokens) {
        if (n_out >= static_cast<int64_t>(r.forced_tokens->size())) stop = TokenStop{"stop", std::nullopt};
        else if (n_out >= r.params.max_tokens || seq_len >= config_.max_model_len) stop = TokenStop{"length", std::nullopt};
      } else {
        stop = check_token_stop(r.params, ev.token, n_out, seq_len, config_.max_model_len);
      }
      if (metrics_) {
        metrics_->add_generation_tokens(1);
        if (!s.first_token_sent) metrics_->observe_time_to_first_token(seconds_between(r.arrival, now));
        else metrics_->observe_inter_token_latency(seconds_between(s.last_token_time, now));
      }
      s.first_token_sent = true;
      s.last_token_time = now;
      s.req->out.push(std::move(ev));
      if (stop) {
        EngineEvent end;
        end.finish_reason = stop->finish_reason;
        end.stop_token = stop->stop_token;
        finish(s, end);
      }
    }
  }
  std::erase_if(running_, [](const Seq& s) { return !s.req; });
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.last_batch_tokens = batch_tokens;
    stats_.last_batch_seqs = static_cast<int64_t>(order.size());
  }
  update_gauges();
  return true;
}

}  // namespace sparkserve
