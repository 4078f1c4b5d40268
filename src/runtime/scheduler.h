// The scheduler: admission, preemption and all accounting of the state storage (KV blocks, GDN
// state slots, prefix-cache snapshots). Each step it emits a StepPlan (step_plan.h) under a token
// budget (max_num_batched_tokens) and a sequence cap (max_num_seqs):
// 1. running decodes, oldest first (one token each); a decode that needs a KV block when none is
//    free preempts the newest running sequence (slot and blocks freed, back to the front of the
//    queue; on readmission it resumes from its snapshot, or is recomputed from prompt + generated
//    tokens: the sampler's draws depend only on (seed, step), so the output does not change);
// 2. running sequences still in prefill, a chunk each within the budget and the free blocks;
// 3. waiting requests, first come first served, while a GDN slot is free, max_num_seqs is not
//    reached and the blocks of a first chunk exist (chunked prefill). A request longer than the
//    whole KV pool ends with an error instead of waiting forever.
//
// Prefix cache (hybrid model): a full-attention layer can reuse the KV of any shared prefix, but a
// Gated DeltaNet layer's state after token t exists only if it was saved at t. So full KV blocks
// carry the content hash of the prefix they end (block_pool.h) and GDN states are snapshotted
// (state_snapshots.h) at: the end of every prompt (position len-1: the last token always runs, to
// give the logits), the request's hints (the HTTP side gives where a chat template's generation
// prompt starts: the next turn re-renders the reply differently from there) or, without one, the
// block boundary before len-1, every snapshot_interval tokens of a long prompt, the end of the
// longest shared run of cached blocks found at admission (a branch point other requests
// demonstrably share) when it lies a block or more past the resumed state, and the end of every
// sequence (finished, cancelled or preempted).
// A request that wants prompt logprobs never resumes from the cache while some are unreported
// (every prompt position must go through the model to give its logits row).
// Admission resumes from the longest prefix where both exist: a snapshot at n, the blocks before
// n's block, and the snapshot's own copy of positions up to n in its tail block (copied into a new
// block: shared blocks are never written). Snapshot points do not cut prefill chunks (the budget and
// the free blocks do): the points inside a chunk become its saves (ScheduledChunk::saves), copies of
// the state the forward takes once it has folded in the tokens up to the point, published in
// commit(). A chunk's snapshot holds its tail block, whose positions before the point this forward
// writes and nothing rewrites later (the rows after the point write only later positions).
// The plan's positions become real in commit(), after the runner executed it; a verify chunk's
// (speculative decoding: the next token and its drafts, step 1) in advance(), by the accepted prefix.
// Drafts never reach a snapshot: a verify chunk is never a snapshot point, and the GDN state row
// holds only accepted tokens (the runner folds them in after acceptance).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/block_pool.h"
#include "runtime/engine_observer.h"
#include "runtime/model_runner.h"
#include "runtime/prefix_hash.h"
#include "runtime/sequence.h"
#include "runtime/state_snapshots.h"
#include "runtime/step_plan.h"

namespace sparkserve {

// Largest prefill chunk of a request that wants prompt logprobs: its logits rows (vocab floats
// each) are all materialised.
inline constexpr int64_t kPromptLogprobsChunk = 64;

struct SchedulerConfig {
  int32_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  bool prefix_caching = true;
  // Snapshots every this many tokens of a long prompt (rounded up to whole blocks; 0: none).
  int64_t snapshot_interval = 2048;
  // Speculative decoding: the most drafts a sequence takes per step (Sequence::spec_tokens).
  int64_t num_speculative_tokens = 0;
};

// Prefix-cache accounting, for tests and metrics.
struct PrefixCacheStats {
  int32_t cached_blocks = 0;     // KV blocks carrying a prefix hash (held or not)
  int32_t snapshots = 0;         // GDN state snapshots (found or pending)
  uint64_t queries = 0, hits = 0;  // prompt tokens looked up / found, first admissions only
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, CacheGeometry geometry, EngineObserver* observer);

  void add(std::shared_ptr<EngineRequest> request);
  // Whether a step would do anything.
  bool has_work() const { return !running_.empty() || !waiting_.empty() || !pending_ops_.empty(); }
  StepPlan schedule();
  // After the runner executed `plan`: its chunks' tokens are now in the state (ran_ok), or the
  // forward failed and its sequences are about to be finished with an error.
  void commit(const StepPlan& plan, bool ran_ok);
  // Speculative decoding (post-processing): n more tokens of seq's verify chunk are in its state.
  void advance(Sequence* seq, int64_t n);
  // Blocks for a verify chunk of k drafts after s's next token; returns the k that fits (0: none),
  // without evicting anything cached.
  int64_t reserve_drafts(Sequence& s, int64_t k);
  // A running sequence ended (post-processing): its state is snapshotted (prefix cache), its slot
  // and blocks are released and it is gone.
  void finish(Sequence* seq);
  // Every waiting and running request, removed (shutdown).
  std::vector<EndedRequest> take_all(const std::string& finish_reason);

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  // Blocks a new sequence could get (free, or cached and evictable).
  int32_t num_free_blocks() const { return blocks_.num_available(); }
  int32_t num_blocks_held_by_sequences() const { return blocks_.num_held_by_sequences(); }
  int32_t num_free_slots() const { return static_cast<int32_t>(free_slots_.size()); }
  uint64_t num_preemptions() const { return preemptions_; }
  PrefixCacheStats prefix_cache_stats() const;
  const CacheGeometry& geometry() const { return geometry_; }
  EngineGauges gauges() const;

 private:
  struct Hit {
    int64_t tokens = 0;           // positions resumed
    int32_t snapshot = -1;
    std::vector<int32_t> blocks;  // full blocks before the snapshot's block, shared
    int64_t matched_blocks = 0;   // full blocks of the prompt found cached (may go past the hit)
  };

  void drop_cancelled(StepPlan& plan);
  // Snapshots `s` (when caching) into `ops`, then frees its slot and blocks.
  void release_state(Sequence& s, std::vector<StateOp>& ops);
  void preempt(size_t running_index, StepPlan& plan);
  void end_sequence(std::unique_ptr<Sequence> s, StepPlan& plan, std::string reason, std::string error);
  // Adds blocks so that `s` covers num_computed + n positions; false (and nothing taken) when
  // the available blocks do not suffice.
  bool grow(Sequence& s, int64_t n);
  // The largest n <= want whose blocks fit in what is available (after evicting snapshots' tail
  // blocks if that makes room).
  int64_t fitting(Sequence& s, int64_t want);
  int32_t blocks_needed(const Sequence& s, int64_t n) const;
  // Tokens the next chunk of `s` may take: what remains, within the budget (and within
  // kPromptLogprobsChunk while its prompt logprobs are being reported).
  int64_t chunk_limit(const Sequence& s, int64_t budget) const;
  // Evicts least recently used snapshots whose tail block nobody else holds until `blocks` are
  // available; false when that is not enough.
  bool make_room(int32_t blocks);
  bool admit(Sequence& s, int64_t& budget, StepPlan& plan, int64_t& chunk);

  // ---- prefix cache ----
  const PrefixHash& chain(Sequence& s, int64_t q);  // H(q) of s's tokens
  PrefixHash snapshot_key(Sequence& s, int64_t n);
  Hit lookup(Sequence& s);
  void plan_snapshot_points(Sequence& s, int64_t matched_blocks);
  // The saves of chunk `c` of `s`: a snapshot at each of s's points inside it, pending until commit.
  void plan_saves(Sequence& s, ScheduledChunk& c);
  // A pending snapshot entry for s's state at num_computed + n (n tokens into this step's chunk of
  // s; 0: the state it holds now), its tail block held; the caller has its row filled. -1 when not
  // taken (caching off, nothing to save, already cached, no entry free).
  int32_t take_snapshot(Sequence& s, int64_t n);
  void register_full_blocks(Sequence& s);

  SchedulerConfig config_;
  CacheGeometry geometry_;
  EngineObserver* observer_;
  KvBlockPool blocks_;
  SnapshotPool snapshots_;
  PrefixHasher hasher_;
  std::vector<int32_t> free_slots_;  // LIFO
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order (oldest first)
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<StateOp> pending_ops_;     // snapshots of sequences finished since the last plan
  std::vector<int32_t> pending_publish_;  // snapshots the current plan's forward saves
  uint64_t preemptions_ = 0;
  uint64_t queries_ = 0, hits_ = 0;
};

}  // namespace sparkserve
