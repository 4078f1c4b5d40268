// What the engine reports as it runs (the server's Prometheus metrics implement it; tests may
// count). Calls come from the engine thread; an implementation shared with other threads locks.
#pragma once

#include <cstdint>
#include <string_view>

namespace sparkserve {

// A request that ended (any finish reason), with vLLM's phases: queued from arrival to the first
// admission, prefill from there to the first token, decode from the first token to the end (a
// phase never reached lasts 0, and the ones before it run to the end).
struct FinishedRequest {
  std::string_view finish_reason;
  double e2e_s = 0, queue_s = 0, prefill_s = 0, decode_s = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
};

struct EngineGauges {
  int64_t running = 0, waiting = 0;
  double kv_cache_usage = 0;     // [0, 1]: KV blocks held by sequences or the prefix cache
  double state_slots_usage = 0;  // [0, 1]: GDN state slots held by running sequences
};

// Where one engine step's wall time went (seconds, engine thread): planning, the model runner
// (forward, including the logits download), post-processing (sampling, stop checks, events).
struct StepTiming {
  double schedule_s = 0, execute_s = 0, postprocess_s = 0;
  int64_t tokens = 0, seqs = 0;
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A request was admitted for the first time: its prompt length and how many of those tokens
  // came from the prefix cache (0 when it is off).
  virtual void on_prompt(int64_t prompt_tokens, int64_t cached_tokens) = 0;
  // A token was generated: `first` with the time since arrival, else the time since the last one.
  virtual void on_token(bool first, double seconds) = 0;
  virtual void on_finished(const FinishedRequest& request) = 0;
  virtual void on_preemption() = 0;
  // A request failed because the model produced NaN/Inf logits.
  virtual void on_nonfinite_logits() {}
  // A verify chunk was checked: `proposed` drafts, the first `accepted` of them taken.
  virtual void on_speculation(int64_t proposed, int64_t accepted) { (void)proposed, (void)accepted; }
  // After every step.
  virtual void on_gauges(const EngineGauges& gauges) = 0;
  virtual void on_step(const StepTiming&) {}
};

}  // namespace sparkserve
