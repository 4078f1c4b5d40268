// The step after the forward: for every chunk that asked for logits, report the prompt logprobs
// its rows give (EngineRequest::prompt_logprobs), and once a sequence's tokens all ran sample the next token
// (constraint mask, sampling parameters), append it to the sequence, check the token stops
// (min_tokens, EOS, stop ids, max_tokens, context), push the events, report to the observer, and
// tell the scheduler which sequences are done. Also the final event of every request the scheduler
// ended itself (cancelled, refused) or the forward failed on.
//
// Speculative decoding: a verify chunk [t, d1 .. dk] has k + 1 logits rows. Row j is sampled
// exactly as a plain decode step would be (same sampler, same (seed, step) draw, constraint and
// penalties over the tokens so far); draft d(j+1) is accepted iff that sample equals it, and the
// first mismatch (or a stop) ends the chunk. For a deterministic draft (the MTP's argmax, q = a
// point mass) this is the standard rejection rule: accept with probability min(1, p(d)/q(d)) =
// p(d), else draw from norm(max(0, p - q)) = p restricted to x != d, which is what "draw x ~ p,
// accept iff x == d, else emit x" does. Hence the output is the one without speculation, token for
// token, greedy or sampled. Row j's draw reads the sequence as it is when row j is reached (its
// output followed by d1 .. dj), so the rows of unconstrained chunks are drawn in parallel too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "runtime/engine_observer.h"
#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "runtime/step_plan.h"

namespace sparkserve {

class PostProcessor {
 public:
  // vocab_size: logits columns the sampler sees (the tokenizer's vocabulary; 0: all columns).
  // sampling_threads: threads that draw the rows of a step (1: the engine thread alone).
  PostProcessor(int64_t vocab_size, int64_t max_model_len, EngineObserver* observer, int sampling_threads = 1)
      : vocab_size_(vocab_size), max_model_len_(max_model_len), observer_(observer), pool_(sampling_threads) {}

  // Marks the chunks whose next token an argmax or a draw where the logits are decides
  // (device_choice), so the runner brings back only that choice.
  void mark_argmax_rows(StepPlan& plan) const;
  // follow (speculative decoding, may be null): receives per chunk the tokens now in its state
  // and, for every sequence that takes drafts (Sequence::spec_tokens) and is still running, the
  // MTP rows and draft count of the runner's next proposal.
  void run(const StepPlan& plan, const Expected<StepOutput>& out, Scheduler& scheduler,
           SpecFollowUp* follow = nullptr);
  // The final event of a request that will not run any further (it generated num_generated tokens).
  void end(EngineRequest& req, EngineEvent event, int64_t num_generated = 0, const RequestTimeline& timeline = {});

 private:
  // Logits columns the sampler sees of rows `logits_vocab` wide.
  int64_t vocab_of(int64_t logits_vocab) const;
  // The prompt logprobs of chunk c's rows (the first at logits row `first_row`) not yet reported.
  void report_prompt_logprobs(const ScheduledChunk& c, const Logits& logits, int64_t first_row);
  // Appends the drawn token (or fails the request on a non-finite row), checks the stops, pushes the
  // event, reports to the observer. Returns false when the sequence ended (it is gone then).
  bool emit(Sequence& s, SampleResult sample, Scheduler& scheduler);
  // How many drafts s should get after this step (its setting, the tokens it may still produce,
  // the context length); blocks reserved.
  int64_t draft_count(Sequence& s, Scheduler& scheduler) const;

  int64_t vocab_size_;
  int64_t max_model_len_;
  EngineObserver* observer_;
  std::vector<uint8_t> mask_;  // a constrained request's allowed tokens, reused per sample
  ThreadPool pool_;
};

}  // namespace sparkserve
