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

void PostProcessor::run(const StepPlan& plan, const Expected<StepOutput>& out, Scheduler& scheduler) {
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
  // pool; then each sequence takes its token in plan order, exactly as if drawn one by one.
  const Logits& logits = out->logits;
  struct Draw {
    Sequence* seq;
    const float* row;         // null when only the argmax came back
    const RowArgmax* argmax;  // else null
    SampleResult result;
  };
  std::vector<Draw> draws;
  int64_t row = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.num_logits == 0) continue;  // a prefill chunk short of the end: nothing to sample
    const int64_t first_row = row;
    row += c.num_logits;
    Sequence& s = *c.seq;
    if (s.req->prompt_logprobs >= 0) report_prompt_logprobs(c, logits, first_row);
    if (s.remaining() != 0) continue;  // committed: a prompt chunk short of the end (rows for logprobs only)
    if (s.req->prompt_only && s.num_generated() == 0) {  // echo with max_tokens 0: the prompt was all
      EngineEvent e;
      e.finish_reason = "length";
      end(*s.req, std::move(e), 0, s.timeline);
      scheduler.finish(&s);
      continue;
    }
    const bool values = logits.has_values(row - 1);
    draws.push_back(Draw{c.seq, values ? logits.row(row - 1) : nullptr,
                         values ? nullptr : &logits.argmax[static_cast<size_t>(row - 1)], {}});
  }
  const int64_t vocab = vocab_of(logits.vocab);
  auto free_draw = [&](Draw& d) {
    if (d.argmax) {  // what sample_token decides for this row (mark_argmax_rows): its argmax
      if (d.argmax->nonfinite >= 0) d.result.nonfinite_logit = d.argmax->nonfinite;
      else d.result.token = d.argmax->id;
    } else {
      d.result = sample_token(std::span<const float>(d.row, static_cast<size_t>(vocab)), d.seq->req->params,
                              d.seq->prompt(), d.seq->output());
    }
  };
  pool_.parallel_for(static_cast<int64_t>(draws.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (!draws[static_cast<size_t>(i)].seq->req->constraint) free_draw(draws[static_cast<size_t>(i)]);
  });
  for (Draw& d : draws) {
    if (const auto& constraint = d.seq->req->constraint) {
      mask_.resize(static_cast<size_t>(vocab));
      constraint->allowed_tokens(mask_);
      d.result = sample_token(std::span<const float>(d.row, static_cast<size_t>(vocab)), d.seq->req->params,
                              d.seq->prompt(), d.seq->output(), mask_);
    }
    emit(*d.seq, std::move(d.result), scheduler);
  }
}

void PostProcessor::mark_argmax_rows(StepPlan& plan) const {
  // The model caps the limit at its own vocabulary, as sample() caps the row.
  const int64_t vocab = vocab_size_ > 0 ? vocab_size_ : std::numeric_limits<int64_t>::max();
  for (ScheduledChunk& c : plan.chunks) {
    const EngineRequest& r = *c.seq->req;
    // Rows that report prompt logprobs need their values.
    if (c.num_logits > 0 && r.prompt_logprobs < 0 &&
        argmax_decides(r.params, r.constraint != nullptr, c.seq->num_generated()))
      c.argmax_vocab = vocab;
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

void PostProcessor::emit(Sequence& s, SampleResult sample, Scheduler& scheduler) {
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
    return;
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
  }
}

}  // namespace sparkserve
