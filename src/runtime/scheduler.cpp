#include "runtime/scheduler.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace sparkserve {

Scheduler::Scheduler(SchedulerConfig config, CacheGeometry geometry, EngineObserver* observer)
    : config_(config),
      geometry_(geometry),
      observer_(observer),
      blocks_(geometry.num_blocks),
      snapshots_(config.prefix_caching ? geometry.num_snapshots : 0, geometry.num_slots) {
  for (int32_t s = geometry.num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  if (config_.snapshot_interval > 0)
    config_.snapshot_interval =
        (config_.snapshot_interval + geometry.block_size - 1) / geometry.block_size * geometry.block_size;
}

void Scheduler::add(std::shared_ptr<EngineRequest> request) {
  auto s = std::make_unique<Sequence>();
  s->tokens = request->prompt;
  s->prompt_len = static_cast<int64_t>(request->prompt.size());
  s->spec_tokens = request->num_speculative_tokens < 0
                       ? config_.num_speculative_tokens
                       : std::min(request->num_speculative_tokens, config_.num_speculative_tokens);
  if (request->mm && !request->mm->image_begin.empty()) s->cacheable_len = request->mm->image_begin.front();
  s->req = std::move(request);
  waiting_.push_back(std::move(s));
}

// ---- prefix cache -------------------------------------------------------------------------------

const PrefixHash& Scheduler::chain(Sequence& s, int64_t q) {
  static const PrefixHash kEmpty{};
  const int64_t bs = geometry_.block_size;
  CHECK(q * bs <= static_cast<int64_t>(s.tokens.size()));
  while (static_cast<int64_t>(s.block_hashes.size()) < q) {
    const int64_t i = static_cast<int64_t>(s.block_hashes.size());
    const PrefixHash parent = i == 0 ? kEmpty : s.block_hashes.back();
    s.block_hashes.push_back(hasher_.extend(parent, std::span(s.tokens).subspan(static_cast<size_t>(i * bs),
                                                                                 static_cast<size_t>(bs))));
  }
  return q == 0 ? kEmpty : s.block_hashes[static_cast<size_t>(q - 1)];
}

PrefixHash Scheduler::snapshot_key(Sequence& s, int64_t n) {
  const int64_t q = n / geometry_.block_size;
  const int64_t start = q * geometry_.block_size;
  return hasher_.extend(chain(s, q), std::span(s.tokens).subspan(static_cast<size_t>(start),
                                                                  static_cast<size_t>(n - start)));
}

Scheduler::Hit Scheduler::lookup(Sequence& s) {
  Hit hit;
  const int64_t bs = geometry_.block_size;
  // The last token always runs: its logits give the next token.
  const int64_t limit = std::min(static_cast<int64_t>(s.tokens.size()) - 1, s.cacheable_len);
  if (!config_.prefix_caching || limit <= 0 || s.wants_prompt_rows()) return hit;
  std::vector<int32_t> found;
  for (int64_t q = 0; (q + 1) * bs <= limit; ++q) {
    const int32_t b = blocks_.lookup(chain(s, q + 1));
    if (b < 0) break;
    found.push_back(b);
  }
  hit.matched_blocks = static_cast<int64_t>(found.size());
  if (snapshots_.size() == 0) return hit;
  // The best snapshot lies in the furthest block that has one.
  for (int64_t q = hit.matched_blocks; q >= 0; --q) {
    const std::vector<int32_t>* ids = snapshots_.with_parent(chain(s, q));
    if (!ids) continue;
    for (int32_t id : *ids) {
      const Snapshot& snap = snapshots_.get(id);
      if (snap.position > limit || snap.position <= hit.tokens) continue;
      if (!(snap.key == snapshot_key(s, snap.position))) continue;
      hit.tokens = snap.position;
      hit.snapshot = id;
    }
    if (hit.snapshot >= 0) {
      hit.blocks.assign(found.begin(), found.begin() + q);
      return hit;
    }
  }
  return hit;
}

void Scheduler::plan_snapshot_points(Sequence& s, int64_t matched_blocks) {
  s.snapshot_points.clear();
  if (!config_.prefix_caching || snapshots_.capacity() == 0) return;
  const int64_t bs = geometry_.block_size, from = s.num_computed;
  const int64_t end = static_cast<int64_t>(s.tokens.size()) - 1;  // the prompt's last position
  auto add = [&](int64_t p) {
    if (p > from && p <= end) s.snapshot_points.push_back(p);
  };
  // Where the next request may resume: the prompt's last position (a repeat or a retry of this
  // request); the HTTP side's hints (e.g. where the chat template's generation prompt begins: the
  // next turn of the conversation renders this reply differently from there); without a hint, the
  // block boundary before the last position (where a re-rendered last turn may diverge). Points are
  // saved inside the forward that runs them (ScheduledChunk::saves): they cost a snapshot entry each,
  // no extra forward.
  add(end);
  if (s.req->snapshot_hints.empty()) add(end / bs * bs);
  for (int64_t p : s.req->snapshot_hints) add(p);
  // The end of a prefix other requests share (the last cached block found at admission): a request
  // branching there resumes exactly at it. Not when it lies less than a block past the state this
  // request resumed from: one branching there resumes from that state instead, recomputing less
  // than a block, and every save is one more round of the GDN layers in this forward. (A later turn
  // of a conversation finds the previous turn's blocks a few tokens past its snapshot.)
  if (matched_blocks * bs >= from + bs) add(matched_blocks * bs);
  if (config_.snapshot_interval > 0)
    for (int64_t p = (from / config_.snapshot_interval + 1) * config_.snapshot_interval; p < end;
         p += config_.snapshot_interval)
      add(p);
  std::sort(s.snapshot_points.begin(), s.snapshot_points.end());
  s.snapshot_points.erase(std::unique(s.snapshot_points.begin(), s.snapshot_points.end()), s.snapshot_points.end());
}

void Scheduler::plan_saves(Sequence& s, ScheduledChunk& c) {
  auto& pts = s.snapshot_points;
  pts.erase(pts.begin(), std::upper_bound(pts.begin(), pts.end(), s.num_computed));
  const auto n = static_cast<int64_t>(c.tokens.size());
  for (auto it = pts.begin(); it != pts.end() && *it <= s.num_computed + n; ++it) {
    const int32_t id = take_snapshot(s, *it - s.num_computed);
    if (id < 0) continue;
    c.saves.push_back(GdnStateSave{*it - s.num_computed, snapshots_.row(id)});
    pending_publish_.push_back(id);
  }
}

int32_t Scheduler::take_snapshot(Sequence& s, int64_t n) {
  const int64_t pos = s.num_computed + n;
  if (!config_.prefix_caching || snapshots_.capacity() == 0 || pos <= 0 || pos > s.cacheable_len || s.slot < 0)
    return -1;
  const int64_t bs = geometry_.block_size;
  Snapshot snap;
  snap.key = snapshot_key(s, pos);
  if (snapshots_.contains(snap.key)) return -1;
  snap.parent = chain(s, pos / bs);
  snap.position = pos;
  if (pos % bs != 0) snap.tail_block = s.blocks[static_cast<size_t>(pos / bs)];
  int32_t evicted_tail = -1;
  const std::optional<int32_t> id = snapshots_.add(snap, &evicted_tail);
  if (evicted_tail >= 0) blocks_.release(evicted_tail, /*cache=*/true);
  if (!id) return -1;
  if (snap.tail_block >= 0) blocks_.retain(snap.tail_block, /*cache=*/true);
  return *id;
}

void Scheduler::register_full_blocks(Sequence& s) {
  if (!config_.prefix_caching) return;
  const int64_t full = std::min(s.num_computed, s.cacheable_len) / geometry_.block_size;
  for (; s.num_registered < full; ++s.num_registered)
    blocks_.register_hash(s.blocks[static_cast<size_t>(s.num_registered)], chain(s, s.num_registered + 1));
}

bool Scheduler::make_room(int32_t need) {
  while (blocks_.num_available() < need) {
    int32_t victim = -1;
    for (int32_t id : snapshots_.lru_order()) {
      // Only a tail block nobody but this snapshot holds frees anything.
      const int32_t tail = snapshots_.get(id).tail_block;
      if (tail >= 0 && blocks_.holders(tail) == 1) {
        victim = id;
        break;
      }
    }
    if (victim < 0) return false;
    blocks_.release(snapshots_.remove(victim), /*cache=*/true);
  }
  return true;
}

// ---- sequences ----------------------------------------------------------------------------------

void Scheduler::release_state(Sequence& s, std::vector<StateOp>& ops) {
  // The copy runs before anything that could look the snapshot up (the next plan's ops, or this
  // plan's ops before its forward).
  if (const int32_t id = take_snapshot(s, 0); id >= 0) {
    ops.push_back(StateOp{StateOp::Kind::kCopyState, s.slot, snapshots_.row(id)});
    snapshots_.publish(id);
  }
  if (s.slot >= 0) free_slots_.push_back(s.slot);
  s.slot = -1;
  // Last block first: the LRU then evicts a released prefix from its end.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) blocks_.release(*it);
  s.blocks.clear();
  s.num_computed = 0;
  s.num_registered = 0;
  s.snapshot_points.clear();
  s.drafts.clear();
}

void Scheduler::finish(Sequence* seq) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
  CHECK_MSG(it != running_.end(), "finish: not a running sequence");
  release_state(**it, pending_ops_);
  running_.erase(it);
}

void Scheduler::end_sequence(std::unique_ptr<Sequence> s, StepPlan& plan, std::string reason, std::string error) {
  release_state(*s, plan.before);
  plan.ended.push_back(
      EndedRequest{std::move(s->req), std::move(reason), std::move(error), s->num_generated(), s->timeline});
}

std::vector<EndedRequest> Scheduler::take_all(const std::string& finish_reason) {
  StepPlan plan;
  for (auto& s : running_) end_sequence(std::move(s), plan, finish_reason, "");
  for (auto& s : waiting_) end_sequence(std::move(s), plan, finish_reason, "");
  running_.clear();
  waiting_.clear();
  return std::move(plan.ended);
}

void Scheduler::drop_cancelled(StepPlan& plan) {
  // A stop string found by the HTTP side ends the request as "stop", anything else as "abort".
  auto drop = [&](std::unique_ptr<Sequence>& s) {
    if (!s->req->cancelled.load()) return;
    std::string reason = s->req->stopped_by_string.load() ? "stop" : "abort";
    end_sequence(std::move(s), plan, std::move(reason), "");
  };
  for (auto& s : running_) drop(s);
  std::erase_if(running_, [](const auto& s) { return !s; });
  for (auto& s : waiting_) drop(s);
  std::erase_if(waiting_, [](const auto& s) { return !s; });
}

void Scheduler::preempt(size_t i, StepPlan& plan) {
  std::unique_ptr<Sequence> s = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  release_state(*s, plan.before);  // resumed from its snapshot, or recomputed, on readmission
  waiting_.push_front(std::move(s));
  ++preemptions_;
  if (observer_) observer_->on_preemption();
}

int32_t Scheduler::blocks_needed(const Sequence& s, int64_t n) const {
  const int64_t bs = geometry_.block_size;
  return static_cast<int32_t>(std::max<int64_t>(0, (s.num_computed + n + bs - 1) / bs - static_cast<int64_t>(s.blocks.size())));
}

int64_t Scheduler::chunk_limit(const Sequence& s, int64_t budget) const {
  const int64_t want = std::min(s.remaining(), budget);
  return s.wants_prompt_rows() ? std::min(want, kPromptLogprobsChunk) : want;
}

int64_t Scheduler::fitting(Sequence& s, int64_t want) {
  make_room(blocks_needed(s, want));
  const int64_t capacity =
      (static_cast<int64_t>(s.blocks.size()) + blocks_.num_available()) * geometry_.block_size - s.num_computed;
  return std::max<int64_t>(0, std::min(want, capacity));
}

bool Scheduler::grow(Sequence& s, int64_t n) {
  const int32_t need = blocks_needed(s, n);
  if (need > blocks_.num_available() && !make_room(need)) return false;
  for (int32_t i = 0; i < need; ++i) s.blocks.push_back(*blocks_.allocate());
  return true;
}

bool Scheduler::admit(Sequence& s, int64_t& budget, StepPlan& plan, int64_t& chunk) {
  const bool first = !s.admitted_once;
  Hit hit = lookup(s);
  // Share the cached blocks before sizing the chunk (they leave the evictable LRU), and hold the
  // snapshot's tail block meanwhile, so that making room for the chunk cannot evict the snapshot.
  for (int32_t b : hit.blocks) blocks_.retain(b);
  const int32_t tail = hit.snapshot >= 0 ? snapshots_.get(hit.snapshot).tail_block : -1;
  if (hit.snapshot >= 0) snapshots_.touch(hit.snapshot);
  if (tail >= 0) blocks_.retain(tail);
  s.blocks = hit.blocks;
  s.num_computed = hit.tokens;
  s.num_registered = static_cast<int64_t>(hit.blocks.size());
  plan_snapshot_points(s, hit.matched_blocks);
  const int64_t n = fitting(s, chunk_limit(s, budget));
  if (n == 0) {
    if (tail >= 0) blocks_.release(tail);
    for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) blocks_.release(*it);
    s.blocks.clear();
    s.num_computed = s.num_registered = 0;
    return false;
  }
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  CHECK(grow(s, n));
  if (hit.snapshot >= 0) {
    plan.before.push_back(StateOp{StateOp::Kind::kCopyState, snapshots_.row(hit.snapshot), s.slot});
    if (tail >= 0) {
      const int32_t own = s.blocks[static_cast<size_t>(hit.tokens / geometry_.block_size)];
      plan.before.push_back(StateOp{StateOp::Kind::kCopyKvBlock, tail, own});
      blocks_.release(tail);  // the copy runs before anything this plan writes
    }
  } else {
    plan.before.push_back(StateOp{StateOp::Kind::kZeroState, -1, s.slot});
  }
  if (first) {
    s.timeline.admitted = std::chrono::steady_clock::now();
    s.num_cached_tokens = hit.tokens;
    queries_ += static_cast<uint64_t>(s.prompt_len);
    hits_ += static_cast<uint64_t>(hit.tokens);
    if (observer_) observer_->on_prompt(s.prompt_len, hit.tokens);
  }
  s.admitted_once = true;
  budget -= n;
  chunk = n;
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.before = std::move(pending_ops_);  // snapshots of finished sequences, before slot reuse
  pending_ops_.clear();
  pending_publish_.clear();
  drop_cancelled(plan);
  int64_t budget = config_.max_num_batched_tokens;
  std::vector<int64_t> chunk(running_.size(), 0);  // tokens scheduled per running sequence

  // 1. Decodes, oldest first; a decode that needs a block takes it from the newest sequence. A
  // sequence with drafts verifies them in the same chunk when the budget and its blocks allow.
  for (size_t i = 0; i < running_.size();) {
    Sequence& s = *running_[i];
    if (s.remaining() != 1 || budget < 1) {
      ++i;
      continue;
    }
    int64_t want = 1 + std::min<int64_t>(static_cast<int64_t>(s.drafts.size()), budget - 1);
    bool grown = grow(s, want);
    if (!grown && want > 1) {
      s.drafts.clear();
      want = 1;
      grown = grow(s, 1);
    }
    while (!grown && running_.size() - 1 > i) {
      preempt(running_.size() - 1, plan);
      chunk.pop_back();
      grown = grow(s, 1);
    }
    if (!grown) {  // it is the newest itself: it waits
      preempt(i, plan);
      chunk.erase(chunk.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    chunk[i] = want;
    budget -= want;
    ++i;
  }
  // 2. Running sequences still in prefill.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (chunk[i] != 0 || s.remaining() <= 1) continue;
    const int64_t n = fitting(s, chunk_limit(s, budget));
    if (n == 0) continue;
    CHECK(grow(s, n));
    chunk[i] = n;
    budget -= n;
  }
  // 3. Admission, first come first served: a GDN slot and the blocks of the first chunk.
  const int64_t pool_tokens = static_cast<int64_t>(geometry_.num_blocks) * geometry_.block_size;
  while (budget > 0 && !waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_num_seqs &&
         !free_slots_.empty()) {
    Sequence& s = *waiting_.front();
    if (static_cast<int64_t>(s.tokens.size()) > pool_tokens) {  // could never fit, even alone
      std::unique_ptr<Sequence> gone = std::move(waiting_.front());
      waiting_.pop_front();
      end_sequence(std::move(gone), plan, "error",
                   "the request needs " + std::to_string(s.tokens.size()) + " KV positions; the cache holds " +
                       std::to_string(pool_tokens));
      continue;
    }
    int64_t n = 0;
    if (!admit(s, budget, plan, n)) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    chunk.push_back(n);
  }

  for (size_t i = 0; i < running_.size(); ++i) {
    if (chunk[i] == 0) continue;
    Sequence& s = *running_[i];
    ScheduledChunk c;
    c.seq = &s;
    c.gdn_slot = s.slot;
    c.block_table = s.blocks;
    c.start_pos = s.num_computed;
    if (s.remaining() == 1 && chunk[i] > 1) {
      // A verify chunk: the next token and the first chunk[i] - 1 drafts, a logits row each.
      s.verify.assign(1, s.tokens.back());
      s.verify.insert(s.verify.end(), s.drafts.begin(), s.drafts.begin() + (chunk[i] - 1));
      c.tokens = s.verify;
      c.num_logits = chunk[i];
      c.speculative = true;
      s.drafts.clear();
      plan.chunks.push_back(c);
      continue;  // never a snapshot point: the state it leaves is decided by post-processing
    }
    s.drafts.clear();
    c.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.num_computed),
                                                          static_cast<size_t>(chunk[i]));
    // Every row while prompt logprobs are due; else one to sample after the last token.
    c.num_logits = s.wants_prompt_rows() ? chunk[i]
                   : s.num_computed + chunk[i] == static_cast<int64_t>(s.tokens.size()) ? 1
                                                                                        : 0;
    plan_saves(s, c);
    plan.chunks.push_back(std::move(c));
  }
  // Nothing fits: sequences in prefill hold every block. Free the newest so others progress.
  if (plan.chunks.empty() && !running_.empty()) preempt(running_.size() - 1, plan);
  return plan;
}

void Scheduler::commit(const StepPlan& plan, bool ran_ok) {
  if (!ran_ok) {
    for (int32_t id : pending_publish_) {
      const int32_t tail = snapshots_.remove(id);
      if (tail >= 0) blocks_.release(tail, /*cache=*/true);
    }
    pending_publish_.clear();
    return;
  }
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.speculative) continue;  // post-processing advances it by the accepted prefix
    c.seq->num_computed += static_cast<int64_t>(c.tokens.size());
    register_full_blocks(*c.seq);
  }
  for (int32_t id : pending_publish_) snapshots_.publish(id);  // their saves ran in the forward
  pending_publish_.clear();
}

void Scheduler::advance(Sequence* seq, int64_t n) {
  CHECK(seq->num_computed + n <= static_cast<int64_t>(seq->tokens.size()));
  seq->num_computed += n;
  register_full_blocks(*seq);
}

int64_t Scheduler::reserve_drafts(Sequence& s, int64_t k) {
  // Positions num_computed .. num_computed + k: the next verify chunk (the MTP's chained rows stay
  // below it). Never evicts cached state for a draft.
  for (; k > 0; --k) {
    const int32_t need = blocks_needed(s, k + 1);
    if (need > blocks_.num_available()) continue;
    for (int32_t i = 0; i < need; ++i) s.blocks.push_back(*blocks_.allocate());
    return k;
  }
  return 0;
}

PrefixCacheStats Scheduler::prefix_cache_stats() const {
  PrefixCacheStats p;
  p.cached_blocks = blocks_.num_hashed();
  p.snapshots = snapshots_.size();
  p.queries = queries_;
  p.hits = hits_;
  return p;
}

EngineGauges Scheduler::gauges() const {
  EngineGauges g;
  g.running = num_running();
  g.waiting = num_waiting();
  const int32_t tb = geometry_.num_blocks, ts = geometry_.num_slots;
  g.kv_cache_usage = tb > 0 ? static_cast<double>(blocks_.num_held_by_sequences()) / tb : 0.0;
  g.state_slots_usage = ts > 0 ? 1.0 - static_cast<double>(free_slots_.size()) / ts : 0.0;
  return g;
}

}  // namespace sparkserve
