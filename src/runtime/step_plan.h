// The scheduler's decision for one engine step, as plain data: what the model runner must do to
// the state storage and which tokens of which sequences go through the model. The runner executes
// it without making any decision of its own; the post-processing step reads it back to sample.
//
// Speculative decoding: a verify chunk is a sequence's next token and the k drafts after it, with
// num_logits = k + 1; post-processing accepts a prefix of it (SpecFollowUp), the runner then folds
// only that prefix into the GDN state and proposes the next drafts with the MTP layer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/forward_batch.h"
#include "runtime/request.h"

namespace sparkserve {

struct Sequence;

// One operation on the state storage, run in list order on the model's stream.
struct StateOp {
  enum class Kind {
    kZeroState,    // GDN state row dst := zeros (a sequence starting from nothing)
    kCopyState,    // GDN state row dst := row src (snapshot save / restore)
    kCopyKvBlock,  // KV block dst := block src, every layer (copy-on-write of a shared block)
  };
  Kind kind = Kind::kZeroState;
  int32_t src = -1;
  int32_t dst = -1;
};

// One sequence's tokens in this step's forward.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t gdn_slot = -1;
  std::span<const int32_t> block_table;  // covers positions [0, start_pos + tokens.size())
  int64_t start_pos = 0;
  std::span<const int32_t> tokens;
  int64_t num_logits = 0;  // rows wanted for the last num_logits tokens (1: sample after this chunk)
  int64_t argmax_vocab = 0;  // > 0: only the greedy choice over these columns is needed (ForwardSeq)
  std::vector<int32_t> argmax_excluded;  // with argmax_vocab: columns out of play (ForwardSeq)
  RowDraw draw;  // with argmax_vocab: a draw instead of the argmax when draw.temperature > 0 (ForwardSeq)
  bool speculative = false;  // a verify chunk: tokens = next token + drafts, its GDN state not advanced
  // Prefix-cache snapshots taken inside the forward: the state after the chunk's first `tokens`
  // tokens goes to a snapshot row (ascending; never in a verify chunk).
  std::vector<GdnStateSave> saves;
};

// A request the scheduler ended without running it further (cancelled, impossible to serve).
struct EndedRequest {
  std::shared_ptr<EngineRequest> req;
  std::string finish_reason;  // "abort" | "stop" | "error"
  std::string error;
  int64_t num_generated = 0;  // tokens it had produced (for the observer)
  RequestTimeline timeline;
};

struct StepPlan {
  std::vector<StateOp> before;          // run before the forward
  std::vector<ScheduledChunk> chunks;   // the forward's batch (may be empty: state ops only)
  std::vector<EndedRequest> ended;
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& c : chunks) n += static_cast<int64_t>(c.tokens.size());
    return n;
  }
  bool empty() const { return before.empty() && chunks.empty() && ended.empty(); }
};

// What follows a step's post-processing when speculative decoding is on (Engine::step -> runner).
struct DraftRequest {
  Sequence* seq = nullptr;  // gets the drafts
  size_t chunk = 0;  // index in the plan's chunks: its first rows (hidden states) are this one's
  // MTP rows at positions start_pos .. start_pos + next_tokens.size() - 1, row p paired with the
  // token at p + 1; then num_drafts chained drafts after the last row.
  std::span<const int32_t> block_table;  // covers start_pos + rows + num_drafts positions
  int64_t start_pos = 0;
  std::vector<int32_t> next_tokens;
  int64_t num_drafts = 0;
  MultimodalPrompt* mm = nullptr;  // the chunk's prompt images (positions), as ScheduledChunk's
  int64_t rope_delta = 0;
};
struct SpecFollowUp {
  // Per chunk of the plan: tokens of the chunk now part of the sequence's state. Speculative chunks
  // fold exactly these into their GDN state (0 for a chunk that failed); other chunks are ignored.
  std::vector<int64_t> accepted;
  std::vector<int64_t> drafts_accepted;  // per chunk: drafts whose verify sample equalled them
  std::vector<DraftRequest> drafts;
};

}  // namespace sparkserve
