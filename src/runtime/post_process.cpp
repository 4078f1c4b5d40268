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

void PostProcessor::end(EngineRequest& req, EngineEvent event) {
  event.finished = true;
  if (observer_) observer_->on_finished(event.finish_reason, seconds_between(req.arrival, Clock::now()));
  req.mm.reset();  // the image embeddings are backend memory: freed here, on the engine thread
  req.out.push(std::move(event));
}

void PostProcessor::run(const StepPlan& plan, const Expected<StepOutput>& out, Scheduler& scheduler) {
  for (const EndedRequest& e : plan.ended) {
    EngineEvent ev;
    ev.finish_reason = e.finish_reason;
    ev.error = e.error;
    end(*e.req, std::move(ev));
  }
  if (!out.ok()) {
    for (const ScheduledChunk& c : plan.chunks) {
      EngineEvent err;
      err.finish_reason = "error";
      err.error = out.message();
      end(*c.seq->req, std::move(err));
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
    row += c.num_logits;
    const bool values = logits.has_values(row - 1);
    draws.push_back(Draw{c.seq, values ? logits.row(row - 1) : nullptr,
                         values ? nullptr : &logits.argmax[static_cast<size_t>(row - 1)], {}});
  }
  const int64_t vocab = std::min<int64_t>(vocab_size_ > 0 ? vocab_size_ : logits.vocab, logits.vocab);
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
    if (c.num_logits > 0 && argmax_decides(r.params, r.constraint != nullptr, c.seq->num_generated()))
      c.argmax_vocab = vocab;
  }
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
    end(*s.req, std::move(err));
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
  s.first_token_sent = true;
  s.last_token_time = now;
  s.req->out.push(std::move(ev));
  if (stop) {
    EngineEvent e;
    e.finish_reason = stop->finish_reason;
    e.stop_token = stop->stop_token;
    end(*s.req, std::move(e));
    scheduler.finish(&s);
  }
}

}  // namespace sparkserve
