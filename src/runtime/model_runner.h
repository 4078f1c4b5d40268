// Executes the scheduler's step plans: the state operations before the forward, then one batched
// forward (which also takes the plan's in-chunk state saves). It decides nothing (no allocation, no
// sampling).
// Tests plug in a fake runner, so the scheduler and post-processing run without weights.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/forward_batch.h"
#include "model/qwen35.h"
#include "runtime/model_state.h"
#include "runtime/step_plan.h"

namespace sparkserve {

// The storage a runner executes plans against, which the scheduler accounts for.
struct CacheGeometry {
  int32_t num_blocks = 0;
  int64_t block_size = 16;
  int32_t num_slots = 0;      // GDN state rows for running sequences
  int32_t num_snapshots = 0;  // GDN state rows for prefix-cache snapshots (row num_slots + i)
};

// What a step produced: the logits rows the plan's chunks asked for, in chunk order.
struct StepOutput {
  Logits logits;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual CacheGeometry geometry() const = 0;
  // plan.before in order, then the forward of plan.chunks (when there are any), with their saves.
  virtual Expected<StepOutput> execute(const StepPlan& plan) = 0;

  // Speculative decoding (multi-token prediction): whether the runner can verify drafts and
  // propose them. After post-processing of the plan execute() just ran: folds the accepted prefix
  // of every verify chunk into its GDN state, writes the MTP rows of follow.drafts and returns
  // their drafts (one list per DraftRequest, num_drafts each).
  virtual bool can_speculate() const { return false; }
  virtual Expected<std::vector<std::vector<int32_t>>> speculate(const StepPlan& plan, const SpecFollowUp& follow) {
    (void)plan, (void)follow;
    return make_error("this model runner has no multi-token-prediction layer");
  }
};

class Qwen35Runner final : public ModelRunner {
 public:
  Qwen35Runner(Qwen35Model& model, ModelState& state) : model_(model), state_(state) {}
  CacheGeometry geometry() const override;
  Expected<StepOutput> execute(const StepPlan& plan) override;
  // The model has its MTP layer and the state a KV pool for it (StateLimits::mtp).
  bool can_speculate() const override;
  Expected<std::vector<std::vector<int32_t>>> speculate(const StepPlan& plan, const SpecFollowUp& follow) override;

 private:
  void run_ops(const std::vector<StateOp>& ops);

  Qwen35Model& model_;
  ModelState& state_;
  SpecCapture capture_;            // the last forward's hidden rows and verify stash
  std::vector<int64_t> chunk_row_;  // the last forward's first batch row of each chunk
};

}  // namespace sparkserve
