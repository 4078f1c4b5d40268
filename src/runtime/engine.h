// The continuous-batching engine: one thread owns the model and its state; requests wait in a
// queue. Each step is three pieces with plain data between them:
//   Scheduler::schedule()  admission, preemption, cache accounting -> StepPlan   (scheduler.h)
//   ModelRunner::execute() state ops + one batched forward          -> logits     (model_runner.h)
//   PostProcessor::run()   sampling, stop checks, events, observer                (post_process.h)
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine_observer.h"
#include "runtime/model_runner.h"
#include "runtime/post_process.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace sparkserve {

struct EngineConfig {
  int32_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 4096;
  int64_t vocab_size = 0;  // logits columns the sampler sees (the tokenizer's vocabulary)
  // Prefix cache (scheduler.h): shared KV blocks + GDN state snapshots in the runner's snapshot rows.
  bool enable_prefix_caching = true;
  int64_t snapshot_interval = 2048;  // tokens between snapshots of a long prompt
  // Threads drawing a step's tokens from full logits rows (each row is ~1 ms of CPU work at Qwen3.5's
  // 248K vocabulary; greedy rows come back as argmaxes and need none).
  int sampling_threads = 1;
  // Speculative decoding with the model's MTP layer: drafts per step for every request that does
  // not set its own (EngineRequest::num_speculative_tokens); 0: off. Needs runner.can_speculate().
  int64_t num_speculative_tokens = 0;
};

// Counts for tests and /metrics.
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int32_t free_blocks = 0, total_blocks = 0;
  int32_t free_slots = 0, total_slots = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  int64_t last_batch_tokens = 0, last_batch_seqs = 0;
  int32_t blocks_held_by_sequences = 0;  // 0 when idle (cached blocks are not held)
  PrefixCacheStats prefix_cache;
  uint64_t drafts_proposed = 0, drafts_accepted = 0, verify_chunks = 0;  // speculative decoding
};

class Engine {
 public:
  // The runner's geometry sizes the scheduler's accounting; observer may be null.
  // config.num_speculative_tokens > 0 with a runner that cannot speculate: a broken caller (CHECK).
  Engine(ModelRunner& runner, EngineConfig config, EngineObserver* observer = nullptr);
  ~Engine();

  // Queues a request (thread-safe). Its events arrive on request->out.
  void submit(std::shared_ptr<EngineRequest> request);

  // Runs the engine loop on its own thread.
  void start();
  // Stops the loop; every unfinished request gets a final "abort" event.
  void shutdown();

  // One step on the calling thread (tests drive the engine with this, no thread): plan, run,
  // post-process. Returns false when there was nothing to do.
  bool step();

  EngineStats stats() const;

 private:
  void take_submissions();
  void publish(const StepPlan* plan);
  void loop();
  // After post-processing a step's plan: GDN commit and next drafts (speculative decoding).
  void speculate(const StepPlan& plan, const SpecFollowUp& follow);

  ModelRunner& runner_;
  EngineConfig config_;
  EngineObserver* observer_;
  Scheduler scheduler_;
  PostProcessor post_;

  mutable std::mutex mu_;  // guards incoming_, stop_, stats_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<EngineRequest>> incoming_;
  bool stop_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace sparkserve
