#include "runtime/engine.h"

#include <chrono>

#include "core/check.h"

namespace sparkserve {
namespace {

EngineEvent abort_event() {
  EngineEvent e;
  e.finish_reason = "abort";
  return e;
}

}  // namespace

Engine::Engine(ModelRunner& runner, EngineConfig config, EngineObserver* observer)
    : runner_(runner),
      config_(config),
      observer_(observer),
      scheduler_(SchedulerConfig{config.max_num_seqs, config.max_num_batched_tokens, config.enable_prefix_caching,
                                 config.snapshot_interval, config.num_speculative_tokens},
                 runner.geometry(), observer),
      post_(config.vocab_size, config.max_model_len, observer, config.sampling_threads) {
  CHECK_MSG(config.num_speculative_tokens <= 0 || runner.can_speculate(),
            "speculative decoding asked of a model runner without an MTP layer");
  stats_.total_blocks = scheduler_.geometry().num_blocks;
  stats_.total_slots = scheduler_.geometry().num_slots;
  publish(nullptr);
}

Engine::~Engine() { shutdown(); }

void Engine::submit(std::shared_ptr<EngineRequest> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      incoming_.push_back(std::move(request));
      ++stats_.waiting;
      request = nullptr;
    }
  }
  if (request) {  // shutting down
    post_.end(*request, abort_event());
    return;
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
  for (EndedRequest& e : scheduler_.take_all("abort")) post_.end(*e.req, abort_event());
  publish(nullptr);
}

void Engine::take_submissions() {
  std::vector<std::shared_ptr<EngineRequest>> in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(incoming_);
  }
  for (auto& r : in) scheduler_.add(std::move(r));
}

bool Engine::step() {
  take_submissions();
  if (!scheduler_.has_work()) {
    publish(nullptr);
    return false;
  }
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  StepPlan plan = scheduler_.schedule();
  post_.mark_argmax_rows(plan);
  const auto t1 = Clock::now();
  const Expected<StepOutput> out = runner_.execute(plan);
  scheduler_.commit(plan, out.ok());
  const auto t2 = Clock::now();
  // The MTP proposal after post-processing is model work: counted as execute time.
  double spec_s = 0;
  if (config_.num_speculative_tokens > 0 && out.ok()) {
    SpecFollowUp follow;
    post_.run(plan, out, scheduler_, &follow);
    const auto ts = Clock::now();
    speculate(plan, follow);
    spec_s = std::chrono::duration<double>(Clock::now() - ts).count();
  } else {
    post_.run(plan, out, scheduler_);
  }
  const auto t3 = Clock::now();
  publish(&plan);
  if (observer_) {
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    observer_->on_step(StepTiming{secs(t0, t1), secs(t1, t2) + spec_s, secs(t2, t3) - spec_s, plan.num_tokens(),
                                  static_cast<int64_t>(plan.chunks.size())});
  }
  return true;
}

void Engine::speculate(const StepPlan& plan, const SpecFollowUp& follow) {
  uint64_t proposed = 0, accepted = 0, verify = 0;
  bool any = !follow.drafts.empty();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (!c.speculative) continue;
    any = true;
    ++verify;
    proposed += static_cast<uint64_t>(c.num_logits - 1);
    accepted += static_cast<uint64_t>(follow.drafts_accepted[i]);
  }
  if (verify > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.drafts_proposed += proposed;
    stats_.drafts_accepted += accepted;
    stats_.verify_chunks += verify;
  }
  if (!any) return;
  Expected<std::vector<std::vector<int32_t>>> drafts = runner_.speculate(plan, follow);
  if (!drafts.ok()) {
    // The GDN state of these sequences is not what their tokens say: they cannot go on.
    for (const DraftRequest& d : follow.drafts) {
      EngineEvent err;
      err.finish_reason = "error";
      err.error = "speculative decoding: " + drafts.message();
      post_.end(*d.seq->req, std::move(err), d.seq->num_generated(), d.seq->timeline);
      scheduler_.finish(d.seq);
    }
    return;
  }
  for (size_t i = 0; i < follow.drafts.size(); ++i) follow.drafts[i].seq->drafts = std::move((*drafts)[i]);
}

void Engine::publish(const StepPlan* plan) {
  const EngineGauges g = scheduler_.gauges();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = g.running;
    stats_.waiting = g.waiting + static_cast<int64_t>(incoming_.size());
    stats_.free_blocks = scheduler_.num_free_blocks();
    stats_.free_slots = scheduler_.num_free_slots();
    stats_.preemptions = scheduler_.num_preemptions();
    stats_.blocks_held_by_sequences = scheduler_.num_blocks_held_by_sequences();
    stats_.prefix_cache = scheduler_.prefix_cache_stats();
    if (plan) {
      ++stats_.steps;
      stats_.last_batch_tokens = plan->num_tokens();
      stats_.last_batch_seqs = static_cast<int64_t>(plan->chunks.size());
    }
  }
  if (observer_) observer_->on_gauges(g);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace sparkserve
