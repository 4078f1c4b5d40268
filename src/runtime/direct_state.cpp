#include "runtime/direct_state.h"

#include <string>

namespace sparkserve {

DirectState::DirectState(Backend& backend, const ModelConfig& config, const StateLimits& limits)
    : state_(backend, config, limits) {
  for (int32_t b = limits.num_kv_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  for (int32_t s = limits.max_sequences - 1; s >= 0; --s) free_slots_.push_back(s);
}

Expected<SequenceState> DirectState::open_sequence() {
  if (free_slots_.empty())
    return make_error("no free GDN state slot (all " + std::to_string(state_.limits().max_sequences) + " in use)");
  SequenceState s;
  s.gdn_slot = free_slots_.back();
  free_slots_.pop_back();
  state_.gdn().zero_row(s.gdn_slot);
  return s;
}

void DirectState::close_sequence(SequenceState& seq) {
  if (seq.gdn_slot >= 0) free_slots_.push_back(seq.gdn_slot);
  seq.gdn_slot = -1;
  for (int32_t b : seq.block_table) free_blocks_.push_back(b);
  seq.block_table.clear();
  seq.num_tokens = 0;
}

Status DirectState::skip_ahead(SequenceState& seq, int64_t n) {
  const int64_t bs = state_.kv().block_size();
  const int64_t need = (seq.num_tokens + n + bs - 1) / bs;
  if (need - static_cast<int64_t>(seq.block_table.size()) > static_cast<int64_t>(free_blocks_.size()))
    return make_error("KV cache full: " + std::to_string(need) + " blocks of " + std::to_string(bs) + " needed");
  while (static_cast<int64_t>(seq.block_table.size()) < need) {
    seq.block_table.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  seq.num_tokens += n;
  return Status::Ok();
}

Status DirectState::reserve(SequenceState& seq, int64_t positions) {
  const int64_t bs = state_.kv().block_size();
  const int64_t need = (positions + bs - 1) / bs - static_cast<int64_t>(seq.block_table.size());
  if (need > static_cast<int64_t>(free_blocks_.size()))
    return make_error("KV cache full: " + std::to_string(need) + " more blocks of " + std::to_string(bs) +
                      " needed for " + std::to_string(positions) + " positions");
  for (int64_t i = 0; i < need; ++i) {
    seq.block_table.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return Status::Ok();
}

Expected<Logits> DirectState::forward(Qwen35Model& model, std::vector<SequenceInput>& batch, SpecCapture* capture) {
  const int64_t bs = state_.kv().block_size();
  std::vector<size_t> had;
  auto give_back = [&] {
    for (size_t i = 0; i < had.size(); ++i) {
      std::vector<int32_t>& t = batch[i].state->block_table;
      while (t.size() > had[i]) {
        free_blocks_.push_back(t.back());
        t.pop_back();
      }
    }
  };
  for (SequenceInput& in : batch) {
    if (!in.state) {
      give_back();
      return make_error("sequence " + std::to_string(had.size()) + " has no state");
    }
    std::vector<int32_t>& t = in.state->block_table;
    had.push_back(t.size());
    const int64_t need = (in.state->num_tokens + static_cast<int64_t>(in.tokens.size()) + bs - 1) / bs;
    while (static_cast<int64_t>(t.size()) < need) {
      if (free_blocks_.empty()) {
        give_back();
        return make_error("KV cache full: " + std::to_string(need) + " blocks of " + std::to_string(bs) +
                          " needed for " + std::to_string(in.state->num_tokens + static_cast<int64_t>(in.tokens.size())) +
                          " tokens");
      }
      t.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
  }
  std::vector<ForwardSeq> fwd;
  for (const SequenceInput& in : batch) {
    ForwardSeq f;
    f.gdn_slot = in.state->gdn_slot;
    f.block_table = in.state->block_table;
    f.start_pos = in.state->num_tokens;
    f.tokens = in.tokens;
    f.num_logits = in.all_logits || in.speculative ? static_cast<int64_t>(in.tokens.size()) : 1;
    f.speculative = in.speculative;
    f.mm = in.mm;
    f.argmax_vocab = in.argmax_vocab;
    f.argmax_excluded = in.argmax_excluded;
    f.draw = in.draw;
    f.rope_delta = in.state->rope_delta;
    f.saves = in.saves;
    fwd.push_back(f);
  }
  auto logits = model.forward(fwd, state_.pools(), capture);
  if (!logits.ok()) {
    give_back();
    return logits;
  }
  for (SequenceInput& in : batch) {
    if (!in.speculative) in.state->num_tokens += static_cast<int64_t>(in.tokens.size());
    if (in.mm) in.state->rope_delta = in.mm->rope_delta;  // later tokens continue after the images
  }
  return logits;
}

}  // namespace sparkserve
