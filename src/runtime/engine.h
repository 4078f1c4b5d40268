// The continuous-batching engine: one thread owns the model and its state pools; requests wait
// in a queue; every step builds one batch under a token budget (max_num_batched_tokens) and a
// sequence cap (max_num_seqs): running decodes first, then prefill chunks of running sequences,
// then newly admitted waiting requests (chunked prefill). A request is admitted only when a GDN
// state slot and the KV blocks of its first chunk are free. When a decode needs a block and none
// is free, the newest running sequence is preempted: its slot and blocks are freed and it goes
// back to the front of the queue to be recomputed from prompt + tokens generated so far (the
// sampler's draws depend only on (seed, step), so the recomputed output is identical).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "model/qwen35.h"
#include "runtime/model_state.h"
#include "runtime/request.h"

namespace sparkserve {

class ServerMetrics;

// What the engine needs of a model: one batched forward over the sequence states (the
// Qwen35Model signature). Tests plug a fake in, so the scheduler is testable without weights.
class StepModel {
 public:
  virtual ~StepModel() = default;
  // Same contract as Qwen35Model::forward: reserves KV blocks, advances num_tokens, returns the
  // last-token logits row of each sequence in batch order.
  virtual Expected<Logits> forward(std::vector<SequenceInput>& batch, ModelState& state) = 0;
};

class Qwen35StepModel : public StepModel {
 public:
  explicit Qwen35StepModel(Qwen35Model& m) : m_(m) {}
  Expected<Logits> forward(std::vector<SequenceInput>& batch, ModelState& state) override {
    return m_.forward(batch, state);
  }

 private:
  Qwen35Model& m_;
};

struct EngineConfig {
  int32_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 4096;
  int64_t vocab_size = 0;  // logits columns the sampler sees (the tokenizer's vocabulary)
};

// Counts for tests and /metrics.
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int32_t free_blocks = 0, total_blocks = 0;
  int32_t free_slots = 0, total_slots = 0;
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  int64_t last_batch_tokens = 0, last_batch_seqs = 0;
};

class Engine {
 public:
  // `state` must have at least config.max_num_seqs GDN slots... or fewer: admission also waits
  // for a free slot. metrics may be null.
  Engine(StepModel& model, ModelState& state, int32_t total_slots, EngineConfig config,
         ServerMetrics* metrics = nullptr);
  ~Engine();

  // Queues a request (thread-safe). Its events arrive on request->out.
  void submit(std::shared_ptr<EngineRequest> request);

  // Runs the engine loop on its own thread.
  void start();
  // Stops the loop; every unfinished request gets a final "abort" event.
  void shutdown();

  // One scheduling step on the calling thread (tests drive the engine with this, no thread).
  // Returns false when there was nothing to do.
  bool step();

  EngineStats stats() const;

 private:
  struct Seq {
    std::shared_ptr<EngineRequest> req;
    SequenceState st;
    bool has_state = false;
    std::vector<int32_t> output;
    bool first_token_sent = false;
    bool prompt_counted = false;  // metrics: prompt tokens count once, not again on recompute
    std::chrono::steady_clock::time_point last_token_time;
    int64_t remaining() const {
      return static_cast<int64_t>(req->prompt.size() + output.size()) - st.num_tokens;
    }
  };

  void take_submissions();
  void drop_cancelled();
  void finish(Seq& s, EngineEvent end);
  void release_state(Seq& s);
  void preempt(size_t running_index);
  int32_t blocks_needed(const Seq& s, int64_t new_tokens) const;
  void update_gauges();
  void loop();

  StepModel& model_;
  ModelState& state_;
  EngineConfig config_;
  ServerMetrics* metrics_;
  int32_t total_slots_;

  std::vector<Seq> running_;  // admission order (oldest first)
  std::vector<uint8_t> mask_;  // a constrained request's allowed tokens, reused per sample
  std::deque<Seq> waiting_;

  mutable std::mutex mu_;  // guards incoming_, stop_, stats_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<EngineRequest>> incoming_;
  bool stop_ = false;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace sparkserve
