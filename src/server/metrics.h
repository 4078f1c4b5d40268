// Server metrics in the Prometheus text exposition format (version 0.0.4), named as vLLM v1's
// with a model_name label on every sample (serving-api.md 5.6): each under the `sparkserve:`
// prefix, and again under `vllm:` so that dashboards made for vLLM work unchanged (the
// sparkserve-only GDN slot gauge, NaN/Inf failure counter and engine step counters have no
// vllm: twins).
// All methods are thread-safe (one mutex; updates are a few per token, far from contended).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine_observer.h"

namespace sparkserve {

// Cumulative histogram with fixed upper bounds (+Inf implied).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // counts()[i]: observations <= bounds()[i] (cumulative); count(): all of them.
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> per_bucket_;  // non-cumulative, one per bound plus +Inf
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

// Bucket bounds (seconds). TTFT and end-to-end are vLLM's; inter-token latency adds
// 1-7.5 ms bounds below vLLM's 10 ms first bucket, since decode steps on one GPU are that fast.
const std::vector<double>& ttft_buckets();
const std::vector<double>& inter_token_latency_buckets();
const std::vector<double>& e2e_latency_buckets();
// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max (inclusive).
std::vector<double> one_two_five_buckets(int64_t max);

// Counters and gauges at one moment (the periodic stats line).
struct MetricsSnapshot {
  uint64_t prompt_tokens = 0, generation_tokens = 0, finished = 0;
  int64_t running = 0, waiting = 0;
  double kv_usage = 0.0;
};

class ServerMetrics final : public EngineObserver {
 public:
  // max_model_len: the top of the prompt / generation length histograms.
  explicit ServerMetrics(std::string model_name, int64_t max_model_len = 1 << 20);

  // The engine's reports (EngineObserver), mapped onto the series below.
  void on_prompt(int64_t prompt_tokens, int64_t cached_tokens) override;
  void on_token(bool first, double seconds) override;
  void on_finished(const FinishedRequest& request) override;
  void on_preemption() override { count_preemption(); }
  void on_nonfinite_logits() override { count_nonfinite_logits(); }
  void on_speculation(int64_t proposed, int64_t accepted) override;
  void on_gauges(const EngineGauges& g) override;
  void on_step(const StepTiming& t) override;

  // Gauges, set by the engine after each step.
  void set_requests_running(int64_t n);
  void set_requests_waiting(int64_t n);
  void set_kv_cache_usage(double fraction);     // [0, 1]
  void set_state_slots_usage(double fraction);  // [0, 1]

  // Counters.
  void add_prompt_tokens(uint64_t n);
  void add_generation_tokens(uint64_t n);
  void count_finished_request(std::string_view finished_reason);  // stop / length / abort / error
  void count_preemption();
  void count_nonfinite_logits();  // a request failed on NaN/Inf logits

  // Histograms (seconds).
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  void observe_e2e_latency(double seconds);
  // One finished request: time queued (arrival to first scheduled), in prefill (to the first
  // token), in decode (first token to the end), and its prompt / generated token counts.
  void observe_request(double queue_s, double prefill_s, double decode_s, int64_t prompt_tokens,
                       int64_t generation_tokens);

  MetricsSnapshot snapshot() const;

  // The whole exposition (Content-Type: text/plain; version=0.0.4; charset=utf-8).
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::string label_;  // model_name="..." (escaped)
  int64_t running_ = 0, waiting_ = 0;
  double kv_usage_ = 0.0, slots_usage_ = 0.0;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, preemptions_ = 0, nonfinite_logits_ = 0;
  uint64_t prefix_cache_queries_ = 0, prefix_cache_hits_ = 0;  // tokens
  uint64_t steps_ = 0, step_tokens_ = 0, step_seqs_ = 0;
  double step_schedule_s_ = 0, step_execute_s_ = 0, step_postprocess_s_ = 0;
  uint64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;  // verify chunks, drafts
  std::map<std::string, uint64_t, std::less<>> finished_;
  Histogram ttft_, itl_, e2e_, queue_, prefill_, decode_, prompt_len_, generation_len_;
};

// Prometheus label-value escaping (\\, \", \n) and number formatting (shortest round-trip,
// +Inf / -Inf / NaN).
std::string prometheus_escape_label(std::string_view value);
std::string prometheus_number(double value);

}  // namespace sparkserve
