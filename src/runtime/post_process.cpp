#include "runtime/post_process.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <span>
#include <string>

namespace sparkserve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

void PostProcessor::end(EngineRequest& req, EngineEvent event, int64_t num_generated, const RequestTimeline& timeline) {
  event.finished = true;
  if (observer_) {
    const auto now = Clock::now();
    const auto admitted = timeline.admitted.value_or(now), first = timeline.first_token.value_or(now);
    FinishedRequest f;
    f.finish_reason = event.finish_reason;
    f.e2e_s = seconds_between(req.arrival, now);
    f.queue_s = seconds_between(req.arrival, admitted);
    f.prefill_s = seconds_between(admitted, first);
    f.decode_s = seconds_between(first, now);
    f.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    f.generation_tokens = num_generated;
    observer_->on_finished(f);
  }
  req.mm.reset();  // the image embeddings are backend memory: freed here, on the engine thread
  req.out.push(std::move(event));
}

void PostProcessor::run(const StepPlan& plan, const Expected<StepOutput>& out, Scheduler& scheduler,
                        SpecFollowUp* follow) {
  for (const EndedRequest& e : plan.ended) {
    EngineEvent ev;
    ev.finish_reason = e.finish_reason;
    ev.error = e.error;
    end(*e.req, std::move(ev), e.num_generated, e.timeline);
  }
  if (!out.ok()) {
    for (const ScheduledChunk& c : plan.chunks) {
      EngineEvent err;
      err.finish_reason = "error";
      err.error = out.message();
      end(*c.seq->req, std::move(err), c.seq->num_generated(), c.seq->timeline);
      scheduler.finish(c.seq);
    }
    return;
  }
  // Draw every row's token first: sample_token is a pure function of the row and the sequence, so
  // the rows without a constraint (whose matcher state is the engine thread's) are drawn on the
  // pool; then each sequence takes its tokens in plan order, exactly as if drawn one by one. Row j
  // of a verify chunk is drawn against the output it would follow: the sequence's, then d1 .. dj.
  const Logits& logits = out->logits;
  struct Draw {
    Sequence* seq;
    const float* row;             // null when only the argmax came back
    const RowArgmax* argmax;      // else null
    std::vector<int32_t> output;  // row j > 0 of a verify chunk: the output followed by d1 .. dj
    SampleResult result;
  };
  std::vector<Draw> draws;
  std::vector<size_t> first_draw(plan.chunks.size()), num_draws(plan.chunks.size(), 0);
  std::vector<bool> ended(plan.chunks.size(), false);
  int64_t row = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    first_draw[i] = draws.size();
    if (c.num_logits == 0) continue;  // a prefill chunk short of the end: nothing to sample
    const int64_t first_row = row;
    row += c.num_logits;
    Sequence& s = *c.seq;
    if (!c.speculative) {
      if (s.req->prompt_logprobs >= 0) report_prompt_logprobs(c, logits, first_row);
      if (s.remaining() != 0) continue;  // committed: a prompt chunk short of the end (rows for logprobs only)
      if (s.req->prompt_only && s.num_generated() == 0) {  // echo with max_tokens 0: the prompt was all
        EngineEvent e;
        e.finish_reason = "length";
        end(*s.req, std::move(e), 0, s.timeline);
        scheduler.finish(&s);
        ended[i] = true;
        continue;
      }
    }
    // Every row of a verify chunk; the last row of any other.
    for (int64_t j = c.speculative ? 0 : c.num_logits - 1; j < c.num_logits; ++j) {
      const int64_t r = first_row + j;
      const bool values = logits.has_values(r);
      Draw d{c.seq, values ? logits.row(r) : nullptr, values ? nullptr : &logits.argmax[static_cast<size_t>(r)], {}, {}};
      if (c.speculative && j > 0) {
        const auto o = s.output();
        d.output.assign(o.begin(), o.end());
        d.output.insert(d.output.end(), c.tokens.begin() + 1, c.tokens.begin() + 1 + j);
      }
      draws.push_back(std::move(d));
      ++num_draws[i];
    }
  }
  const int64_t vocab = vocab_of(logits.vocab);
  auto free_draw = [&](Draw& d) {
    if (d.argmax) {  // what sample_token decides for this row (mark_argmax_rows): its argmax
      if (d.argmax->nonfinite >= 0) d.result.nonfinite_logit = d.argmax->nonfinite;
      else d.result.token = d.argmax->id;
    } else {
      const std::span<const int32_t> output = d.output.empty() ? d.seq->output() : std::span<const int32_t>(d.output);
      d.result = sample_token(std::span<const float>(d.row, static_cast<size_t>(vocab)), d.seq->req->params,
                              d.seq->prompt(), output);
    }
  };
  pool_.parallel_for(static_cast<int64_t>(draws.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (!draws[static_cast<size_t>(i)].seq->req->constraint) free_draw(draws[static_cast<size_t>(i)]);
  });
  // A constrained row is drawn when its sequence reaches it: the mask follows every token taken.
  auto take = [&](Draw& d) {
    if (const auto& constraint = d.seq->req->constraint) {
      mask_.resize(static_cast<size_t>(vocab));
      constraint->allowed_tokens(mask_);
      d.result = sample_token(std::span<const float>(d.row, static_cast<size_t>(vocab)), d.seq->req->params,
                              d.seq->prompt(), d.seq->output(), mask_);
    }
    return std::move(d.result);
  };
  if (follow) {
    follow->accepted.assign(plan.chunks.size(), 0);
    follow->drafts_accepted.assign(plan.chunks.size(), 0);
  }
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    Sequence& s = *c.seq;
    int64_t in_state = static_cast<int64_t>(c.tokens.size());  // tokens of the chunk now in s's state
    bool running = !ended[i];
    if (c.speculative) {
      // Row j verifies draft j + 1: reaching row j means token j of the chunk is accepted. A sample
      // equal to its draft counts as accepted even when it ends the request.
      int64_t j = 0, matched = 0;
      for (;; ++j) {
        scheduler.advance(&s, 1);
        SampleResult r = take(draws[first_draw[i] + static_cast<size_t>(j)]);
        const bool match =
            !r.nonfinite_logit && j + 1 < c.num_logits && r.token == c.tokens[static_cast<size_t>(j + 1)];
        running = emit(s, std::move(r), scheduler);
        matched += match;
        if (!running || !match) break;
      }
      if (observer_) observer_->on_speculation(c.num_logits - 1, matched);
      if (follow) follow->drafts_accepted[i] = matched;
      in_state = j + 1;
    } else if (num_draws[i] > 0) {
      running = emit(s, take(draws[first_draw[i]]), scheduler);
    }
    if (!follow) continue;
    follow->accepted[i] = in_state;
    if (!running || s.spec_tokens <= 0) continue;
    // The MTP rows of this chunk's tokens now in the state (row p with the token at p + 1), and
    // drafts once the sequence has its next token.
    DraftRequest d;
    d.seq = &s;
    d.chunk = i;
    d.start_pos = c.start_pos;
    const auto from = static_cast<size_t>(c.start_pos + 1);
    d.next_tokens.assign(s.tokens.begin() + static_cast<std::ptrdiff_t>(from),
                         s.tokens.begin() + static_cast<std::ptrdiff_t>(from + static_cast<size_t>(in_state)));
    d.num_drafts = num_draws[i] > 0 ? draft_count(s, scheduler) : 0;
    d.block_table = s.blocks;
    if (MultimodalPrompt* mm = s.req->mm.get()) {
      if (c.start_pos < mm->length) d.mm = mm;
      d.rope_delta = mm->rope_delta;
    }
    follow->drafts.push_back(std::move(d));
  }
}

int64_t PostProcessor::draft_count(Sequence& s, Scheduler& scheduler) const {
  // A verify chunk sits at positions tokens.size() - 1 .. tokens.size() - 1 + k; drafts past the
  // last token the request may produce are never used.
  const auto len = static_cast<int64_t>(s.tokens.size());
  int64_t k = std::min(s.spec_tokens, max_model_len_ - len);
  k = std::min(k, s.req->params.max_tokens - s.num_generated() - 1);
  return k > 0 ? scheduler.reserve_drafts(s, k) : 0;
}

void PostProcessor::mark_argmax_rows(StepPlan& plan) const {
  // The model caps the limit at its own vocabulary, as sample() caps the row.
  const int64_t vocab = vocab_size_ > 0 ? vocab_size_ : std::numeric_limits<int64_t>::max();
  for (ScheduledChunk& c : plan.chunks) {
    const EngineRequest& r = *c.seq->req;
    // Rows that report prompt logprobs need their values; row j of a verify chunk is drawn after j
    // more tokens.
    // A verify chunk's rows share one request: argmaxes that mask the same columns (its sampled
    // rows, each with its own uniform number, come back whole).
    bool decides = c.num_logits > 0 && r.prompt_logprobs < 0;
    std::optional<DeviceChoice> choice;
    for (int64_t j = 0; decides && j < (c.speculative ? c.num_logits : 1); ++j) {
      std::optional<DeviceChoice> row = device_choice(r.params, r.constraint != nullptr, c.seq->num_generated() + j);
      decides = row.has_value() && (!c.speculative || (row->draw.temperature == 0.0f &&
                                                       (j == 0 || row->excluded == choice->excluded)));
      choice = std::move(row);
    }
    if (decides) {
      c.argmax_vocab = vocab;
      c.argmax_excluded = std::move(choice->excluded);
      c.draw = choice->draw;
    }
  }
}

int64_t PostProcessor::vocab_of(int64_t logits_vocab) const {
  return std::min<int64_t>(vocab_size_ > 0 ? vocab_size_ : logits_vocab, logits_vocab);
}

void PostProcessor::report_prompt_logprobs(const ScheduledChunk& c, const Logits& logits, int64_t first_row) {
  Sequence& s = *c.seq;
  const int64_t vocab = vocab_of(logits.vocab);
  // Row r holds the distribution of the token after position first_pos + r.
  const int64_t first_pos = c.start_pos + static_cast<int64_t>(c.tokens.size()) - c.num_logits;
  EngineEvent ev;
  for (int64_t r = 0; r < c.num_logits; ++r) {
    const int64_t pos = first_pos + r + 1;
    if (pos >= s.prompt_len) break;
    if (pos < s.prompt_logprobs_sent) continue;  // already sent before a preemption
    PromptLogprob p;
    p.position = static_cast<int32_t>(pos);
    p.lp = token_logprobs(std::span<const float>(logits.row(first_row + r), static_cast<size_t>(vocab)),
                          s.tokens[static_cast<size_t>(pos)], s.req->prompt_logprobs);
    ev.prompt.push_back(std::move(p));
    s.prompt_logprobs_sent = pos + 1;
  }
  if (!ev.prompt.empty()) s.req->out.push(std::move(ev));
}

bool PostProcessor::emit(Sequence& s, SampleResult sample, Scheduler& scheduler) {
  const EngineRequest& r = *s.req;
  EngineEvent ev;
  ev.sample = std::move(sample);
  if (ev.sample.nonfinite_logit) {  // broken model output: the request fails, never serves garbage
    EngineEvent err;
    err.finish_reason = "error";
    err.error = "the model produced a non-finite logit (NaN or Inf, token " + std::to_string(*ev.sample.nonfinite_logit) +
                "); the weights or the computation are broken";
    if (observer_) observer_->on_nonfinite_logits();
    end(*s.req, std::move(err), s.num_generated(), s.timeline);
    scheduler.finish(&s);
    return false;
  }
  ev.token = ev.sample.token;
  if (!s.first_token_sent) ev.num_cached_tokens = s.num_cached_tokens;
  if (r.constraint) r.constraint->accept(ev.token);
  s.tokens.push_back(ev.token);
  const int64_t n_out = s.num_generated();
  std::optional<TokenStop> stop =
      check_token_stop(r.params, ev.token, n_out, static_cast<int64_t>(s.tokens.size()), max_model_len_);
  const auto now = Clock::now();
  if (observer_)
    observer_->on_token(!s.first_token_sent,
                        seconds_between(s.first_token_sent ? s.last_token_time : r.arrival, now));
  if (!s.timeline.first_token) s.timeline.first_token = now;
  s.first_token_sent = true;
  s.last_token_time = now;
  s.req->out.push(std::move(ev));
  if (stop) {
    EngineEvent e;
    e.finish_reason = stop->finish_reason;
    e.stop_token = stop->stop_token;
    end(*s.req, std::move(e), s.num_generated(), s.timeline);
    scheduler.finish(&s);
    return false;
  }
  return true;
}

}  // namespace sparkserve
