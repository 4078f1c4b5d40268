// gpu_ops --bench-kernels "moe router": the MoE block's glue before the routed experts at decode /
// verify token counts, at the 122B-A10B and 35B-A3B shapes (router bf16 256 x 3072 / 2048, 256 experts,
// top-8, NVFP4 experts I 1024 / 512). Each timed call is preceded by the rmsnorm that writes the
// router's input, as in the model (a programmatically launched kernel overlaps the one before it; a
// call after a call of itself would overlap more than the model lets it); the "norm alone" row is
// that kernel's share, to subtract. Router weights rotate over 64 copies (96 / 64 MB: from HBM, as in
// a decode step where 48 layers' routers and ~10 GB of other weights pass through the 50 MB L2). Rows:
// - router linear: the dispatch, and each bf16 path forced (gemv T <= 16, split-bf16 T >= 2, few-token);
// - routing alone (route_topk's kernel: registers vs the shared-memory reference it replaced);
// - router + routing + plan: the dispatch's router, then the grouped MoE's plan with the routing fused
//   (what runs before the experts from 9 tokens; below, the routing is fused into moe_w4a4's first launch);
// - the routed branch as the model runs it: norm, router, moe_route_experts (routing fused, experts).
// Method as bench_kernels.cpp: graph replay, CUDA-event median of 5 replays per call.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/linear_probe.h"
#include "backend/cuda/moe_probe.h"
#include "backend/ops.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

constexpr int64_t kE = 256, kTopK = 8;
constexpr int kCopies = 64, kXSets = 16;

Buffer random_buffer(Backend& g, std::vector<int64_t> shape, float scale) {
  Buffer b(&g, DType::kF32, shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& x : v) x = nd(g_bench_rng);
  g.upload(b, v.data());
  return b;
}

void row(const char* shape, int64_t T, const std::string& what, double ms) {
  std::printf("%-10s %4lld  %-44s %9.2f\n", shape, static_cast<long long>(T), what.c_str(), ms * 1e3);
  std::fflush(stdout);
}

void bench_shape(Backend& g, const char* shape, int64_t H, int64_t I, const std::vector<int64_t>& Ts) {
  BenchLinear router = make_linear(&g, WeightFormat::kBf16, ActivationQuant::kNone, kCopies, kE, H, 1);
  std::vector<Linear> routers(kCopies, router.lin);
  for (int c = 0; c < kCopies; ++c)
    routers[static_cast<size_t>(c)].weight = Tensor(static_cast<uint16_t*>(router.lin.weight.data) + c * kE * H,
                                                    DType::kBF16, {kE, H}, router.lin.weight.device);
  Buffer norm_w = random_buffer(g, {H}, 0.1f);
  const BenchLinear gu = make_linear(&g, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, kE, 2 * I, H, 2);
  const BenchLinear dn = make_linear(&g, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, kE, H, I, 1);
  std::printf("%-10s %4s  %-44s %9s\n", shape, "T", "what (each after an rmsnorm of x)", "us");
  for (int64_t T : Ts) {
    std::vector<Buffer> xs;
    for (int s = 0; s < kXSets; ++s) xs.push_back(random_buffer(g, {T, H}, 1.0f));
    Buffer xn(&g, DType::kF32, {T, H}), logits(&g, DType::kF32, {T, kE}), out(&g, DType::kF32, {T, H});
    Buffer ids(&g, DType::kI32, {T, kTopK}), wts(&g, DType::kF32, {T, kTopK});
    const int iters = kCopies;
    auto norm = [&](int i) { g.rmsnorm(xn, xs[static_cast<size_t>(i % kXSets)], norm_w, 1e-6f); };
    auto lin = [&](int i) { g.linear(logits, xn, routers[static_cast<size_t>(i % kCopies)]); };
    const double base = time_graph(g, norm, iters);
    row(shape, T, "norm alone", base);
    auto norm_lin = [&](int i) {
      norm(i);
      lin(i);
    };
    row(shape, T, "router linear (dispatch)", time_graph(g, norm_lin, iters));
    for (auto [path, name] : {std::pair{LinearPath::kGemv, "router gemv"}, {LinearPath::kBf16Split, "router split-bf16"},
                              {LinearPath::kBf16FewTokens, "router few-token"}}) {
      if (path == LinearPath::kGemv && T > 16) continue;
      if (path == LinearPath::kBf16Split && T < 2) continue;
      bool taken = true;
      const double ms = time_graph(
          g,
          [&](int i) {
            norm(i);
            taken = linear_probe(g, logits, xn, routers[static_cast<size_t>(i % kCopies)], path) && taken;
          },
          iters);
      if (taken) row(shape, T, name, ms);
    }
    // Routing alone on fresh logits (the router's output of the calls above).
    for (bool reference : {false, true})
      row(shape, T, reference ? "router + routing kernel, shared-memory reference" : "router + routing kernel, registers",
          time_graph(
              g,
              [&](int i) {
                norm_lin(i);
                route_topk_probe(g, wts, ids, logits, reference);
              },
              iters));
    row(shape, T, "router + routing + plan (grouped, fused)",
        time_graph(
            g,
            [&](int i) {
              norm_lin(i);
              moe_plan_probe(g, ids, wts, &logits.tensor(), kE, 16, 1, nullptr);
            },
            iters));
    row(shape, T, "routed branch: router + moe_route_experts",
        time_graph(
            g,
            [&](int i) {
              norm_lin(i);
              g.moe_route_experts(out, wts, ids, logits, xn, gu.lin, dn.lin);
            },
            iters));
  }
}

void bench_moe_router(Backend& g) {
  bench_shape(g, "122B", 3072, 1024, {1, 2, 3, 4, 8, 16, 32, 64});
  bench_shape(g, "35B", 2048, 512, {1, 3, 16, 64});
}

const RegisterKernelBench kRouter("moe router", bench_moe_router);

}  // namespace
}  // namespace sparkserve
