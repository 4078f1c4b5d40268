// Sequences run without the engine (generate, logits, bench, tests): the model's state storage
// with the simplest accounting on top — a free list of GDN slots, a free list of KV blocks, each
// sequence's block table grown as its tokens arrive. No sharing, no prefix cache; the engine uses
// its scheduler (runtime/scheduler.h) over the same storage instead.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/qwen35.h"
#include "runtime/model_state.h"

namespace sparkserve {

// One sequence's handle on the state.
struct SequenceState {
  int32_t gdn_slot = -1;
  std::vector<int32_t> block_table;  // KV blocks, in position order
  int64_t num_tokens = 0;            // tokens already processed (the next token's position)
  // M-RoPE: a token after a prompt's images sits at rotary position index + rope_delta
  // (transformers' rope_deltas; 0 for text-only sequences). Set by the forward that sees the images.
  int64_t rope_delta = 0;
};

// One sequence's part of a forward batch: its new tokens continuing from state->num_tokens.
struct SequenceInput {
  SequenceState* state = nullptr;
  std::vector<int32_t> tokens;
  bool all_logits = false;  // logits for every new token (teacher forcing), else only the last
  MultimodalPrompt* mm = nullptr;  // the prompt's images (model/multimodal.h), for its prefill chunks
  int64_t argmax_vocab = 0;        // ForwardSeq::argmax_vocab
  std::vector<int32_t> argmax_excluded;  // ForwardSeq::argmax_excluded
  RowDraw draw;                          // ForwardSeq::draw
  // A verify chunk (next token + drafts; logits for every token; GDN state not advanced until
  // Qwen35Model::commit_speculative): ForwardSeq::speculative.
  bool speculative = false;
  // GDN state saves inside the chunk (ForwardSeq::saves; rows past the live slots, StateLimits::num_snapshots).
  std::vector<GdnStateSave> saves;
};

class DirectState {
 public:
  DirectState(Backend& backend, const ModelConfig& config, const StateLimits& limits);

  // A fresh sequence (zeroed GDN slot, no KV blocks); error when no slot is free.
  Expected<SequenceState> open_sequence();
  // Returns the sequence's slot and blocks.
  void close_sequence(SequenceState& seq);

  // Advances the sequence by n positions without running the model: their KV blocks are reserved and
  // whatever the pools hold there stands for their keys and values (bench's zero-filled contexts).
  Status skip_ahead(SequenceState& seq, int64_t n);

  // Grows seq's block table to cover `positions` positions (e.g. the MTP's chained draft rows past
  // its tokens); error when the blocks run out (nothing taken then).
  Status reserve(SequenceState& seq, int64_t positions);

  // Reserves the KV blocks the new tokens need, runs `model`, advances every num_tokens (but those
  // of speculative inputs: the caller advances them by the accepted prefix). Errors (no block left,
  // a model error) leave every sequence and the free lists as they were. capture: as
  // Qwen35Model::forward's (speculative decoding's hidden rows and verify stash).
  Expected<Logits> forward(Qwen35Model& model, std::vector<SequenceInput>& batch, SpecCapture* capture = nullptr);

  ModelState& state() { return state_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  int32_t free_slots() const { return static_cast<int32_t>(free_slots_.size()); }

 private:
  ModelState state_;
  std::vector<int32_t> free_blocks_, free_slots_;  // LIFO
};

}  // namespace sparkserve
