// gpu_ops --bench-kernels --bench-filter "bf16 experts": the routed bf16 experts (moe.cu's float path:
// the MTP layer's experts) at the Qwen3.5-122B-A10B MTP shapes (256 experts, top-8, H 3072, I 1024,
// gate_up [2I, H] in one matrix), 1..512 tokens: the op as the model calls it and each regime forced
// (fused per-slot GEMVs, SIMT grouped tiles, bf16 tensor-core grouped tiles). Method as
// bench_kernels.cpp (graph replay, CUDA-event median, uniform random routing, fresh routing sets
// rotated so small T reads weights from HBM). Columns as moe_grouped_bench.cpp: MB read counts each
// distinct routed expert once.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {

// backend/cuda/moe.cu: the float experts with the regime forced (0 fused GEMVs, 1 per-slot GEMVs,
// 2 SIMT grouped, 3 bf16 tensor-core grouped).
bool float_experts_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                         const Linear& gate_up, const Linear& down, int path);

namespace {

void print_row(const std::string& name, int64_t T, double ms, double flop, double bytes) {
  std::printf("%-46s %5lld %10.1f %8.1f %9.1f %8.0f\n", name.c_str(), static_cast<long long>(T), ms * 1e3,
              flop / (ms * 1e-3) / 1e12, bytes / 1e6, bytes / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

void bench_bf16_experts(Backend& gpu) {
  const int64_t E = 256, k = 8, H = 3072, I = 1024;
  BenchLinear gu = make_linear(&gpu, WeightFormat::kBf16, ActivationQuant::kNone, E, 2 * I, H, 1);
  BenchLinear dn = make_linear(&gpu, WeightFormat::kBf16, ActivationQuant::kNone, E, H, I, 1);
  std::printf("%-46s %5s %10s %8s %9s %8s\n", "bf16 experts (122B MTP: 256 x 8, 3072/1024)", "T", "us", "TFLOP/s",
              "MB read", "GB/s");
  const char* names[4] = {" fused GEMVs (decode_moe)", " per-slot GEMVs", " SIMT grouped tiles",
                          " bf16 tensor-core grouped tiles"};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t T : {1, 3, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512}) {
    const int sets = T <= 64 ? 8 : 4;
    std::vector<Buffer> ids, wts;
    double bytes = 0;
    for (int s = 0; s < sets; ++s) {
      std::vector<int32_t> iv;
      std::vector<float> wv;
      const double touched = static_cast<double>(random_routing(T, E, k, iv, wv));
      bytes += touched * (gu.bytes_per_expert + dn.bytes_per_expert) / sets;
      ids.emplace_back(&gpu, DType::kI32, std::vector<int64_t>{T, k});
      gpu.upload(ids.back(), iv.data());
      wts.emplace_back(&gpu, DType::kF32, std::vector<int64_t>{T, k});
      gpu.upload(wts.back(), wv.data());
    }
    std::vector<float> xv(static_cast<size_t>(T * H));
    for (auto& v : xv) v = nd(g_bench_rng);
    Buffer x(&gpu, DType::kF32, {T, H}), out(&gpu, DType::kF32, {T, H});
    gpu.upload(x, xv.data());
    const double flop = 6.0 * static_cast<double>(T * k) * static_cast<double>(H * I);
    const int iters = T <= 64 ? 16 : 4;
    auto idx = [&](int i) { return static_cast<size_t>(i % sets); };
    print_row("op moe_experts", T,
              time_graph(gpu, [&](int i) { gpu.moe_experts(out, x, ids[idx(i)], wts[idx(i)], gu.lin, dn.lin); }, iters),
              flop, bytes);
    for (int path = 0; path < 4; ++path) {
      if (path == 1 && T > 64) continue;  // the fused GEMVs' fallback: slower than them everywhere
      if (path == 2 && T < 32) continue;  // SIMT tiles: compute-bound, slower than the GEMVs at few rows
      bool taken = true;
      const double ms = time_graph(
          gpu,
          [&](int i) {
            taken = float_experts_probe(gpu, out, x, ids[idx(i)], wts[idx(i)], gu.lin, dn.lin, path) && taken;
          },
          iters);
      if (taken)
        print_row(names[path], T, ms, flop, bytes);
      else
        std::printf("%-46s %5lld   not taken\n", names[path], static_cast<long long>(T));
    }
  }
}

const RegisterKernelBench kBf16Experts("bf16 experts", bench_bf16_experts);

}  // namespace
}  // namespace sparkserve
