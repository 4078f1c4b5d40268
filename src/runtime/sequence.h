// The engine's record of one request while it is waiting or running: its tokens, where its state
// lives, how far the model has got. Owned by the scheduler; the post-processing step appends the
// tokens it samples.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/prefix_hash.h"
#include "runtime/request.h"

namespace sparkserve {

struct Sequence {
  std::shared_ptr<EngineRequest> req;
  std::vector<int32_t> tokens;  // the prompt, then every token generated so far
  int64_t prompt_len = 0;

  // Scheduler: the state it runs on. Tokens [0, num_computed) have their keys/values in `blocks`
  // and are folded into the GDN state in `slot`; a waiting sequence holds neither (num_computed 0).
  int32_t slot = -1;
  std::vector<int32_t> blocks;
  int64_t num_computed = 0;
  bool admitted_once = false;     // the prompt is counted once, not again after a preemption
  int64_t num_cached_tokens = 0;  // prompt tokens the prefix cache supplied at the first admission
  // Prefix cache: H(1..k), the chained hashes of its first k full blocks of tokens (computed as
  // needed; tokens only grow, so they stay valid); how many of its blocks carry their hash in the
  // block pool; the positions after which its state is saved.
  std::vector<PrefixHash> block_hashes;
  int64_t num_registered = 0;
  // Tokens a cache key may cover: image placeholders share one token id, so a key of ids alone
  // would hand one picture's KV to another; with images the cache stops at the first one.
  int64_t cacheable_len = INT64_MAX;
  std::vector<int64_t> snapshot_points;  // ascending
  // Speculative decoding: how many drafts it may take per step (0: none), the drafts proposed for
  // the next step (they follow `tokens`; dropped whenever the sequence loses its state), and the
  // verify chunk's tokens (the last token, then the drafts) while a step runs.
  int64_t spec_tokens = 0;
  std::vector<int32_t> drafts;
  std::vector<int32_t> verify;

  // Post-processing.
  bool first_token_sent = false;
  std::chrono::steady_clock::time_point last_token_time;
  int64_t prompt_logprobs_sent = 1;  // prompt positions reported (kept across a preemption)
  RequestTimeline timeline;

  std::span<const int32_t> prompt() const { return std::span(tokens).first(static_cast<size_t>(prompt_len)); }
  std::span<const int32_t> output() const { return std::span(tokens).subspan(static_cast<size_t>(prompt_len)); }
  int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Tokens still to go through the model before the next token can be sampled.
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
  // Prompt logprobs asked for (EngineRequest::prompt_logprobs) and not all reported yet: its chunks
  // need every logits row, so it may not resume from the prefix cache.
  bool wants_prompt_rows() const { return req->prompt_logprobs >= 0 && prompt_logprobs_sent < prompt_len; }
};

}  // namespace sparkserve
