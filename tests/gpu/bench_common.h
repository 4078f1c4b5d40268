// Helpers of gpu_ops --bench-kernels (defined in bench_kernels.cpp) for benchmark cases in other
// files (registered through gpu_harness.h's RegisterKernelBench). Built by the host compiler.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "backend/ops.h"

namespace sparkserve {

extern std::mt19937_64 g_bench_rng;

// Random bytes shaped for a format. kind 0: any bytes (E2M1 codes); 1: valid E4M3 (no NaN codes);
// 2: bf16 of modest magnitude.
std::vector<uint8_t> random_bytes(size_t n, int kind);

// A random Linear on the device in format fmt, E experts of [N, K], P partitions.
struct BenchLinear {
  std::vector<Buffer> keep;
  Linear lin;
  double bytes_per_expert = 0;  // payload + scales of one expert
};
BenchLinear make_linear(Backend* g, WeightFormat fmt, ActivationQuant act, int64_t E, int64_t N, int64_t K, int64_t P);

// Uniform random routing: k distinct experts of E per token for T tokens, weights 1/k. Returns how
// many distinct experts the T tokens touch.
// -> ids: [T, k], weights: [T, k] (appended)
int64_t random_routing(int64_t T, int64_t E, int64_t k, std::vector<int32_t>& ids, std::vector<float>& weights);

// Median ms of one body(i) call: iters calls captured into a CUDA graph, replayed 5 times.
double time_graph(Backend& cb, const std::function<void(int)>& body, int iters);

// Device-to-device copy bandwidth, GB/s counting bytes read + written.
double copy_bandwidth(Backend& cb);

}  // namespace sparkserve
