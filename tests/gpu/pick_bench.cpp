// gpu_ops --bench-kernels --bench-filter pick: the per-step token pick over the logits, Backend::argmax
// (greedy rows) and Backend::draw (sampled rows: the parameter sets clients send most), at the Qwen3.5
// vocabulary (248,320) for 1, 16 and 64 rows of N(0, 3) logits. Both ops return ids to the host (a stream sync), so they are timed by
// the host clock around each call, median of 30 calls after 3 warm-ups; the logits (<= 64 MB) stay in
// L2 / HBM the same way they do after the lm_head in a real step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

double median_us(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < 30; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::nth_element(t.begin(), t.begin() + 15, t.end());
  return t[15];
}

void bench_pick(Backend& g) {
  const int64_t V = 248320;
  struct Set {
    const char* name;
    RowDraw d;
  };
  const Set sets[] = {
      {"draw t0.7 p0.95", {0.7f, 0, 0.95f, 0.0f, 0.5}},       {"draw t0.6 k20 p0.95", {0.6f, 20, 0.95f, 0.0f, 0.5}},
      {"draw t0.7 p0.8", {0.7f, 0, 0.8f, 0.0f, 0.5}},         {"draw t1", {1.0f, 0, 1.0f, 0.0f, 0.5}},
      {"draw t1 min_p0.05", {1.0f, 0, 1.0f, 0.05f, 0.5}},
  };
  std::printf("%-20s %6s %12s %12s\n", "op", "rows", "us/call", "GB/s");
  for (int64_t R : {1, 16, 64}) {
    std::vector<float> host(static_cast<size_t>(R * V));
    std::normal_distribution<float> n(0.0f, 3.0f);
    for (auto& x : host) x = n(g_bench_rng);
    Buffer logits(&g, DType::kF32, {R, V});
    g.upload(logits, host.data());
    const double gb = static_cast<double>(R * V * 4) / 1e9;
    const double a = median_us([&] { g.argmax(logits, V, {}); });
    std::printf("%-20s %6lld %12.1f %12.1f\n", "argmax", static_cast<long long>(R), a, gb / (a * 1e-6));
    for (const Set& s : sets) {
      std::vector<RowDraw> rows(static_cast<size_t>(R), s.d);
      const double d = median_us([&] { g.draw(logits, V, {}, rows); });
      std::printf("%-20s %6lld %12.1f %12.1f\n", s.name, static_cast<long long>(R), d, gb / (d * 1e-6));
    }
  }
}

RegisterKernelBench reg_pick("pick", bench_pick);

}  // namespace
}  // namespace sparkserve
