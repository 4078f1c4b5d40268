// gpu_ops --bench-kernels "dense fused": the dense projections of a 35B-A3B layer one op at a time
// against backend/ops.h's fused forms (linears, linear_add_rmsnorm, gated_mlp; the CUDA backend's
// linear_fused.cu), at a later agent turn's 338 tokens, batched decode and a long prefill. One copy
// of each weight: the 35B's dense weights of a layer (~37 MB) stay in L2 between iterations, so the
// figures are the launches and the kernels' own time, which is what the fusions change.
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/linear_probe.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

Buffer normal(Backend& g, std::vector<int64_t> shape, float scale) {
  Buffer b(&g, DType::kF32, shape);
  std::vector<float> v(static_cast<size_t>(b.tensor().numel()));
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& e : v) e = nd(g_bench_rng);
  g.upload(b, v.data());
  return b;
}

void row(const char* what, int64_t T, const char* how, double ms) {
  std::printf("%-24s %5lld %-30s %8.2f us\n", what, static_cast<long long>(T), how, ms * 1e3);
}

void bench_dense_fused(Backend& g) {
  std::printf("-- dense fused (35B-A3B shapes): one op at a time vs the fused op, us per call\n");
  const int64_t H = 2048;
  const auto fp8 = WeightFormat::kFp8Channel;
  const auto dyn = ActivationQuant::kFp8TokenDynamic, none = ActivationQuant::kNone;
  BenchLinear qkv = make_linear(&g, fp8, dyn, 1, 8192, H, 1), z = make_linear(&g, fp8, dyn, 1, 4096, H, 1);
  BenchLinear b = make_linear(&g, WeightFormat::kBf16, none, 1, 32, H, 1);
  BenchLinear a = make_linear(&g, WeightFormat::kBf16, none, 1, 32, H, 1);
  BenchLinear out_proj = make_linear(&g, fp8, dyn, 1, H, 4096, 1);
  BenchLinear gate_up = make_linear(&g, fp8, dyn, 1, 1024, H, 1), down = make_linear(&g, fp8, dyn, 1, H, 512, 1);
  Buffer norm = normal(g, {H}, 0.1f);
  for (int64_t T : {16, 40, 64, 338, 2048}) {
    Buffer x = normal(g, {T, H}, 1.0f), x2 = normal(g, {T, 4096}, 1.0f), res = normal(g, {T, H}, 3.0f);
    Buffer mixed(&g, DType::kF32, {T, 8192}), zo(&g, DType::kF32, {T, 4096}), bo(&g, DType::kF32, {T, 32}),
        ao(&g, DType::kF32, {T, 32}), d(&g, DType::kF32, {T, H}), h(&g, DType::kF32, {T, H}),
        gu(&g, DType::kF32, {T, 1024}), act(&g, DType::kF32, {T, 512});
    auto bench = [&](const char* what, const char* how, const std::function<void()>& ops) {
      row(what, T, how, time_graph(g, [&](int) { ops(); }, 20));
    };
    // GDN in_proj: before (branches for qkv / z, split-bf16 b and a), each through linear, fused.
    bench("gdn in_proj", "branches + split-bf16 a/b", [&] {
      g.run_branches({[&] { g.linear(mixed, x, qkv.lin); }, [&] { g.linear(zo, x, z.lin); }});
      linear_probe(g, bo, x, b.lin, LinearPath::kBf16Split);
      linear_probe(g, ao, x, a.lin, LinearPath::kBf16Split);
    });
    bench("gdn in_proj", "branches + small-n a/b", [&] {
      g.run_branches({[&] { g.linear(mixed, x, qkv.lin); }, [&] { g.linear(zo, x, z.lin); }});
      g.linear(bo, x, b.lin);
      g.linear(ao, x, a.lin);
    });
    bench("gdn in_proj", "linears", [&] { g.linears({mixed, zo, bo, ao}, x, {&qkv.lin, &z.lin, &b.lin, &a.lin}); });
    // out_proj and the residual step; the GDN block's end (gated norm, out_proj, residual step).
    bench("out_proj + add_rmsnorm", "linear, add_rmsnorm", [&] {
      g.linear(d, x2, out_proj.lin);
      g.add_rmsnorm(res, h, d, norm, 1e-6f);
    });
    bench("out_proj + add_rmsnorm", "linear_add_rmsnorm",
         [&] { g.linear_add_rmsnorm(res, h, x2, out_proj.lin, norm, 1e-6f); });
    Buffer core = normal(g, {T, 32, 128}, 1.0f), zz = normal(g, {T, 32, 128}, 1.0f), gw = normal(g, {128}, 0.5f);
    bench("gated norm + out_proj", "gated_rmsnorm, linear, add_rmsnorm", [&] {
      g.gated_rmsnorm(x2.tensor().view({T * 32, 128}), core.tensor().view({T * 32, 128}),
                      zz.tensor().view({T * 32, 128}), gw, 1e-6f);
      g.linear(d, x2, out_proj.lin);
      g.add_rmsnorm(res, h, d, norm, 1e-6f);
    });
    bench("gated norm + out_proj", "fused",
         [&] { g.gated_rmsnorm_linear_add_rmsnorm(res, h, core, zz, gw, out_proj.lin, norm, 1e-6f); });
    // The shared expert.
    bench("shared expert", "linear, silu_mul, linear", [&] {
      g.linear(gu, x, gate_up.lin);
      g.silu_mul(act, gu);
      g.linear(d, act, down.lin);
    });
    bench("shared expert", "gated_mlp", [&] { g.gated_mlp(d, x, gate_up.lin, down.lin); });
  }
}

RegisterKernelBench reg("dense fused", bench_dense_fused);

}  // namespace
}  // namespace sparkserve
