// gpu_ops --bench-kernels cases of the dense matmul regimes (--bench-filter gemm), at the
// Qwen3.5-122B-A10B shapes, every path through linear_probe (backend/cuda/linear_probe.h):
// - "gemm fp8 prefill": the W8A8 GEMM at T = 8192 (M = 8192, N = 12288, K = 3072 is in_proj_qkv):
//   TFLOP/s with the activation quantization, the weights' f16 conversion and the scaling included,
//   for the cuBLASLt route and the small-N kernel in pieces of 64 tokens (the fallback); the
//   quantization alone; qkv at T = 128..2048 for the crossover;
// - "gemm small-N": T = 1..64 tokens (batched decode, speculative verify): the GEMVs, the small-N
//   kernel and the cuBLASLt route, µs and weight bytes per second against the measured copy
//   bandwidth (the floor);
// - "gemm bf16": router / lm_head: SIMT or GEMV vs the split-bf16 tensor-core GEMM.
// Method as bench_kernels.cpp: ops captured into a CUDA graph and replayed, median of 5; weights
// rotated over >= 512 MB of copies where the weight stream is what is measured.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/linear_probe.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

struct Shape {
  const char* name;
  int64_t N, K, P;
};
// The 122B's dense FP8 layers (hidden 3072): GDN in_proj_qkv / z / out_proj, attention q (with its
// gate) / o, the shared expert (gate_up as two partitions, down).
const Shape kFp8Shapes[] = {
    {"qkv 12288x3072", 12288, 3072, 1},      {"z 8192x3072", 8192, 3072, 1},
    {"out_proj 3072x8192", 3072, 8192, 1},   {"attn q 16384x3072", 16384, 3072, 1},
    {"shared gate_up 2048x3072", 2048, 3072, 2}, {"shared down 3072x1024", 3072, 1024, 1},
};

Buffer random_x(Backend& g, int64_t T, int64_t K) {
  Buffer x(&g, DType::kF32, {T, K});
  std::vector<float> v(static_cast<size_t>(T * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& e : v) e = nd(g_bench_rng);
  g.upload(x, v.data());
  return x;
}

void print_row(const std::string& name, int64_t T, const char* path, double ms, double flop, double bytes,
               double copy_gbs) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-32s %5lld %-12s %9.2f us %8.1f TFLOP/s %7.0f GB/s %5.0f%% of copy\n", name.c_str(),
              static_cast<long long>(T), path, ms * 1e3, flop / (ms * 1e-3) / 1e12, gbs, 100.0 * gbs / copy_gbs);
  std::fflush(stdout);
}

// Times linear_probe(path) on weights[i % copies]; negative when the path does not take the case.
double time_path(Backend& g, const Tensor& out, const Tensor& x, std::vector<BenchLinear>& ws, LinearPath path,
                 int iters) {
  if (!linear_probe(g, out, x, ws[0].lin, path)) return -1;
  return time_graph(
      g, [&](int i) { linear_probe(g, out, x, ws[static_cast<size_t>(i) % ws.size()].lin, path); }, iters);
}

std::vector<BenchLinear> weight_copies(Backend& g, WeightFormat fmt, ActivationQuant act, int64_t N, int64_t K,
                                       int64_t P, double bytes, int most) {
  const int copies = static_cast<int>(std::clamp(512e6 / bytes, 1.0, static_cast<double>(most)));
  std::vector<BenchLinear> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(make_linear(&g, fmt, act, 1, N, K, P));
  return ws;
}

void bench_fp8_prefill(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- W8A8 GEMM, TFLOP/s including quantization, conversion and scaling\n");
  const std::pair<LinearPath, const char*> paths[] = {
      {LinearPath::kDispatch, "dispatch"}, {LinearPath::kFp8Gemm, "gemm-f16"}, {LinearPath::kFp8SmallN, "small-n x64"}};
  for (const Shape& s : kFp8Shapes) {
    auto ws = weight_copies(g, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, s.N, s.K, s.P,
                            static_cast<double>(s.N * s.K), 1);
    const bool qkv = s.N == 12288;
    for (int64_t T : qkv ? std::vector<int64_t>{128, 512, 2048, 8192} : std::vector<int64_t>{8192}) {
      Buffer x = random_x(g, T, s.K), out(&g, DType::kF32, {T, s.N});
      const double flop = 2.0 * T * s.N * s.K, bytes = static_cast<double>(s.N * s.K);
      for (auto [path, name] : paths) {
        const double ms = time_path(g, out, x, ws, path, T >= 2048 ? 4 : 8);
        if (ms < 0) std::printf("%-32s %5lld %-12s not taken\n", s.name, static_cast<long long>(T), name);
        else print_row(s.name, T, name, ms, flop, bytes, copy);
      }
      if (qkv && T == 8192) {  // the quantization alone, part of every figure above
        Buffer values(&g, DType::kF16, {T, s.K}), scales(&g, DType::kF32, {T});
        const double ms = time_graph(g, [&](int) { fp8_quantize_probe(g, values, scales, x); }, 8);
        print_row("fp8 quantize x 8192x3072 (f16)", T, "quantize", ms, 0, static_cast<double>(T * s.K) * 6.0, copy);
      }
    }
  }
}

void bench_small_n(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- small N: GEMV vs small-N tensor-core kernel vs cuBLASLt (GB/s of weights; floor: copy %.0f GB/s)\n",
              copy);
  for (const Shape& s : kFp8Shapes) {
    const double bytes = static_cast<double>(s.N) * (s.K + 4);
    auto ws = weight_copies(g, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, s.N, s.K, s.P, bytes, 64);
    for (int64_t T : {1, 2, 4, 8, 16, 32, 64}) {
      Buffer x = random_x(g, T, s.K), out(&g, DType::kF32, {T, s.N});
      const int iters = std::max<int>(static_cast<int>(ws.size()), 8);
      for (auto [path, name] : {std::pair{LinearPath::kGemv, "gemv"}, {LinearPath::kFp8SmallN, "small-n"},
                                {LinearPath::kFp8Gemm, "gemm-f16"}, {LinearPath::kDispatch, "dispatch"}}) {
        const double ms = time_path(g, out, x, ws, path, iters);
        if (ms >= 0) print_row(s.name, T, name, ms, 2.0 * T * s.N * s.K, bytes, copy);
      }
    }
  }
}

void bench_bf16(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- bf16 weights: SIMT / GEMV vs split-bf16 tensor cores\n");
  struct Case {
    const char* name;
    int64_t N, K;
    std::vector<int64_t> Ts;
  };
  for (const Case& c : {Case{"router 256x3072", 256, 3072, {2, 4, 8, 16, 64, 512, 8192}},
                        Case{"lm_head 248320x3072", 248320, 3072, {2, 4, 8, 16, 32, 64, 512}}}) {
    const double bytes = static_cast<double>(c.N * c.K) * 2;
    auto ws = weight_copies(g, WeightFormat::kBf16, ActivationQuant::kNone, c.N, c.K, 1, bytes, 64);
    for (int64_t T : c.Ts) {
      Buffer x = random_x(g, T, c.K), out(&g, DType::kF32, {T, c.N});
      const int iters = std::max<int>(static_cast<int>(ws.size()), 4);
      for (auto [path, name] : {std::pair{LinearPath::kGemv, "gemv"}, {LinearPath::kSimt, "simt"},
                                {LinearPath::kBf16Split, "split-bf16"}, {LinearPath::kDispatch, "dispatch"}}) {
        if (path == LinearPath::kSimt && T * c.N > int64_t{64} * 248320) continue;  // minutes on CUDA cores
        const double ms = time_path(g, out, x, ws, path, iters);
        if (ms >= 0) print_row(c.name, T, name, ms, 2.0 * T * c.N * c.K, bytes, copy);
      }
    }
  }
}

RegisterKernelBench reg_prefill("gemm fp8 prefill", bench_fp8_prefill);
RegisterKernelBench reg_small("gemm small-N", bench_small_n);
RegisterKernelBench reg_bf16("gemm bf16", bench_bf16);

}  // namespace
}  // namespace sparkserve
