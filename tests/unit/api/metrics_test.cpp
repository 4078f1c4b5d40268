// Prometheus exposition: exact lines for known updates, histogram invariants, a format check of
// every line, and concurrent updates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "server/metrics.h"

namespace sparkserve {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);)
    if (l == line) return true;
  return false;
}

TEST(Histogram, CumulativeLeBuckets) {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 1.0, 5.0, 50.0}) h.observe(v);
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{2, 4, 5}));  // 0.1 and 1.0 fall in "le"
  EXPECT_EQ(h.count(), 6u);
  EXPECT_DOUBLE_EQ(h.sum(), 56.65);
  h.observe(std::nan(""));
  EXPECT_EQ(h.count(), 6u);
}

TEST(Metrics, ExactSamples) {
  ServerMetrics m("Qwen/Qwen3.5");
  m.set_requests_running(3);
  m.set_requests_waiting(2);
  m.set_kv_cache_usage(0.25);
  m.set_state_slots_usage(0.5);
  m.on_prompt(100, 64);  // the engine's report: prompt tokens, of which cached
  m.add_prompt_tokens(23);
  m.add_generation_tokens(7);
  m.count_finished_request("stop");
  m.count_finished_request("stop");
  m.count_finished_request("length");
  m.count_finished_request("repetition");
  m.count_preemption();
  m.observe_time_to_first_token(0.03);
  m.observe_inter_token_latency(0.004);
  m.observe_inter_token_latency(0.02);
  m.observe_e2e_latency(1.2);
  std::string t = m.render();
  const std::string L = R"(model_name="Qwen/Qwen3.5")";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE sparkserve:num_requests_running gauge",
           "sparkserve:num_requests_running{" + L + "} 3",
           "sparkserve:num_requests_waiting{" + L + "} 2",
           "sparkserve:kv_cache_usage_perc{" + L + "} 0.25",
           "sparkserve:gdn_state_slots_usage_perc{" + L + "} 0.5",
           "# TYPE sparkserve:prompt_tokens_total counter",
           "sparkserve:prompt_tokens_total{" + L + "} 123",
           "sparkserve:generation_tokens_total{" + L + "} 7",
           "sparkserve:request_success_total{" + L + ",finished_reason=\"stop\"} 2",
           "sparkserve:request_success_total{" + L + ",finished_reason=\"length\"} 1",
           "sparkserve:request_success_total{" + L + ",finished_reason=\"abort\"} 0",
           "sparkserve:request_success_total{" + L + ",finished_reason=\"repetition\"} 1",
           "sparkserve:num_preemptions_total{" + L + "} 1",
           "# TYPE sparkserve:prefix_cache_queries_total counter",
           "sparkserve:prefix_cache_queries_total{" + L + "} 100",
           "sparkserve:prefix_cache_hits_total{" + L + "} 64",
           "# TYPE sparkserve:time_to_first_token_seconds histogram",
           "sparkserve:time_to_first_token_seconds_bucket{" + L + ",le=\"0.02\"} 0",
           "sparkserve:time_to_first_token_seconds_bucket{" + L + ",le=\"0.04\"} 1",
           "sparkserve:time_to_first_token_seconds_bucket{" + L + ",le=\"+Inf\"} 1",
           "sparkserve:time_to_first_token_seconds_count{" + L + "} 1",
           "sparkserve:time_to_first_token_seconds_sum{" + L + "} 0.03",
           "sparkserve:inter_token_latency_seconds_bucket{" + L + ",le=\"0.0025\"} 0",
           "sparkserve:inter_token_latency_seconds_bucket{" + L + ",le=\"0.005\"} 1",
           "sparkserve:inter_token_latency_seconds_bucket{" + L + ",le=\"0.025\"} 2",
           "sparkserve:inter_token_latency_seconds_count{" + L + "} 2",
           "sparkserve:e2e_request_latency_seconds_bucket{" + L + ",le=\"1\"} 0",
           "sparkserve:e2e_request_latency_seconds_bucket{" + L + ",le=\"1.5\"} 1",
       }) {
    EXPECT_TRUE(has_line(t, line)) << "missing: " << line << "\n" << t;
  }
}

// Every line is a comment (# HELP / # TYPE name ...) or `name{labels} value` with a valid
// metric name, label syntax and number; each family's TYPE precedes its samples; bucket counts
// never decrease within a histogram.
TEST(Metrics, StepPhasesAreSummed) {
  ServerMetrics m("m");
  m.on_step(StepTiming{0.25, 1.5, 0.125, 64, 64});
  m.on_step(StepTiming{0.25, 0.5, 0.375, 512, 3});
  const std::string t = m.render();
  const std::string L = R"(model_name="m")";
  EXPECT_TRUE(has_line(t, "sparkserve:engine_steps_total{" + L + "} 2"));
  EXPECT_TRUE(has_line(t, "sparkserve:engine_step_tokens_total{" + L + "} 576"));
  EXPECT_TRUE(has_line(t, "sparkserve:engine_step_sequences_total{" + L + "} 67"));
  EXPECT_TRUE(has_line(t, "sparkserve:engine_step_seconds_total{" + L + ",phase=\"schedule\"} 0.5"));
  EXPECT_TRUE(has_line(t, "sparkserve:engine_step_seconds_total{" + L + ",phase=\"execute\"} 2"));
  EXPECT_TRUE(has_line(t, "sparkserve:engine_step_seconds_total{" + L + ",phase=\"postprocess\"} 0.5"));
}

TEST(Metrics, EveryLineIsValidExposition) {
  ServerMetrics m("we\"ird\\name\n");
  for (int i = 0; i < 50; ++i) m.observe_inter_token_latency(0.001 * i);
  std::string t = m.render();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back(), '\n');
  std::regex comment(R"(# (HELP|TYPE) ((sparkserve|vllm):[a-z0-9_]+) .+)");
  std::regex sample_re(
      R"(((?:sparkserve|vllm):[a-z0-9_]+)\{([a-z_]+="([^"\\\n]|\\\\|\\"|\\n)*")(,[a-z_]+="([^"\\\n]|\\\\|\\"|\\n)*")*\} ([0-9.e+-]+|\+Inf|NaN))");
  std::istringstream is(t);
  std::set<std::string> typed;
  std::string last_bucket_series;
  double last_bucket = -1;
  for (std::string l; std::getline(is, l);) {
    std::smatch mt;
    if (std::regex_match(l, mt, comment)) {
      if (mt[1] == "TYPE") typed.insert(mt[2]);
      continue;
    }
    ASSERT_TRUE(std::regex_match(l, mt, sample_re)) << "bad line: " << l;
    std::string name = mt[1];
    std::string family = name;
    for (const char* sfx : {"_bucket", "_sum", "_count"})
      if (family.size() > strlen(sfx) && family.ends_with(sfx) && !typed.count(family))
        family = family.substr(0, family.size() - strlen(sfx));
    EXPECT_TRUE(typed.count(family)) << "sample before its TYPE: " << l;
    if (name.ends_with("_bucket")) {
      double v = std::stod(l.substr(l.rfind(' ') + 1));
      if (name == last_bucket_series) EXPECT_GE(v, last_bucket) << l;
      last_bucket_series = name;
      last_bucket = v;
    }
  }
  EXPECT_NE(t.find(R"(model_name="we\"ird\\name\n")"), std::string::npos);
}

TEST(Metrics, ConcurrentUpdatesAreAllCounted) {
  ServerMetrics m("q");
  std::vector<std::thread> threads;
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        m.add_generation_tokens(1);
        m.observe_inter_token_latency(0.01);
        if (i % 100 == 0) (void)m.render();
      }
    });
  for (auto& t : threads) t.join();
  std::string r = m.render();
  EXPECT_TRUE(has_line(r, "sparkserve:generation_tokens_total{model_name=\"q\"} 80000"));
  EXPECT_TRUE(has_line(r, "sparkserve:inter_token_latency_seconds_count{model_name=\"q\"} 80000"));
}

TEST(PrometheusNumber, Formats) {
  EXPECT_EQ(prometheus_number(0.25), "0.25");
  EXPECT_EQ(prometheus_number(123), "123");
  EXPECT_EQ(prometheus_number(1e-3), "0.001");
  EXPECT_EQ(prometheus_number(INFINITY), "+Inf");
  EXPECT_EQ(prometheus_number(-INFINITY), "-Inf");
  EXPECT_EQ(prometheus_number(NAN), "NaN");
}

}  // namespace
}  // namespace sparkserve
