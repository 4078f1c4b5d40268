// gpu_ops --bench-kernels --bench-filter gdn_chunked: one GDN layer's delta rule in prefill
// (gdn_chunked) at the Qwen3.5 shapes, timed as bench_kernels.cpp times everything (CUDA graph of
// the op, median of 5 replays). Inputs are random (never zero); qkv is 400 MB at 8K tokens, far past
// the 50 MB L2, so each run reads it from HBM. Bytes = qkv, g, beta read + out written + the span's
// state read and written (and the saves' states written); the floor at ~4 TB/s is ~0.17 ms at 8K
// tokens for the 122B. The agent-turn cases (338 tokens, with and without its 2 state saves) show
// what the saves cost inside the kernel.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

// Uniform in [lo, hi) from a 64-bit LCG: fast enough for 10^8 values.
std::vector<float> uniform(int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

struct Case {
  const char* name;
  int64_t hk, hv, spans, tokens_per_span;
  bool recurrent;  // also time the token-by-token recurrence (gdn_recurrent) on the same batch
  int saves = 0;   // state saves in each span, after its tokens n-1, n-3, .. (a later agent turn: 2)
};

void bench_gdn_chunked(Backend& gpu) {
  std::printf("%-40s %6s %10s %10s %9s\n", "gdn_chunked (dk = dv = 128)", "T", "MB moved", "us", "GB/s");
  for (const Case& c : {Case{"122B 16/64 heads, 1 span", 16, 64, 1, 8192, true},
                        Case{"122B 16/64 heads, 4 spans x 2K", 16, 64, 4, 2048, false},
                        Case{"122B 16/64 heads, 1 span", 16, 64, 1, 32768, false},
                        Case{"35B 16/32 heads, 1 span", 16, 32, 1, 8192, false},
                        Case{"35B 16/32 heads, agent turn", 16, 32, 1, 338, false},
                        Case{"35B 16/32 heads, agent turn, 2 saves", 16, 32, 1, 338, false, 2}}) {
    const GdnDims d{c.hk, c.hv, 128, 128, 4};
    const int64_t T = c.spans * c.tokens_per_span, C = d.conv_dim(), Hv = d.num_v_heads;
    BatchLayout b;
    std::vector<std::vector<GdnStateSave>> saves(static_cast<size_t>(c.spans));
    int32_t rows = static_cast<int32_t>(c.spans);
    for (int64_t s = 0; s < c.spans; ++s) {
      SeqSpan sp;
      sp.row_begin = s * c.tokens_per_span;
      sp.num_tokens = c.tokens_per_span;
      sp.start_pos = 100;
      sp.gdn_slot = static_cast<int32_t>(s);
      auto& v = saves[static_cast<size_t>(s)];
      for (int i = c.saves - 1; i >= 0; --i) v.push_back({c.tokens_per_span - 1 - 2 * i, rows++});
      sp.saves = v.data();
      sp.num_saves = static_cast<int64_t>(v.size());
      b.seqs.push_back(sp);
    }
    b.total_rows = T;
    Buffer qkv(&gpu, DType::kF32, {T, C}), g(&gpu, DType::kF32, {T, Hv}), beta(&gpu, DType::kF32, {T, Hv}),
        st(&gpu, DType::kF32, {rows, Hv, 128, 128}), out(&gpu, DType::kF32, {T, Hv, 128});
    gpu.upload(qkv.tensor(), uniform(T * C, -1.0f, 1.0f, 1).data());
    gpu.upload(g.tensor(), uniform(T * Hv, -0.5f, -0.001f, 2).data());
    gpu.upload(beta.tensor(), uniform(T * Hv, 0.05f, 0.95f, 3).data());
    gpu.upload(st.tensor(), uniform(rows * Hv * 128 * 128, -0.3f, 0.3f, 4).data());
    const double bytes = 4.0 * (T * C + 2 * T * Hv + T * Hv * 128 + (2 * c.spans + c.spans * c.saves) * Hv * 128 * 128);
    auto report = [&](const std::string& what, double ms) {
      std::printf("%-40s %6lld %10.1f %10.1f %9.0f\n", what.c_str(), static_cast<long long>(T), bytes / 1e6,
                  ms * 1e3, bytes / (ms * 1e-3) / 1e9);
      std::fflush(stdout);
    };
    const double ms = time_graph(
        gpu, [&](int) { gpu.gdn_chunked(out.tensor(), qkv.tensor(), g.tensor(), beta.tensor(), st.tensor(), b, d); },
        3);
    report(c.name, ms);
    if (c.recurrent) {
      const double rms = time_graph(
          gpu,
          [&](int) { gpu.gdn_recurrent(out.tensor(), qkv.tensor(), g.tensor(), beta.tensor(), st.tensor(), b, d); },
          1);
      report(std::string(c.name) + " (recurrent)", rms);
    }
  }
}

RegisterKernelBench register_gdn_chunked_bench("gdn_chunked", bench_gdn_chunked);

}  // namespace
}  // namespace sparkserve
