#include "runtime/scheduler.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace sparkserve {

Scheduler::Scheduler(SchedulerConfig config, CacheGeometry geometry, EngineObserver* observer)
    : config_(config), geometry_(geometry), observer_(observer), blocks_(geometry.num_blocks) {
  for (int32_t s = geometry.num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

void Scheduler::add(std::shared_ptr<EngineRequest> request) {
  auto s = std::make_unique<Sequence>();
  s->tokens = request->prompt;
  s->prompt_len = static_cast<int64_t>(request->prompt.size());
  s->req = std::move(request);
  waiting_.push_back(std::move(s));
}

void Scheduler::release_state(Sequence& s) {
  if (s.slot >= 0) free_slots_.push_back(s.slot);
  s.slot = -1;
  for (int32_t b : s.blocks) blocks_.release(b);
  s.blocks.clear();
  s.num_computed = 0;
}

void Scheduler::finish(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
  CHECK_MSG(it != running_.end(), "finish: not a running sequence");
  release_state(**it);
  running_.erase(it);
}

void Scheduler::end_sequence(std::unique_ptr<Sequence> s, StepPlan& plan, std::string reason, std::string error) {
  release_state(*s);
  plan.ended.push_back(EndedRequest{std::move(s->req), std::move(reason), std::move(error), s->num_generated()});
}

std::vector<EndedRequest> Scheduler::take_all(const std::string& finish_reason) {
  StepPlan plan;
  for (auto& s : running_) end_sequence(std::move(s), plan, finish_reason, "");
  for (auto& s : waiting_) end_sequence(std::move(s), plan, finish_reason, "");
  running_.clear();
  waiting_.clear();
  return std::move(plan.ended);
}

void Scheduler::drop_cancelled(StepPlan& plan) {
  // A stop string found by the HTTP side ends the request as "stop", anything else as "abort".
  auto drop = [&](std::unique_ptr<Sequence>& s) {
    if (!s->req->cancelled.load()) return;
    std::string reason = s->req->stopped_by_string.load() ? "stop" : "abort";
    end_sequence(std::move(s), plan, std::move(reason), "");
  };
  for (auto& s : running_) drop(s);
  std::erase_if(running_, [](const auto& s) { return !s; });
  for (auto& s : waiting_) drop(s);
  std::erase_if(waiting_, [](const auto& s) { return !s; });
}

void Scheduler::preempt(size_t i) {
  std::unique_ptr<Sequence> s = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  release_state(*s);  // recomputed from prompt + output on readmission
  waiting_.push_front(std::move(s));
  ++preemptions_;
  if (observer_) observer_->on_preemption();
}

int64_t Scheduler::fitting(const Sequence& s, int64_t want) const {
  const int64_t capacity =
      (static_cast<int64_t>(s.blocks.size()) + blocks_.num_free()) * geometry_.block_size - s.num_computed;
  return std::max<int64_t>(0, std::min(want, capacity));
}

bool Scheduler::grow(Sequence& s, int64_t n) {
  const int64_t bs = geometry_.block_size;
  const int64_t want = (s.num_computed + n + bs - 1) / bs;
  if (want - static_cast<int64_t>(s.blocks.size()) > blocks_.num_free()) return false;
  while (static_cast<int64_t>(s.blocks.size()) < want) s.blocks.push_back(*blocks_.allocate());
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  drop_cancelled(plan);
  int64_t budget = config_.max_num_batched_tokens;
  std::vector<int64_t> chunk(running_.size(), 0);  // tokens scheduled per running sequence

  // 1. Decodes, oldest first; a decode that needs a block takes it from the newest sequence.
  for (size_t i = 0; i < running_.size();) {
    Sequence& s = *running_[i];
    if (s.remaining() != 1 || budget < 1) {
      ++i;
      continue;
    }
    bool grown = grow(s, 1);
    while (!grown && running_.size() - 1 > i) {
      preempt(running_.size() - 1);
      chunk.pop_back();
      grown = grow(s, 1);
    }
    if (!grown) {  // it is the newest itself: it waits for recompute
      preempt(i);
      chunk.erase(chunk.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    chunk[i] = 1;
    budget -= 1;
    ++i;
  }
  // 2. Running sequences still in prefill.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (chunk[i] != 0 || s.remaining() <= 1) continue;
    const int64_t n = fitting(s, std::min(s.remaining(), budget));
    if (n == 0) continue;
    CHECK(grow(s, n));
    chunk[i] = n;
    budget -= n;
  }
  // 3. Admission, first come first served: a GDN slot and the blocks of the first chunk.
  const int64_t pool_tokens = static_cast<int64_t>(geometry_.num_blocks) * geometry_.block_size;
  while (budget > 0 && !waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_num_seqs &&
         !free_slots_.empty()) {
    Sequence& s = *waiting_.front();
    if (static_cast<int64_t>(s.tokens.size()) > pool_tokens) {  // could never fit, even alone
      std::unique_ptr<Sequence> gone = std::move(waiting_.front());
      waiting_.pop_front();
      end_sequence(std::move(gone), plan, "error",
                  "the request needs " + std::to_string(s.tokens.size()) + " KV positions; the cache holds " +
                      std::to_string(pool_tokens));
      continue;
    }
    const int64_t n = fitting(s, std::min(s.remaining(), budget));
    if (n == 0) break;
    s.slot = free_slots_.back();
    free_slots_.pop_back();
    plan.before.push_back(StateOp{StateOp::Kind::kZeroState, -1, s.slot});
    CHECK(grow(s, n));
    if (!s.admitted_once && observer_) observer_->on_prompt(s.prompt_len, 0);
    s.admitted_once = true;
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    chunk.push_back(n);
  }

  for (size_t i = 0; i < running_.size(); ++i) {
    if (chunk[i] == 0) continue;
    Sequence& s = *running_[i];
    ScheduledChunk c;
    c.seq = &s;
    c.gdn_slot = s.slot;
    c.block_table = s.blocks;
    c.start_pos = s.num_computed;
    c.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.num_computed),
                                                          static_cast<size_t>(chunk[i]));
    c.num_logits = s.num_computed + chunk[i] == static_cast<int64_t>(s.tokens.size()) ? 1 : 0;
    plan.chunks.push_back(c);
  }
  // Nothing fits: sequences in prefill hold every block. Free the newest so others progress.
  if (plan.chunks.empty() && !running_.empty()) preempt(running_.size() - 1);
  return plan;
}

void Scheduler::commit(const StepPlan& plan, bool ran_ok) {
  if (!ran_ok) return;
  for (const ScheduledChunk& c : plan.chunks) c.seq->num_computed += static_cast<int64_t>(c.tokens.size());
}

EngineGauges Scheduler::gauges() const {
  EngineGauges g;
  g.running = num_running();
  g.waiting = num_waiting();
  const int32_t tb = geometry_.num_blocks, ts = geometry_.num_slots;
  g.kv_cache_usage = tb > 0 ? 1.0 - static_cast<double>(blocks_.num_free()) / tb : 0.0;
  g.state_slots_usage = ts > 0 ? 1.0 - static_cast<double>(free_slots_.size()) / ts : 0.0;
  return g;
}

}  // namespace sparkserve
