#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/check.h"

namespace sparkserve {

std::string prometheus_escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  CHECK(ec == std::errc());
  return std::string(buf, end);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), per_bucket_(bounds_.size() + 1, 0) {
  CHECK_MSG(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram bounds must ascend");
}

void Histogram::observe(double value) {
  if (std::isnan(value)) return;  // a broken clock reading must not poison _sum
  // Prometheus buckets are `le` (<=): the first bound >= value.
  size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  per_bucket_[i]++;
  count_++;
  sum_ += value;
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(bounds_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) out[i] = acc += per_bucket_[i];
  return out;
}

const std::vector<double>& ttft_buckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& inter_token_latency_buckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05,
                                        0.075, 0.1,    0.15,  0.2,    0.3,  0.4,   0.5,
                                        0.75,  1.0,    2.5,   5.0,    7.5,  10.0,  20.0,
                                        40.0,  80.0};
  return b;
}

const std::vector<double>& e2e_latency_buckets() {
  static const std::vector<double> b = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                        5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return b;
}

std::vector<double> one_two_five_buckets(int64_t max) {
  std::vector<double> b;
  for (double base = 1; b.empty() || b.back() < static_cast<double>(max); base *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      if (base * m > static_cast<double>(max)) return b;
      b.push_back(base * m);
    }
  return b;
}

ServerMetrics::ServerMetrics(std::string model_name, int64_t max_model_len)
    : label_("model_name=\"" + prometheus_escape_label(model_name) + "\""),
      ttft_(ttft_buckets()),
      itl_(inter_token_latency_buckets()),
      e2e_(e2e_latency_buckets()),
      queue_(e2e_latency_buckets()),
      prefill_(e2e_latency_buckets()),
      decode_(e2e_latency_buckets()),
      prompt_len_(one_two_five_buckets(max_model_len)),
      generation_len_(one_two_five_buckets(max_model_len)) {
  // vLLM pre-creates one series per finish reason so rates start from zero.
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
}

void ServerMetrics::set_requests_running(int64_t n) { std::lock_guard l(mu_); running_ = n; }
void ServerMetrics::set_requests_waiting(int64_t n) { std::lock_guard l(mu_); waiting_ = n; }
void ServerMetrics::set_kv_cache_usage(double f) { std::lock_guard l(mu_); kv_usage_ = f; }
void ServerMetrics::set_state_slots_usage(double f) { std::lock_guard l(mu_); slots_usage_ = f; }
void ServerMetrics::add_prompt_tokens(uint64_t n) { std::lock_guard l(mu_); prompt_tokens_ += n; }
void ServerMetrics::add_generation_tokens(uint64_t n) { std::lock_guard l(mu_); generation_tokens_ += n; }
void ServerMetrics::count_preemption() { std::lock_guard l(mu_); preemptions_++; }
void ServerMetrics::count_nonfinite_logits() { std::lock_guard l(mu_); nonfinite_logits_++; }

void ServerMetrics::on_speculation(int64_t proposed, int64_t accepted) {
  std::lock_guard l(mu_);
  spec_drafts_++;
  spec_draft_tokens_ += static_cast<uint64_t>(proposed);
  spec_accepted_tokens_ += static_cast<uint64_t>(accepted);
}

void ServerMetrics::on_prompt(int64_t prompt_tokens, int64_t cached_tokens) {
  std::lock_guard l(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  prefix_cache_queries_ += static_cast<uint64_t>(prompt_tokens);
  prefix_cache_hits_ += static_cast<uint64_t>(cached_tokens);
}

void ServerMetrics::on_token(bool first, double seconds) {
  add_generation_tokens(1);
  if (first) observe_time_to_first_token(seconds);
  else observe_inter_token_latency(seconds);
}

void ServerMetrics::on_finished(const FinishedRequest& f) {
  count_finished_request(f.finish_reason);
  observe_e2e_latency(f.e2e_s);
  observe_request(f.queue_s, f.prefill_s, f.decode_s, f.prompt_tokens, f.generation_tokens);
}

void ServerMetrics::on_gauges(const EngineGauges& g) {
  std::lock_guard l(mu_);
  running_ = g.running;
  waiting_ = g.waiting;
  kv_usage_ = g.kv_cache_usage;
  slots_usage_ = g.state_slots_usage;
}

void ServerMetrics::on_step(const StepTiming& t) {
  std::lock_guard l(mu_);
  steps_++;
  step_tokens_ += static_cast<uint64_t>(t.tokens);
  step_seqs_ += static_cast<uint64_t>(t.seqs);
  step_schedule_s_ += t.schedule_s;
  step_execute_s_ += t.execute_s;
  step_postprocess_s_ += t.postprocess_s;
}

void ServerMetrics::count_finished_request(std::string_view reason) {
  std::lock_guard l(mu_);
  auto it = finished_.find(reason);
  if (it == finished_.end()) it = finished_.emplace(std::string(reason), 0).first;
  it->second++;
}

void ServerMetrics::observe_time_to_first_token(double s) { std::lock_guard l(mu_); ttft_.observe(s); }
void ServerMetrics::observe_inter_token_latency(double s) { std::lock_guard l(mu_); itl_.observe(s); }
void ServerMetrics::observe_e2e_latency(double s) { std::lock_guard l(mu_); e2e_.observe(s); }

void ServerMetrics::observe_request(double queue_s, double prefill_s, double decode_s, int64_t prompt_tokens,
                                    int64_t generation_tokens) {
  std::lock_guard l(mu_);
  queue_.observe(queue_s);
  prefill_.observe(prefill_s);
  decode_.observe(decode_s);
  prompt_len_.observe(static_cast<double>(prompt_tokens));
  generation_len_.observe(static_cast<double>(generation_tokens));
}

MetricsSnapshot ServerMetrics::snapshot() const {
  std::lock_guard l(mu_);
  MetricsSnapshot m;
  m.prompt_tokens = prompt_tokens_;
  m.generation_tokens = generation_tokens_;
  for (const auto& [reason, n] : finished_) m.finished += n;
  m.running = running_;
  m.waiting = waiting_;
  m.kv_usage = kv_usage_;
  return m;
}

namespace {

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n";
  out += "# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + prometheus_number(v) + "\n";
}

void histogram(std::string& out, const std::string& name, const char* help,
               const std::string& label, const Histogram& h) {
  header(out, name, "histogram", help);
  std::vector<uint64_t> cum = h.cumulative_counts();
  for (size_t i = 0; i < cum.size(); ++i)
    sample(out, name + "_bucket", label + ",le=\"" + prometheus_number(h.bounds()[i]) + "\"",
           static_cast<double>(cum[i]));
  sample(out, name + "_bucket", label + ",le=\"+Inf\"", static_cast<double>(h.count()));
  sample(out, name + "_sum", label, h.sum());
  sample(out, name + "_count", label, static_cast<double>(h.count()));
}

}  // namespace

std::string ServerMetrics::render() const {
  std::lock_guard l(mu_);
  std::string out;
  for (const std::string p : {"sparkserve:", "vllm:"}) {
    header(out, p + "num_requests_running", "gauge", "Number of requests in model execution batches.");
    sample(out, p + "num_requests_running", label_, static_cast<double>(running_));
    header(out, p + "num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
    sample(out, p + "num_requests_waiting", label_, static_cast<double>(waiting_));
    header(out, p + "kv_cache_usage_perc", "gauge", "KV-cache block usage. 1 means 100 percent usage.");
    sample(out, p + "kv_cache_usage_perc", label_, kv_usage_);
    if (p == "sparkserve:") {
      header(out, p + "gdn_state_slots_usage_perc", "gauge",
             "Gated DeltaNet state slot usage. 1 means 100 percent usage.");
      sample(out, p + "gdn_state_slots_usage_perc", label_, slots_usage_);
    }

    header(out, p + "prompt_tokens_total", "counter", "Number of prefill tokens processed.");
    sample(out, p + "prompt_tokens_total", label_, static_cast<double>(prompt_tokens_));
    header(out, p + "generation_tokens_total", "counter", "Number of generation tokens processed.");
    sample(out, p + "generation_tokens_total", label_, static_cast<double>(generation_tokens_));
    header(out, p + "request_success_total", "counter", "Count of finished requests by finish reason.");
    for (const auto& [reason, n] : finished_)
      sample(out, p + "request_success_total",
             label_ + ",finished_reason=\"" + prometheus_escape_label(reason) + "\"", static_cast<double>(n));
    header(out, p + "prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.");
    sample(out, p + "prefix_cache_queries_total", label_, static_cast<double>(prefix_cache_queries_));
    header(out, p + "prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
    sample(out, p + "prefix_cache_hits_total", label_, static_cast<double>(prefix_cache_hits_));
    header(out, p + "num_preemptions_total", "counter", "Cumulative number of preemptions.");
    sample(out, p + "num_preemptions_total", label_, static_cast<double>(preemptions_));
    // Speculative decoding, as vLLM's spec_decode series: mean acceptance length per verify step =
    // 1 + num_accepted_tokens / num_drafts.
    header(out, p + "spec_decode_num_drafts_total", "counter", "Verify steps of speculative decoding (one per sequence).");
    sample(out, p + "spec_decode_num_drafts_total", label_, static_cast<double>(spec_drafts_));
    header(out, p + "spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.");
    sample(out, p + "spec_decode_num_draft_tokens_total", label_, static_cast<double>(spec_draft_tokens_));
    header(out, p + "spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.");
    sample(out, p + "spec_decode_num_accepted_tokens_total", label_, static_cast<double>(spec_accepted_tokens_));
    if (p == "sparkserve:") {
      header(out, p + "nonfinite_logits_total", "counter", "Requests failed because the model produced NaN/Inf logits.");
      sample(out, p + "nonfinite_logits_total", label_, static_cast<double>(nonfinite_logits_));
    }

    if (p == "sparkserve:") {
      header(out, p + "engine_steps_total", "counter", "Engine steps run.");
      sample(out, p + "engine_steps_total", label_, static_cast<double>(steps_));
      header(out, p + "engine_step_tokens_total", "counter", "Tokens run through the model, summed over steps.");
      sample(out, p + "engine_step_tokens_total", label_, static_cast<double>(step_tokens_));
      header(out, p + "engine_step_sequences_total", "counter", "Sequences in the batch, summed over steps.");
      sample(out, p + "engine_step_sequences_total", label_, static_cast<double>(step_seqs_));
      header(out, p + "engine_step_seconds_total", "counter",
             "Engine thread time by step phase: schedule (planning), execute (forward incl. logits download), "
             "postprocess (sampling, stop checks, events).");
      sample(out, p + "engine_step_seconds_total", label_ + ",phase=\"schedule\"", step_schedule_s_);
      sample(out, p + "engine_step_seconds_total", label_ + ",phase=\"execute\"", step_execute_s_);
      sample(out, p + "engine_step_seconds_total", label_ + ",phase=\"postprocess\"", step_postprocess_s_);
    }

    histogram(out, p + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", label_, ttft_);
    histogram(out, p + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", label_, itl_);
    histogram(out, p + "e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.", label_, e2e_);
    histogram(out, p + "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", label_, queue_);
    histogram(out, p + "request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", label_,
              prefill_);
    histogram(out, p + "request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", label_,
              decode_);
    histogram(out, p + "request_prompt_tokens", "Number of prefill tokens processed.", label_, prompt_len_);
    histogram(out, p + "request_generation_tokens", "Number of generation tokens processed.", label_, generation_len_);
  }
  return out;
}

}  // namespace sparkserve
