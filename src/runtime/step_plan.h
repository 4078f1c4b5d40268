// The scheduler's decision for one engine step, as plain data: what the model runner must do to
// the state storage and which tokens of which sequences go through the model. The runner executes
// it without making any decision of its own; the post-processing step reads it back to sample.
//
// Room for what comes later without another rewrite:
// - a speculative verify step is a chunk of k+1 tokens with num_logits = k+1 (the acceptance and
//   the rollback of positions are post-processing and scheduler work; GDN rollback is state ops);
// - sampling on the device: the runner may return sampled ids instead of logits rows (StepOutput).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

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
  std::vector<StateOp> after;           // run after the forward (snapshots of chunk-end states)
  std::vector<EndedRequest> ended;
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const auto& c : chunks) n += static_cast<int64_t>(c.tokens.size());
    return n;
  }
  bool empty() const { return before.empty() && chunks.empty() && after.empty() && ended.empty(); }
};

}  // namespace sparkserve
