#include "runtime/model_runner.h"

#include "runtime/sequence.h"

namespace sparkserve {

CacheGeometry Qwen35Runner::geometry() const {
  const StateLimits& l = state_.limits();
  return CacheGeometry{l.num_kv_blocks, l.block_size, l.max_sequences, l.num_snapshots};
}

void Qwen35Runner::run_ops(const std::vector<StateOp>& ops) {
  for (const StateOp& op : ops) {
    switch (op.kind) {
      case StateOp::Kind::kZeroState: state_.gdn().zero_row(op.dst); break;
      case StateOp::Kind::kCopyState: state_.gdn().copy_row(op.src, op.dst); break;
      case StateOp::Kind::kCopyKvBlock: state_.kv().copy_block(op.src, op.dst); break;
    }
  }
}

Expected<StepOutput> Qwen35Runner::execute(const StepPlan& plan) {
  run_ops(plan.before);
  StepOutput out;
  if (!plan.chunks.empty()) {
    std::vector<ForwardSeq> batch;
    batch.reserve(plan.chunks.size());
    for (const ScheduledChunk& c : plan.chunks) {
      ForwardSeq f{c.gdn_slot, c.block_table, c.start_pos, c.tokens, c.num_logits};
      f.argmax_vocab = c.argmax_vocab;
      // A prompt with images: its chunks take their positions and image rows from mm; every later
      // token (decode, or the output part of a recompute after preemption) sits at index + delta.
      if (MultimodalPrompt* mm = c.seq ? c.seq->req->mm.get() : nullptr) {
        if (c.start_pos < mm->length) f.mm = mm;
        f.rope_delta = mm->rope_delta;
      }
      batch.push_back(f);
    }
    SS_ASSIGN_OR_RETURN(out.logits, model_.forward(batch, state_.pools()));
  }
  run_ops(plan.after);
  return out;
}

}  // namespace sparkserve
