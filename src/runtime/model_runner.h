// Executes the scheduler's step plans: the state operations before the forward, one batched
// forward, the state operations after it. It decides nothing (no allocation, no sampling).
// Tests plug in a fake runner, so the scheduler and post-processing run without weights.
#pragma once

#include <cstdint>

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
  // plan.before in order, the forward of plan.chunks (when there are any), plan.after in order.
  // On a forward error plan.after is skipped.
  virtual Expected<StepOutput> execute(const StepPlan& plan) = 0;
};

class Qwen35Runner final : public ModelRunner {
 public:
  Qwen35Runner(Qwen35Model& model, ModelState& state) : model_(model), state_(state) {}
  CacheGeometry geometry() const override;
  Expected<StepOutput> execute(const StepPlan& plan) override;

 private:
  void run_ops(const std::vector<StateOp>& ops);

  Qwen35Model& model_;
  ModelState& state_;
};

}  // namespace sparkserve
