// Single-thread cost of sample_token on a Qwen3.5-sized row (248,320 logits, N(0, 3)) with a
// 2000-token prompt and 200 generated tokens. Not built by CMake; build and run with:
//   g++ -std=c++20 -O3 -DNDEBUG -Isrc bench/sampler_bench.cpp src/runtime/sampler.cpp
//       src/runtime/sampling_params.cpp -o /tmp/sampler_bench && /tmp/sampler_bench
#include <chrono>
#include <cstdio>
#include <random>
#include "runtime/sampler.h"
using namespace sparkserve;
int main() {
  const size_t V = 248320;
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0, 3);
  std::vector<float> logits(V);
  for (auto& x : logits) x = d(rng);
  std::vector<int32_t> prompt(2000), out(200);
  for (auto& x : prompt) x = rng() % V;
  for (auto& x : out) x = rng() % V;
  auto run = [&](const char* name, SamplingParams p) {
    int n = 50;
    auto t0 = std::chrono::steady_clock::now();
    int64_t acc = 0;
    for (int i = 0; i < n; ++i) { p.seed = i; acc += sample_token(logits, p, prompt, out).token; }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
    std::printf("%-40s %.3f ms/token (%lld)\n", name, ms, (long long)acc);
  };
  SamplingParams g; g.temperature = 0; run("greedy", g);
  SamplingParams q; q.temperature = 0.6f; q.top_k = 20; q.top_p = 0.95f; run("qwen default T.6 k20 p.95", q);
  SamplingParams pp = q; pp.presence_penalty = 1.5f; run("qwen + presence 1.5", pp);
  SamplingParams r = q; r.repetition_penalty = 1.1f; run("qwen + repetition 1.1", r);
  SamplingParams tp; tp.temperature = 1.0f; tp.top_p = 0.95f; run("T1 top_p .95 (no top_k)", tp);
  SamplingParams pl; pl.temperature = 1.0f; run("T1 plain", pl);
  SamplingParams lp = q; lp.num_logprobs = 5; run("qwen + logprobs 5", lp);
}
