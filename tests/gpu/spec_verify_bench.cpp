// gpu_ops --bench-kernels --bench-filter "verify ops": what a speculative verify step (T = k + 1 tokens of one
// sequence) costs over a decode step (T = 1), op by op, at the Qwen3.5-122B-A10B nvfp4-fp8dense shapes:
// every weight-reading op of a decoder layer through the backend's own dispatch (linear, moe_route_experts)
// at T = 1..4 and 64, 128, 192 (batch 1 and 64, decode and verify at k = 1..3), then the step's sum (each op
// times its count per step: 36 GDN layers, 12 attention layers, 48 MoE blocks, one lm_head). Attention, the GDN recurrence, norms and the elementwise ops are not in it:
// measured decode / verify steps minus these sums leave them. Method as bench_kernels.cpp: graph replay,
// CUDA-event median, weights rotated over >= 128 MB of copies (at most 128) so that they come from HBM,
// fresh router logits per run (uniform random routing).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

struct DenseOp {
  const char* name;
  WeightFormat fmt;
  ActivationQuant act;
  int64_t N, K, P, per_step;
};

// Batch 1 decode and its verify steps (k = 1..3), batch 64 decode and its verify steps at k = 1, 2.
constexpr int64_t kTs[] = {1, 2, 3, 4, 64, 128, 192};
constexpr int kNT = 7;
constexpr int kT1 = 0, kT3 = 2, kT64 = 4, kT192 = 6;

std::vector<float> random_f32(int64_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(g_bench_rng);
  return v;
}

void print_op(const std::string& name, int64_t per_step, const double (&us)[kNT]) {
  std::printf("%-34s %4lld", name.c_str(), static_cast<long long>(per_step));
  for (int i = 0; i < kNT; ++i) std::printf(" %9.1f", us[i]);
  std::printf(" %6.2fx %8.0f %6.2fx %8.0f\n", us[kT3] / us[kT1], per_step * (us[kT3] - us[kT1]), us[kT192] / us[kT64],
              per_step * (us[kT192] - us[kT64]));
  std::fflush(stdout);
}

void bench_verify_ops(Backend& gpu) {
  const int64_t H = 3072, E = 256, k = 8, I = 1024;
  const int64_t kGdn = 36, kAttn = 12, kLayers = 48;
  const std::vector<DenseOp> dense = {
      {"gdn in_proj_qkv fp8 12288x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 12288, H, 1, kGdn},
      {"gdn in_proj_z fp8 8192x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 8192, H, 1, kGdn},
      {"gdn in_proj_a bf16 64x3072", WeightFormat::kBf16, ActivationQuant::kNone, 64, H, 1, kGdn},
      {"gdn in_proj_b bf16 64x3072", WeightFormat::kBf16, ActivationQuant::kNone, 64, H, 1, kGdn},
      {"gdn out_proj fp8 3072x8192", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, H, 8192, 1, kGdn},
      {"attn q+gate fp8 16384x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 16384, H, 1, kAttn},
      {"attn k fp8 512x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 512, H, 1, kAttn},
      {"attn v fp8 512x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 512, H, 1, kAttn},
      {"attn o fp8 3072x8192", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, H, 8192, 1, kAttn},
      {"router bf16 256x3072", WeightFormat::kBf16, ActivationQuant::kNone, E, H, 1, kLayers},
      {"shared gate_up fp8 2048x3072 P2", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 2 * I, H, 2,
       kLayers},
      {"shared down fp8 3072x1024", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, H, I, 1, kLayers},
      {"shared gate bf16 1x3072", WeightFormat::kBf16, ActivationQuant::kNone, 1, H, 1, kLayers},
      {"lm_head bf16 248320x3072", WeightFormat::kBf16, ActivationQuant::kNone, 248320, H, 1, 1},
  };
  std::printf("%-34s %4s", "verify ops (122B nvfp4-fp8dense)", "/stp");
  for (int64_t T : kTs) std::printf(" %9s", ("T=" + std::to_string(T) + " us").c_str());
  std::printf(" %7s %8s %7s %8s\n", "3/1", "+us T=3", "192/64", "+us 192");
  double step[kNT] = {};
  for (const DenseOp& op : dense) {
    std::vector<BenchLinear> ws;
    ws.push_back(make_linear(&gpu, op.fmt, op.act, 1, op.N, op.K, op.P));
    const double bytes = ws[0].bytes_per_expert;
    while (ws.size() < 128 && static_cast<double>(ws.size()) * bytes < 128e6)
      ws.push_back(make_linear(&gpu, op.fmt, op.act, 1, op.N, op.K, op.P));
    double us[kNT];
    for (int i = 0; i < kNT; ++i) {
      const int64_t T = kTs[i];
      Buffer x(&gpu, DType::kF32, {T, op.K}), out(&gpu, DType::kF32, {T, op.N});
      gpu.upload(x, random_f32(T * op.K, 1.0f).data());
      const int iters = std::max<int>(static_cast<int>(ws.size()), 8);
      us[i] = 1e3 * time_graph(gpu, [&](int j) { gpu.linear(out, x, ws[static_cast<size_t>(j) % ws.size()].lin); },
                               iters);
      step[i] += static_cast<double>(op.per_step) * us[i];
    }
    print_op(op.name, op.per_step, us);
  }
  {  // the routed experts with the routing, as the model calls them
    BenchLinear gu = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, 2 * I, H, 2);
    BenchLinear dn = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, H, I, 1);
    double us[kNT];
    for (int i = 0; i < kNT; ++i) {
      const int64_t T = kTs[i];
      constexpr int kSets = 16;
      std::vector<Buffer> logits;
      for (int s = 0; s < kSets; ++s) {
        logits.emplace_back(&gpu, DType::kF32, std::vector<int64_t>{T, E});
        gpu.upload(logits.back(), random_f32(T * E, 2.0f).data());
      }
      Buffer x(&gpu, DType::kF32, {T, H}), out(&gpu, DType::kF32, {T, H}), ids(&gpu, DType::kI32, {T, k}),
          wts(&gpu, DType::kF32, {T, k});
      gpu.upload(x, random_f32(T * H, 1.0f).data());
      us[i] = 1e3 * time_graph(
                        gpu,
                        [&](int j) {
                          gpu.moe_route_experts(out, wts, ids, logits[static_cast<size_t>(j % kSets)], x, gu.lin,
                                                dn.lin);
                        },
                        kSets);
      step[i] += static_cast<double>(kLayers) * us[i];
    }
    print_op("routed experts nvfp4 256x8 route+moe", kLayers, us);
  }
  print_op("sum over one step", 1, step);
}

const RegisterKernelBench kVerifyOps("verify ops", bench_verify_ops);

}  // namespace
}  // namespace sparkserve
