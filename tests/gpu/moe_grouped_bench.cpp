// gpu_ops --bench-kernels cases "grouped ...": the tensor-core NVFP4 W4A4 paths (moe_grouped.cu,
// nvfp4_group_gemm.cu) at the Qwen3.5-35B-A3B and 122B-A10B expert shapes (256 experts, top-8, H 2048 /
// 3072, I 512 / 1024, gate_up in 2 partitions; dense layers of the all-NVFP4 layout). Method as bench_kernels.cpp: graph replay,
// CUDA-event median, random weights and uniform random routing (fresh sets rotated so small T reads
// weights from HBM). Columns: time per call, TFLOP/s (2 FLOP per multiply-add: 6·H·I per (token,
// expert) pair; 2·K·N per token for dense), MB of weights one call must read (each distinct routed
// expert once) and the GB/s that makes.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "bench_common.h"
#include "gpu_harness.h"

namespace sparkserve {

// backend/cuda/moe_grouped.cu (a header for nvcc-built files): the grouped MoE with each stage's
// launch repeated when its bit of `repeat` is set (0 plan, 1 prepare, 2 gate_up, 3 down, 4 combine)
// and the tile forced (GroupTile's order: 0 small-N, 1 large-N mma.sync, 2 large-N wgmma, 3 medium-N
// wgmma, 4 small-N sliced; -1 automatic); the dense path at any T.
bool moe_grouped_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                       const Linear& gate_up, const Linear& down, int repeat, int force_tile);
bool grouped_linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int force_tile);
// backend/cuda/moe_w4a4.cu: the one-token path (integer GEMVs per (token, expert) pair) at any T.
bool moe_w4a4_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                    const Linear& gate_up, const Linear& down);

namespace {

void print_row(const std::string& name, int64_t T, double ms, double flop, double bytes) {
  std::printf("%-46s %5lld %10.1f %8.1f %9.1f %8.0f\n", name.c_str(), static_cast<long long>(T), ms * 1e3,
              flop / (ms * 1e-3) / 1e12, bytes / 1e6, bytes / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

std::vector<float> random_x(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : v) x = nd(g_bench_rng);
  return v;
}

struct MoeShape {
  const char* name;
  int64_t H, I;
  std::vector<int64_t> Ts;
  unsigned tiles = 0x1F;  // bit t: time tile regime t (where tile_timed)
  // gate_proj and up_proj with different input scales (as synthetic checkpoints draw them): the prepared
  // activations then hold both partitions and gate_up reads two operands.
  bool distinct_scales = false;
};

constexpr int kTiles = 6;  // GroupTile order (nvfp4_group_gemm.h)
const char* const kTileNames[kTiles] = {" grouped small-N", " grouped large-N mma.sync", " grouped large-N wgmma",
                                        " grouped medium-N wgmma", " grouped small-N sliced", " grouped small-N sliced half"};

// Whether the benchmark times tile regime `tile` at T tokens (256 experts, top-8: T/32 rows per expert).
bool tile_timed(int tile, int64_t T) {
  switch (tile) {
    case 0: return T <= 512;  // slower than the tensor-core tiles above (measured: 2.3x at T = 2048)
    case 1: return T >= 512;  // slower than small-N below (measured: 1.8x at T = 64)
    case 2: return T >= 256;
    case 3: return T >= 64 && T <= 2048;  // 1.5-1.9x the small-N kernel at 2-4 rows per expert (measured)
    default: return T <= 512;
  }
}

void bench_grouped_moe_shape(Backend& gpu, const MoeShape& sh) {
  const int64_t E = 256, k = 8, H = sh.H, I = sh.I;
  BenchLinear gu = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, 2 * I, H, 2);
  BenchLinear dn = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, H, I, 1);
  if (sh.distinct_scales) {
    std::vector<float> is(static_cast<size_t>(E * 2));
    for (int64_t e = 0; e < E; ++e) {
      is[static_cast<size_t>(2 * e)] = 448.0f * 6.0f / 8.0f;
      is[static_cast<size_t>(2 * e + 1)] = 448.0f * 6.0f / 10.0f;
    }
    gpu.upload(gu.lin.input_scale, is.data());
  }
  std::printf("%-46s %5s %10s %8s %9s %8s\n", sh.name, "T", "us", "TFLOP/s", "MB read", "GB/s");
  for (int64_t T : sh.Ts) {
    const int sets = T <= 64 ? 16 : (T <= 1024 ? 4 : (T <= 2048 ? 2 : 1));
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
    Buffer x(&gpu, DType::kF32, {T, H}), out(&gpu, DType::kF32, {T, H});
    gpu.upload(x, random_x(T * H).data());
    const double flop = 6.0 * static_cast<double>(T * k) * static_cast<double>(H * I);
    const int iters = T <= 64 ? 32 : (T <= 2048 ? 8 : 3);
    auto idx = [&](int i) { return static_cast<size_t>(i % sets); };
    // The op as the model calls it (T = 1: the one-token path).
    const double ms = time_graph(
        gpu, [&](int i) { gpu.moe_experts(out, x, ids[idx(i)], wts[idx(i)], gu.lin, dn.lin); }, iters);
    print_row("op moe_experts", T, ms, flop, bytes);
    if (T > 1 && T <= 128) {  // the pre-grouped path: per (token, expert) pair
      const double w4 = time_graph(
          gpu, [&](int i) { moe_w4a4_probe(gpu, out, x, ids[idx(i)], wts[idx(i)], gu.lin, dn.lin); }, iters);
      print_row(" one-token path (moe_w4a4) at this T", T, w4, flop, bytes);
    }
    // Each tile regime forced, with its two GEMMs' shares (a run with that stage launched twice, minus
    // the plain run), and at 64 / 8192 tokens every stage's.
    const bool all_stages = T == 64 || T == 338 || T == 8192;
    for (int tile = 0; tile < kTiles; ++tile) {
      if (!tile_timed(tile, T) || !((sh.tiles >> tile) & 1)) continue;
      bool taken = true;
      auto run = [&](int repeat) {
        return time_graph(
            gpu,
            [&](int i) {
              taken = moe_grouped_probe(gpu, out, x, ids[idx(i)], wts[idx(i)], gu.lin, dn.lin, repeat, tile) && taken;
            },
            iters);
      };
      const double base = run(0);
      if (!taken) {  // a silent fallback would read as a slow regime
        std::printf("%-46s %5lld   not taken on this device\n", kTileNames[tile], static_cast<long long>(T));
        continue;
      }
      print_row(kTileNames[tile], T, base, flop, bytes);
      if (T < 8) continue;
      const char* names[5] = {"  + plan", "  + prepare", "  + gate_up gemm", "  + down gemm", "  + combine"};
      for (int s = 0; s < 5; ++s) {
        if (!all_stages && s != 2 && s != 3) continue;
        const double d = run(1 << s) - base;
        const double f = s == 2 ? flop * 2 / 3 : (s == 3 ? flop / 3 : 0.0);
        const double b = s == 2 ? bytes * 2 / 3 : (s == 3 ? bytes / 3 : 0.0);
        print_row(names[s], T, d, f, b);
      }
    }
  }
}

// The 122B-A10B and 35B-A3B expert shapes (256 experts, top-8; gate_up in 2 partitions): decode step
// sizes ("grouped decode": 4..512 tokens, 0.1..16 rows per expert: the per-pair GEMVs, the sliced small-N
// kernel and the medium tile, where the dispatch switches between them) and
// prefill sizes ("grouped moe").
void bench_grouped_decode(Backend& gpu) {
  const std::vector<int64_t> Ts = {4, 8, 16, 32, 64, 128, 192, 256, 338, 384, 512};
  bench_grouped_moe_shape(gpu, {"grouped decode nvfp4 w4a4 (35B: 256 x 8, 2048/512)", 2048, 512, Ts, 0x38});
  bench_grouped_moe_shape(gpu, {"grouped decode nvfp4 w4a4 (122B: 256 x 8, 3072/1024)", 3072, 1024, Ts, 0x38});
}
// The later turn of an agent session (a ~300-token prompt after a cached prefix) on the 35B: the op and
// the sliced kernel around 8-16 rows per expert, with gate and up input scales equal and distinct.
void bench_grouped_agent(Backend& gpu) {
  const std::vector<int64_t> Ts = {64, 256, 338, 384, 512};
  bench_grouped_moe_shape(gpu, {"grouped agent nvfp4 w4a4 (35B: 256 x 8, 2048/512)", 2048, 512, Ts, 0x30});
  bench_grouped_moe_shape(gpu, {"grouped agent nvfp4 w4a4 (35B, gate/up scales differ)", 2048, 512, Ts, 0x30, true});
}
// Decode batches of 16-64 tokens (0.5-2 rows per routed expert): the op, the per-pair GEMVs and the
// sliced kernel's two item sizes.
void bench_grouped_batch(Backend& gpu) {
  bench_grouped_moe_shape(gpu, {"grouped batch nvfp4 w4a4 (122B: 256 x 8, 3072/1024)", 3072, 1024, {12, 16, 32, 64}, 0x30, true});
  bench_grouped_moe_shape(gpu, {"grouped batch nvfp4 w4a4 (35B: 256 x 8, 2048/512)", 2048, 512, {16, 64}, 0x30, true});
}
void bench_grouped_moe(Backend& gpu) {
  bench_grouped_moe_shape(gpu, {"grouped moe nvfp4 w4a4 (35B: 256 x 8, 2048/512)", 2048, 512,
                                {256, 320, 512, 1024, 2048, 8192}});
  bench_grouped_moe_shape(gpu, {"grouped moe nvfp4 w4a4 (122B: 256 x 8, 3072/1024)", 3072, 1024,
                                {256, 512, 1024, 2048, 8192}});
}

// The medium regime (both wgmma tiles from 1,024 tokens, where the dispatch chooses between them)
// and the 8K large case only: a quick A/B of the wgmma kernel.
void bench_grouped_medium(Backend& gpu) {
  bench_grouped_moe_shape(gpu, {"grouped moe nvfp4 w4a4 (35B: 256 x 8, 2048/512)", 2048, 512, {320, 512, 1024, 2048}, 0xC});
  bench_grouped_moe_shape(gpu, {"grouped moe nvfp4 w4a4 (122B: 256 x 8, 3072/1024)", 3072, 1024, {512, 1024, 8192}, 0xC});
}

void bench_grouped_dense(Backend& gpu) {
  struct Dense {
    const char* name;
    int64_t N, K, P;
  };
  std::printf("%-46s %5s %10s %8s %9s %8s\n", "grouped dense nvfp4 w4a4 (all-NVFP4 122B)", "T", "us", "TFLOP/s",
              "MB read", "GB/s");
  for (const Dense& c : {Dense{"gdn in_proj_qkv 12288x3072", 12288, 3072, 1}, Dense{"gdn out_proj 3072x8192", 3072, 8192, 1},
                         Dense{"shared gate_up 2048x3072 P2", 2048, 3072, 2}}) {
    BenchLinear w = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1, c.N, c.K, c.P);
    for (int64_t T : {2, 8, 64, 512, 8192}) {
      Buffer x(&gpu, DType::kF32, {T, c.K}), out(&gpu, DType::kF32, {T, c.N});
      gpu.upload(x, random_x(T * c.K).data());
      const double flop = 2.0 * static_cast<double>(T) * static_cast<double>(c.N * c.K);
      const int iters = T <= 512 ? 32 : 4;
      const std::string name = std::string(c.name);
      print_row("op linear " + name, T, time_graph(gpu, [&](int) { gpu.linear(out, x, w.lin); }, iters), flop,
                w.bytes_per_expert);
      for (int tile = 0; tile < kTiles; ++tile) {
        bool taken = true;
        const double ms = time_graph(
            gpu, [&](int) { taken = grouped_linear_probe(gpu, out, x, w.lin, tile) && taken; }, iters);
        if (taken) print_row(std::string(kTileNames[tile] + 8) + " " + name, T, ms, flop, w.bytes_per_expert);
      }
    }
  }
}

// One plain call of each regime (no graph, no timing) for Nsight Compute to profile: the MoE at T = 64
// (small-N kernels) and T = 8192 (large-N), the dense in_proj_qkv at T = 8192.
void profile_grouped(Backend& gpu) {
  const int64_t E = 256, k = 8, H = 3072, I = 1024;
  BenchLinear gu = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, 2 * I, H, 2);
  BenchLinear dn = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, H, I, 1);
  for (int64_t T : {64, 8192}) {
    std::vector<int32_t> iv;
    std::vector<float> wv;
    random_routing(T, E, k, iv, wv);
    Buffer ids(&gpu, DType::kI32, {T, k}), wts(&gpu, DType::kF32, {T, k}), x(&gpu, DType::kF32, {T, H}),
        out(&gpu, DType::kF32, {T, H});
    gpu.upload(ids, iv.data());
    gpu.upload(wts, wv.data());
    gpu.upload(x, random_x(T * H).data());
    gpu.moe_experts(out, x, ids, wts, gu.lin, dn.lin);
    gpu.synchronize();
    std::printf("profiled grouped moe T=%lld\n", static_cast<long long>(T));
  }
  BenchLinear w = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1, 12288, 3072, 1);
  const int64_t T = 8192;
  Buffer x(&gpu, DType::kF32, {T, 3072}), out(&gpu, DType::kF32, {T, 12288});
  gpu.upload(x, random_x(T * 3072).data());
  gpu.linear(out, x, w.lin);
  gpu.synchronize();
  std::printf("profiled grouped dense qkv T=%lld\n", static_cast<long long>(T));
}

// One plain call of the 35B MoE at T = 338 (gate/up input scales distinct, as the synthetic model) for
// Nsight Compute.
void profile_grouped_agent(Backend& gpu) {
  const int64_t E = 256, k = 8, H = 2048, I = 512, T = 338;
  BenchLinear gu = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, 2 * I, H, 2);
  BenchLinear dn = make_linear(&gpu, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, E, H, I, 1);
  std::vector<float> is(static_cast<size_t>(E * 2));
  for (size_t i = 0; i < is.size(); ++i) is[i] = 448.0f * 6.0f / (i % 2 ? 10.0f : 8.0f);
  gpu.upload(gu.lin.input_scale, is.data());
  std::vector<int32_t> iv;
  std::vector<float> wv;
  random_routing(T, E, k, iv, wv);
  Buffer ids(&gpu, DType::kI32, {T, k}), wts(&gpu, DType::kF32, {T, k}), x(&gpu, DType::kF32, {T, H}),
      out(&gpu, DType::kF32, {T, H});
  gpu.upload(ids, iv.data());
  gpu.upload(wts, wv.data());
  gpu.upload(x, random_x(T * H).data());
  gpu.moe_experts(out, x, ids, wts, gu.lin, dn.lin);
  gpu.synchronize();
  std::printf("profiled grouped moe 35B T=%lld\n", static_cast<long long>(T));
}

const RegisterKernelBench kDecode("grouped decode", bench_grouped_decode);
const RegisterKernelBench kAgentProfile("moe agent profile", profile_grouped_agent);
const RegisterKernelBench kMoe("grouped moe", bench_grouped_moe);
const RegisterKernelBench kAgent("grouped agent", bench_grouped_agent);
const RegisterKernelBench kBatch("grouped batch", bench_grouped_batch);
const RegisterKernelBench kMedium("grouped medium", bench_grouped_medium);
const RegisterKernelBench kProfile("grouped profile", profile_grouped);
const RegisterKernelBench kDense("grouped dense", bench_grouped_dense);

}  // namespace
}  // namespace sparkserve
