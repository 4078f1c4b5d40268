#include "runtime/model_runner.h"

#include <algorithm>

#include "runtime/sequence.h"

namespace sparkserve {

CacheGeometry Qwen35Runner::geometry() const {
  const StateLimits& l = state_.limits();
  return CacheGeometry{l.num_kv_blocks, l.block_size, l.max_sequences, l.num_snapshots};
}

void Qwen35Runner::run_ops(const std::vector<StateOp>& ops) {
  // The copies go to the backend as batches, whose copies run at once (Backend::copy_batch). An op
  // that touches a row or block a pending copy writes, or writes one it reads, first sends the
  // pending batch: the state ends as running the ops one by one in list order leaves it.
  struct Use {
    bool kv;  // a KV block (else a GDN state row)
    int32_t index;
    bool write;
  };
  std::vector<Use> pending;
  std::vector<TensorCopy> batch;
  auto clashes = [&](bool kv, int32_t index, bool write) {
    return std::any_of(pending.begin(), pending.end(),
                       [&](const Use& u) { return u.kv == kv && u.index == index && (u.write || write); });
  };
  auto flush = [&] {
    if (!batch.empty()) state_.backend().copy_batch(batch);
    batch.clear();
    pending.clear();
  };
  for (const StateOp& op : ops) {
    const bool kv = op.kind == StateOp::Kind::kCopyKvBlock;
    if (op.kind == StateOp::Kind::kZeroState) {
      if (clashes(false, op.dst, true)) flush();
      state_.gdn().zero_row(op.dst);
      continue;
    }
    if (clashes(kv, op.src, false) || clashes(kv, op.dst, true)) flush();
    if (kv)
      state_.kv().add_block_copies(op.src, op.dst, batch);
    else
      state_.gdn().add_row_copies(op.src, op.dst, batch);
    pending.push_back({kv, op.src, false});
    pending.push_back({kv, op.dst, true});
  }
  flush();
}

Expected<StepOutput> Qwen35Runner::execute(const StepPlan& plan) {
  run_ops(plan.before);
  StepOutput out;
  if (!plan.chunks.empty()) {
    std::vector<ForwardSeq> batch;
    batch.reserve(plan.chunks.size());
    chunk_row_.clear();
    int64_t rows = 0;
    for (const ScheduledChunk& c : plan.chunks) {
      ForwardSeq f{c.gdn_slot, c.block_table, c.start_pos, c.tokens, c.num_logits};
      f.argmax_vocab = c.argmax_vocab;
      f.argmax_excluded = c.argmax_excluded;
      f.draw = c.draw;
      f.speculative = c.speculative;
      f.saves = c.saves;
      chunk_row_.push_back(rows);
      rows += static_cast<int64_t>(c.tokens.size());
      // A prompt with images: its chunks take their positions and image rows from mm; every later
      // token (decode, or the output part of a recompute after preemption) sits at index + delta.
      if (MultimodalPrompt* mm = c.seq ? c.seq->req->mm.get() : nullptr) {
        if (c.start_pos < mm->length) f.mm = mm;
        f.rope_delta = mm->rope_delta;
      }
      batch.push_back(f);
    }
    SS_ASSIGN_OR_RETURN(out.logits, model_.forward(batch, state_.pools(), can_speculate() ? &capture_ : nullptr));
  }
  return out;
}

bool Qwen35Runner::can_speculate() const { return model_.has_mtp() && state_.limits().mtp; }

Expected<std::vector<std::vector<int32_t>>> Qwen35Runner::speculate(const StepPlan& plan, const SpecFollowUp& follow) {
  if (!can_speculate()) return ModelRunner::speculate(plan, follow);
  SS_RETURN_IF_ERROR(model_.commit_speculative(capture_, follow.accepted, state_.pools()));
  std::vector<Qwen35Model::DraftSeq> seqs;
  std::vector<std::vector<int32_t>> padded(follow.drafts.size());
  for (size_t i = 0; i < follow.drafts.size(); ++i) {
    const DraftRequest& d = follow.drafts[i];
    Qwen35Model::DraftSeq q;
    q.block_table = d.block_table;
    q.start_pos = d.start_pos;
    q.next_tokens = d.next_tokens;
    // A verify chunk's rejected tail is padded (rows that propose nothing) so that every step of a
    // batch has the same MTP shape, which a recording can replay, whatever was accepted.
    const ScheduledChunk& c = plan.chunks.at(d.chunk);
    const auto rows = static_cast<int64_t>(c.tokens.size());
    if (c.speculative && !d.next_tokens.empty() && static_cast<int64_t>(d.next_tokens.size()) < rows &&
        static_cast<int64_t>(d.block_table.size()) * state_.limits().block_size >= d.start_pos + rows) {
      padded[i].assign(d.next_tokens.begin(), d.next_tokens.end());
      padded[i].resize(static_cast<size_t>(rows), d.next_tokens.back());
      q.next_tokens = padded[i];
      q.draft_row = static_cast<int64_t>(d.next_tokens.size()) - 1;
    }
    q.hidden_row = chunk_row_.at(d.chunk);
    q.num_drafts = d.num_drafts;
    q.mm = d.mm;
    q.rope_delta = d.rope_delta;
    seqs.push_back(q);
  }
  if (seqs.empty()) return std::vector<std::vector<int32_t>>{};
  SS_ASSIGN_OR_RETURN(Qwen35Model::DraftResult r, model_.draft(seqs, capture_.hidden, state_.pools()));
  return std::move(r.drafts);
}

}  // namespace sparkserve
