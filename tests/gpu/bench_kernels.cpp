// gpu_ops --bench-kernels: times the decode GEMV / MoE kernels (backend/cuda/gemv_*.cu, moe_*.cu) at the
// Qwen3.5-122B-A10B shapes through the backend's own ops, and prints achieved bandwidth against the
// measured device-to-device copy bandwidth. Method (.library METHOD.md): random (never zero) weights;
// each op run captured ITERS times into a CUDA graph (strict global capture mode: this also proves
// the ops capture-safe) and the graph replayed, timed with CUDA events, median of 5 replays; the
// weights rotate over enough copies (>= 512 MB) that every run reads them from HBM, not the 50 MB L2;
// MoE routing drawn fresh per run (8 of 256 experts per token), bytes counted over the experts
// actually touched. Bytes = weight payload + scales read once (activations are noise at T <= 16).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_stream.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "gpu_harness.h"
#include "bench_common.h"

namespace sparkserve {

// backend/cuda/moe_decode.h (a header for nvcc-built files): decode_moe with only some launches
// (stages: bit 0 gate_up, bit 1 down) and the gate_up grid for gu_blocks_per_sm blocks per SM (0: default).
bool decode_moe_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                      const Linear& gate_up, const Linear& down, int stages, int gu_blocks_per_sm);

#define BENCH_CHECK(x)                                                                              \
  do {                                                                                              \
    const cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

std::mt19937_64 g_bench_rng(12345);

// Random bytes shaped for a format: valid E4M3 (no NaN codes), bf16 of modest magnitude, any E2M1.
std::vector<uint8_t> random_bytes(size_t n, int kind) {
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t r = g_bench_rng();
    std::memcpy(&v[i], &r, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(g_bench_rng());
  if (kind == 1) {  // e4m3 codes: clear the NaN patterns
    for (auto& b : v)
      if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
  } else if (kind == 2) {  // bf16: sign, exponent 120..127, random mantissa
    for (size_t j = 1; j < n; j += 2) v[j] = static_cast<uint8_t>((v[j] & 0x80) | 0x3c | (v[j] & 0x03));
  }
  return v;
}

BenchLinear make_linear(Backend* g, WeightFormat fmt, ActivationQuant act, int64_t E, int64_t N, int64_t K, int64_t P) {
  BenchLinear b;
  Linear& l = b.lin;
  l.format = fmt;
  l.activation = act;
  l.out_features = N;
  l.in_features = K;
  l.partitions = P;
  auto upload = [&](DType dt, std::vector<int64_t> shape, const void* data) {
    b.keep.emplace_back(g, dt, std::move(shape));
    g->upload(b.keep.back(), data);
    return b.keep.back().tensor();
  };
  const bool nvfp4 = is_nvfp4(fmt);
  if (fmt == WeightFormat::kBf16) {
    auto w = random_bytes(static_cast<size_t>(E * N * K * 2), 2);
    l.weight = upload(DType::kBF16, {E, N, K}, w.data());
    b.bytes_per_expert = static_cast<double>(N * K * 2);
  } else if (nvfp4) {
    auto w = random_bytes(static_cast<size_t>(E * N * K / 2), 0);
    std::vector<uint8_t> sc(static_cast<size_t>(E * N * K / 16));
    for (auto& s : sc) s = static_cast<uint8_t>(0x30 + g_bench_rng() % 16);  // E4M3 0.5 .. ~1.9
    l.weight = upload(DType::kU8, {E, N, K / 2}, w.data());
    l.weight_scale = upload(DType::kF8E4M3, {E, N, K / 16}, sc.data());
    std::vector<float> gs(static_cast<size_t>(E * P), 448.0f * 6.0f / 2.0f), is(static_cast<size_t>(E * P), 448.0f * 6.0f / 8.0f);
    l.global_scale = upload(DType::kF32, {E, P}, gs.data());
    l.input_scale = upload(DType::kF32, {E, P}, is.data());
    b.bytes_per_expert = static_cast<double>(N * K / 2 + N * K / 16);
  } else {
    auto w = random_bytes(static_cast<size_t>(E * N * K), 1);
    std::vector<float> ws(static_cast<size_t>(E * N), 1.0f / 256.0f), is(static_cast<size_t>(E * P), 8.0f / 448.0f);
    l.weight = upload(DType::kF8E4M3, {E, N, K}, w.data());
    l.weight_scale = upload(DType::kF32, {E, N}, ws.data());
    l.input_scale = upload(DType::kF32, {E, P}, is.data());
    b.bytes_per_expert = static_cast<double>(N * K + N * 4);
  }
  return b;
}

int64_t random_routing(int64_t T, int64_t E, int64_t k, std::vector<int32_t>& ids, std::vector<float>& weights) {
  std::set<int32_t> touched;
  std::vector<int32_t> all(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), g_bench_rng);
    for (int64_t j = 0; j < k; ++j) {
      ids.push_back(all[static_cast<size_t>(j)]);
      weights.push_back(1.0f / static_cast<float>(k));
      touched.insert(all[static_cast<size_t>(j)]);
    }
  }
  return static_cast<int64_t>(touched.size());
}

// Median ms of one body(i) call: ITERS calls captured into a graph, replayed 5 times.
double time_graph(Backend& cb, const std::function<void(int)>& body, int iters) {
  const cudaStream_t s = cuda_stream_of(cb);
  for (int i = 0; i < 2; ++i) body(i);  // warm-up outside the capture (module load, attributes)
  cb.synchronize();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < iters; ++i) body(i);
  BENCH_CHECK(cudaStreamEndCapture(s, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CHECK(cudaGraphLaunch(exec, s));
  cb.synchronize();
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    BENCH_CHECK(cudaEventRecord(a, s));
    BENCH_CHECK(cudaGraphLaunch(exec, s));
    BENCH_CHECK(cudaEventRecord(b, s));
    BENCH_CHECK(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / static_cast<float>(iters));
  }
  BENCH_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

double copy_bandwidth(Backend& cb) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  BENCH_CHECK(cudaMalloc(&src, bytes));
  BENCH_CHECK(cudaMalloc(&dst, bytes));
  BENCH_CHECK(cudaMemsetAsync(src, 1, bytes, cuda_stream_of(cb)));
  const double ms = time_graph(
      cb, [&](int) { BENCH_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_of(cb))); }, 10);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;  // read + write
}


// filter: run only the cases whose name contains it (empty: all).
int run_bench_kernels(Backend& gpu, const std::string& filter) {
  if (!cuda_stream_of(gpu)) return 2;
  Backend& cb = gpu;
  const double copy_gbs = copy_bandwidth(cb);
  std::printf("device-to-device copy (read + write): %.0f GB/s\n", copy_gbs);
  std::printf("%-44s %4s %10s %10s %9s %8s\n", "kernel (122B shape)", "T", "MB read", "us", "GB/s", "of copy");
  auto report = [&](const std::string& name, int64_t T, double bytes, double ms) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-44s %4lld %10.2f %10.2f %9.0f %7.0f%%\n", name.c_str(), static_cast<long long>(T), bytes / 1e6,
                ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
    std::fflush(stdout);
  };
  struct DenseCase {
    const char* name;
    WeightFormat fmt;
    ActivationQuant act;
    int64_t N, K, P;
    std::vector<int64_t> Ts;
  };
  const std::vector<DenseCase> dense = {
      {"bf16 lm_head 248320x3072", WeightFormat::kBf16, ActivationQuant::kNone, 248320, 3072, 1, {1, 4}},
      {"bf16 router 256x3072", WeightFormat::kBf16, ActivationQuant::kNone, 256, 3072, 1, {1}},
      {"bf16 gdn in_proj_a 64x3072", WeightFormat::kBf16, ActivationQuant::kNone, 64, 3072, 1, {1}},
      {"fp8 w8a8 gdn in_proj_qkv 12288x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 12288, 3072, 1, {1, 4, 8, 16}},
      {"fp8 w8a8 gdn in_proj_z 8192x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 8192, 3072, 1, {1}},
      {"fp8 w8a8 gdn out_proj 3072x8192", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 3072, 8192, 1, {1, 4}},
      {"fp8 w8a8 attn q_proj 16384x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 16384, 3072, 1, {1}},
      {"fp8 w8a8 attn k_proj 512x3072", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 512, 3072, 1, {1}},
      {"fp8 w8a8 shared gate_up 2048x3072 P2", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 2048, 3072, 2, {1}},
      {"fp8 w8a8 shared down 3072x1024", WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 3072, 1024, 1, {1}},
      {"nvfp4 w4a4 gdn in_proj_qkv 12288x3072", WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 12288, 3072, 1, {1, 4}},
      {"nvfp4 w4a4 gdn out_proj 3072x8192", WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 3072, 8192, 1, {1}},
  };
  for (const auto& c : dense) {
    if (std::string(c.name).find(filter) == std::string::npos) continue;
    const double one = is_nvfp4(c.fmt) ? c.N * c.K * (0.5 + 1.0 / 16) : (c.fmt == WeightFormat::kBf16 ? c.N * c.K * 2.0 : c.N * (c.K + 4.0));
    const int copies = static_cast<int>(std::max<double>(1.0, std::min<double>(64.0, 512e6 / one)));
    std::vector<BenchLinear> ws;
    for (int i = 0; i < copies; ++i) ws.push_back(make_linear(&gpu, c.fmt, c.act, 1, c.N, c.K, c.P));
    for (int64_t T : c.Ts) {
      Buffer x(&gpu, DType::kF32, {T, c.K}), out(&gpu, DType::kF32, {T, c.N});
      std::vector<float> xv(static_cast<size_t>(T * c.K));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : xv) v = nd(g_bench_rng);
      gpu.upload(x, xv.data());
      const int iters = std::max(copies, 8);
      const double ms = time_graph(cb, [&](int i) { gpu.linear(out, x, ws[static_cast<size_t>(i % copies)].lin); }, iters);
      report(c.name, T, one, ms);
    }
  }
  // Fused MoE: 256 experts, top-8, H 3072, I 1024 (gate_up with 2 partitions), NVFP4 W4A4 as in both
  // NVFP4 layouts.
  struct MoeCase {
    const char* name;
    WeightFormat fmt;
    ActivationQuant act;
  };
  for (const MoeCase& c : {MoeCase{"moe nvfp4 w4a4 256x(2x1024x3072 + 3072x1024)", WeightFormat::kNvfp4, ActivationQuant::kNvfp4}}) {
    if (std::string(c.name).find(filter) == std::string::npos) continue;
    const int64_t E = 256, k = 8, H = 3072, I = 1024;
    BenchLinear gu = make_linear(&gpu, c.fmt, c.act, E, 2 * I, H, 2);
    BenchLinear dn = make_linear(&gpu, c.fmt, c.act, E, H, I, 1);
    for (int64_t T : {1, 4, 16}) {
      constexpr int kSets = 32;
      std::vector<Buffer> ids, wts;
      double bytes = 0, bytes_gu = 0;
      for (int sidx = 0; sidx < kSets; ++sidx) {
        std::vector<int32_t> iv;
        std::vector<float> wv;
        const double touched = static_cast<double>(random_routing(T, E, k, iv, wv));
        bytes += touched * (gu.bytes_per_expert + dn.bytes_per_expert);
        bytes_gu += touched * gu.bytes_per_expert;
        ids.emplace_back(&gpu, DType::kI32, std::vector<int64_t>{T, k});
        gpu.upload(ids.back(), iv.data());
        wts.emplace_back(&gpu, DType::kF32, std::vector<int64_t>{T, k});
        gpu.upload(wts.back(), wv.data());
      }
      bytes /= kSets;
      bytes_gu /= kSets;
      Buffer x(&gpu, DType::kF32, {T, H}), out(&gpu, DType::kF32, {T, H});
      std::vector<float> xv(static_cast<size_t>(T * H));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (auto& v : xv) v = nd(g_bench_rng);
      gpu.upload(x, xv.data());
      const double ms = time_graph(
          cb,
          [&](int i) {
            gpu.moe_experts(out, x, ids[static_cast<size_t>(i % kSets)], wts[static_cast<size_t>(i % kSets)], gu.lin,
                            dn.lin);
          },
          kSets);
      report(c.name, T, bytes, ms);
      // Where the time goes: each launch alone, and the gate_up grid at 1 and 4 blocks per SM.
      if (T > 4) continue;
      struct Probe {
        const char* what;
        int stages, per_sm;
        double bytes;
      };
      for (const Probe& p : {Probe{" gate_up only", 1, 0, bytes_gu}, Probe{" down only", 2, 0, bytes - bytes_gu},
                             Probe{" gate_up 1/SM", 3, 1, bytes}, Probe{" gate_up 4/SM", 3, 4, bytes}}) {
        bool taken = true;
        const double pms = time_graph(
            cb,
            [&](int i) {
              taken = decode_moe_probe(gpu, out, x, ids[static_cast<size_t>(i % kSets)],
                                       wts[static_cast<size_t>(i % kSets)], gu.lin, dn.lin, p.stages, p.per_sm) &&
                      taken;
            },
            kSets);
        if (taken) report(std::string("moe") + p.what, T, p.bytes, pms);
      }
    }
  }
  for (const KernelBench& kb : kernel_benches())
    if (kb.name.find(filter) != std::string::npos) kb.run(gpu);
  return 0;
}

}  // namespace sparkserve
