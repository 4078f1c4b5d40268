// The scheduler: admission, preemption and all accounting of the state storage (KV blocks, GDN
// state slots). Each step it emits a StepPlan (step_plan.h) under a token budget
// (max_num_batched_tokens) and a sequence cap (max_num_seqs):
// 1. running decodes, oldest first (one token each); a decode that needs a KV block when none is
//    free preempts the newest running sequence (slot and blocks freed, back to the front of the
//    queue, recomputed later from prompt + generated tokens: the sampler's draws depend only on
//    (seed, step), so the output does not change);
// 2. running sequences still in prefill, a chunk each within the budget and the free blocks;
// 3. waiting requests, first come first served, while a GDN slot is free, max_num_seqs is not
//    reached and the blocks of a first chunk exist (chunked prefill). A request longer than the
//    whole KV pool ends with an error instead of waiting forever.
// The plan's positions become real in commit(), after the runner executed it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/block_pool.h"
#include "runtime/engine_observer.h"
#include "runtime/model_runner.h"
#include "runtime/sequence.h"
#include "runtime/step_plan.h"

namespace sparkserve {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, CacheGeometry geometry, EngineObserver* observer);

  void add(std::shared_ptr<EngineRequest> request);
  // Whether a step would do anything.
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  StepPlan schedule();
  // After the runner executed `plan`: its chunks' tokens are now in the state (ran_ok), or the
  // forward failed and its sequences are about to be finished with an error.
  void commit(const StepPlan& plan, bool ran_ok);
  // A running sequence ended (post-processing): its slot and blocks are released and it is gone.
  void finish(Sequence* seq);
  // Every waiting and running request, removed (shutdown).
  std::vector<EndedRequest> take_all(const std::string& finish_reason);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int32_t num_free_blocks() const { return blocks_.num_free(); }
  int32_t num_free_slots() const { return static_cast<int32_t>(free_slots_.size()); }
  uint64_t num_preemptions() const { return preemptions_; }
  const CacheGeometry& geometry() const { return geometry_; }
  EngineGauges gauges() const;

 private:
  void drop_cancelled(StepPlan& plan);
  void release_state(Sequence& s);
  void preempt(size_t running_index);
  // Adds blocks so that `s` covers num_computed + n positions; false (and nothing taken) when
  // the free blocks do not suffice.
  bool grow(Sequence& s, int64_t n);
  // The largest n <= want whose blocks fit in what is free.
  int64_t fitting(const Sequence& s, int64_t want) const;
  void end_sequence(std::unique_ptr<Sequence> s, StepPlan& plan, std::string reason, std::string error);

  SchedulerConfig config_;
  CacheGeometry geometry_;
  EngineObserver* observer_;
  KvBlockPool blocks_;
  std::vector<int32_t> free_slots_;  // LIFO
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order (oldest first)
  std::deque<std::unique_ptr<Sequence>> waiting_;
  uint64_t preemptions_ = 0;
};

}  // namespace sparkserve
