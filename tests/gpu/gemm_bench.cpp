// gpu_ops --bench-kernels cases of the dense matmul regimes (--bench-filter gemm), at the
// Qwen3.5-122B-A10B and 35B-A3B shapes, every path through linear_probe (backend/cuda/linear_probe.h):
// - "gemm fp8 prefill": the W8A8 GEMM at T = 128, 330 (a served agent turn), 512, 2048, 8192 (M =
//   8192, N = 12288, K = 3072 is in_proj_qkv): TFLOP/s with the activation quantization, the scaling
//   and (cuBLASLt route) the weights' f16 conversion included, for the dispatch, the sm_90a wgmma
//   kernel, the cuBLASLt route and (T <= 512) the small-N kernel in pieces of 64 tokens (the
//   fallback); the quantization alone;
// - "gemm fp8 tiles": the wgmma kernel with each tile shape and K split forced;
// - "gemm small-N": T = 2..64 tokens (batched decode, speculative verify) and 96: the one-kernel
//   few-token path (T <= 4), the mma.sync small-N kernel, the sm_90a wgmma kernel's small-T tile and
//   the dispatch, µs and weight bytes per second against the measured copy bandwidth (the floor);
// - "gemm small-T tile": the wgmma kernel's small-T tile with each K split forced;
// - "gemm bf16": router / lm_head: SIMT or GEMV vs the split-bf16 tensor-core GEMM;
// - "gemm codes": batched decode at the 122B's shapes, T = 5..64: fp8_small_n.cu with its plan and
//   each K split forced, the wgmma tile, the dispatch; the GDN in_proj pair and the shared expert,
//   one op at a time against the ops that share the activation codes (linears, gated_mlp).
// Method as bench_kernels.cpp: ops captured into a CUDA graph and replayed, median of 5; weights
// rotated over >= 512 MB of copies where the weight stream is what is measured.
#include <algorithm>
#include <cstdio>
#include <map>
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
// The 35B-A3B's (hidden 2048): qkv / z / out_proj, attention q / k (= v) / o, shared gate_up / down.
const Shape kFp8Shapes35[] = {
    {"35B qkv 8192x2048", 8192, 2048, 1},         {"35B z 4096x2048", 4096, 2048, 1},
    {"35B out_proj 2048x4096", 2048, 4096, 1},    {"35B attn q 8192x2048", 8192, 2048, 1},
    {"35B attn k 512x2048", 512, 2048, 1},        {"35B attn o 2048x4096", 2048, 4096, 1},
    {"35B shared gate_up 1024x2048", 1024, 2048, 2}, {"35B shared down 2048x512", 2048, 512, 1},
};
const int64_t kPrefillTokens[] = {128, 330, 512, 2048, 8192};

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
double time_path(Backend& g, const Tensor& out, const Tensor& x, std::vector<BenchLinear>& ws, int copies,
                 LinearPath path, int iters) {
  if (!linear_probe(g, out, x, ws[0].lin, path)) return -1;
  return time_graph(g, [&](int i) { linear_probe(g, out, x, ws[static_cast<size_t>(i % copies)].lin, path); }, iters);
}
double time_path(Backend& g, const Tensor& out, const Tensor& x, std::vector<BenchLinear>& ws, LinearPath path,
                 int iters) {
  return time_path(g, out, x, ws, static_cast<int>(ws.size()), path, iters);
}

std::vector<BenchLinear> weight_copies(Backend& g, WeightFormat fmt, ActivationQuant act, int64_t N, int64_t K,
                                       int64_t P, double bytes, int most) {
  const int copies = static_cast<int>(std::clamp(512e6 / bytes, 1.0, static_cast<double>(most)));
  std::vector<BenchLinear> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(make_linear(&g, fmt, act, 1, N, K, P));
  return ws;
}

// Weight copies rotated where the weight stream matters (T <= 512: a served turn's prefill reads
// its weights from HBM, not from L2); the first copy alone where the MMAs dominate.
int prefill_copies(int64_t T, const std::vector<BenchLinear>& ws) { return T <= 512 ? static_cast<int>(ws.size()) : 1; }

// Random activations per [T, K], drawn once per benchmark (the host's normal draws are slow at 8K x 8K).
struct XCache {
  Backend& g;
  std::map<std::pair<int64_t, int64_t>, Buffer> m;
  const Tensor& get(int64_t T, int64_t K) {
    auto it = m.find({T, K});
    if (it == m.end()) it = m.emplace(std::pair{T, K}, random_x(g, T, K)).first;
    return it->second;
  }
};

// FP8 weights of a shape and copies of them on the device (rotation defeats L2, not the values:
// the host draws the random bytes once).
std::vector<BenchLinear> prefill_weights(Backend& g, const Shape& s, int most) {
  std::vector<BenchLinear> ws;
  ws.push_back(make_linear(&g, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 1, s.N, s.K, s.P));
  const int copies = static_cast<int>(std::clamp(512e6 / static_cast<double>(s.N * s.K), 1.0, static_cast<double>(most)));
  for (int i = 1; i < copies; ++i) {
    BenchLinear c;
    c.lin = ws[0].lin;
    c.bytes_per_expert = ws[0].bytes_per_expert;
    for (const Buffer& b : ws[0].keep) {
      c.keep.emplace_back(&g, b.tensor().dtype, b.tensor().shape);
      g.copy(c.keep.back(), b);
    }
    c.lin.weight = c.keep[0].tensor();
    c.lin.weight_scale = c.keep[1].tensor();
    c.lin.input_scale = c.keep[2].tensor();
    ws.push_back(std::move(c));
  }
  return ws;
}

std::vector<Shape> prefill_shapes() {
  std::vector<Shape> shapes(std::begin(kFp8Shapes), std::end(kFp8Shapes));
  shapes.insert(shapes.end(), std::begin(kFp8Shapes35), std::end(kFp8Shapes35));
  return shapes;
}

void bench_fp8_prefill(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- W8A8 GEMM, TFLOP/s including quantization, conversion and scaling\n");
  const std::pair<LinearPath, const char*> paths[] = {{LinearPath::kDispatch, "dispatch"},
                                                      {LinearPath::kFp8Wgmma, "wgmma"},
                                                      {LinearPath::kFp8Gemm, "gemm-f16"},
                                                      {LinearPath::kFp8SmallN, "small-n x64"}};
  XCache xs{g, {}};
  for (const Shape& s : prefill_shapes()) {
    auto ws = prefill_weights(g, s, 16);
    for (int64_t T : kPrefillTokens) {
      const Tensor& x = xs.get(T, s.K);
      Buffer out(&g, DType::kF32, {T, s.N});
      const double flop = 2.0 * T * s.N * s.K, bytes = static_cast<double>(s.N * s.K);
      const int copies = prefill_copies(T, ws);
      for (auto [path, name] : paths) {
        if (path == LinearPath::kFp8SmallN && T > 512) continue;  // the fallback: its crossover is far below
        const double ms = time_path(g, out, x, ws, copies, path, std::max(T >= 2048 ? 4 : 8, copies));
        if (ms < 0) std::printf("%-32s %5lld %-12s not taken\n", s.name, static_cast<long long>(T), name);
        else print_row(s.name, T, name, ms, flop, bytes, copy);
      }
      if (s.N == 12288 && T == 8192) {  // the quantization alone, part of every figure above
        Buffer values(&g, DType::kF16, {T, s.K}), scales(&g, DType::kF32, {T});
        for (const bool wgmma_order : {false, true}) {
          const double ms = time_graph(g, [&](int) { fp8_quantize_probe(g, values, scales, x, wgmma_order); }, 8);
          print_row(wgmma_order ? "fp8 quantize 8192x3072 wgmma order" : "fp8 quantize 8192x3072 (f16)", T,
                    "quantize", ms, 0, static_cast<double>(T * s.K) * 6.0, copy);
        }
      }
    }
  }
}

// The wgmma kernel with each tile shape (0: 256 weight rows x 128 tokens, 1: 128 x 128) and K split
// forced: the data behind its own choice (fp8_gemm_wgmma.cu plan_for).
void bench_fp8_tiles(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- W8A8 wgmma kernel per tile shape and K split\n");
  XCache xs{g, {}};
  for (const Shape& s : prefill_shapes()) {
    auto ws = prefill_weights(g, s, 16);
    for (int64_t T : kPrefillTokens) {
      const Tensor& x = xs.get(T, s.K);
      Buffer out(&g, DType::kF32, {T, s.N});
      const double flop = 2.0 * T * s.N * s.K, bytes = static_cast<double>(s.N * s.K);
      const int copies = prefill_copies(T, ws);
      for (int tile = 0; tile < 2; ++tile)
        for (int splits : T >= 2048 ? std::vector<int>{1} : std::vector<int>{1, 2, 4}) {
          if (!fp8_wgmma_probe(g, out, x, ws[0].lin, tile, splits)) return;
          const double ms = time_graph(
              g, [&](int i) { fp8_wgmma_probe(g, out, x, ws[static_cast<size_t>(i % copies)].lin, tile, splits); },
              std::max(T >= 2048 ? 4 : 8, copies));
          const std::string name = "tile " + std::to_string(tile) + " s" + std::to_string(splits);
          print_row(s.name, T, name.c_str(), ms, flop, bytes, copy);
        }
    }
  }
}

// The small-T regime (batched decode, speculative verify) at both models' shapes, T = 2..64 and
// one step past it (96: the prefill tiles): the few-token kernel ("few-tokens", T <= 4), the
// mma.sync kernel ("small-n", in pieces of 64 past 64), the sm_90a wgmma kernel with its own plan ("wgmma") and linear's choice, µs and weight
// bytes per second against the measured copy bandwidth (the floor).
void bench_small_n(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- small N: mma.sync small-N kernel vs wgmma small-T tile (GB/s of weights; floor: copy %.0f GB/s)\n",
              copy);
  XCache xs{g, {}};
  for (const Shape& s : prefill_shapes()) {
    const double bytes = static_cast<double>(s.N) * (s.K + 4);
    auto ws = prefill_weights(g, s, 64);
    for (int64_t T : {2, 3, 4, 8, 16, 32, 48, 64, 96}) {
      const Tensor& x = xs.get(T, s.K);
      Buffer out(&g, DType::kF32, {T, s.N});
      const int iters = std::max<int>(static_cast<int>(ws.size()), 8);
      for (auto [path, name] : {std::pair{LinearPath::kFp8FewTokens, "few-tokens"}, {LinearPath::kFp8SmallN, "small-n"},
                                {LinearPath::kFp8Wgmma, "wgmma"}, {LinearPath::kDispatch, "dispatch"}}) {
        const double ms = time_path(g, out, x, ws, path, iters);
        if (ms >= 0) print_row(s.name, T, name, ms, 2.0 * T * s.N * s.K, bytes, copy);
      }
    }
  }
}

// The wgmma kernel's small-T tile (2: 128 weight rows x 64 tokens) with each K split forced: the
// data behind plan_small (fp8_gemm_wgmma.cu).
void bench_small_n_tiles(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- W8A8 wgmma small-T tile per K split\n");
  XCache xs{g, {}};
  for (const Shape& s : prefill_shapes()) {
    const double bytes = static_cast<double>(s.N) * (s.K + 4);
    auto ws = prefill_weights(g, s, 64);
    const int copies = static_cast<int>(ws.size());
    for (int64_t T : {4, 16, 64}) {
      const Tensor& x = xs.get(T, s.K);
      Buffer out(&g, DType::kF32, {T, s.N});
      const int tile = 2;
      for (int splits : {1, 2, 3, 4, 6, 8, 12, 16}) {
        if (!fp8_wgmma_probe(g, out, x, ws[0].lin, tile, splits)) return;
        const double ms = time_graph(
            g, [&](int i) { fp8_wgmma_probe(g, out, x, ws[static_cast<size_t>(i % copies)].lin, tile, splits); },
            std::max(copies, 8));
        const std::string name = "tile " + std::to_string(tile) + " s" + std::to_string(splits);
        print_row(s.name, T, name.c_str(), ms, 2.0 * T * s.N * s.K, bytes, copy);
      }
    }
  }
}

// Batched decode at the 122B's shapes, T = 5..64 (--bench-filter "gemm codes"): one linear through
// fp8_small_n.cu (quantize + one kernel, K splits added in a cluster) with its plan and with each K
// split forced, the wgmma small-T tile and the dispatch; then the GDN in_proj pair (qkv and z of one
// input: branches of linear against linears, which quantizes once) and the shared expert (linear,
// silu_mul, linear against gated_mlp). Weights rotated over >= 512 MB: their stream is measured.
void bench_codes(Backend& g) {
  const double copy = copy_bandwidth(g);
  std::printf("-- batched decode W8A8 (122B shapes): us per call (GB/s of weights; floor: copy %.0f GB/s)\n", copy);
  const int64_t Ts[] = {5, 8, 16, 32, 64};
  XCache xs{g, {}};
  for (const Shape& s : kFp8Shapes) {
    const double bytes = static_cast<double>(s.N) * (s.K + 4);
    auto ws = prefill_weights(g, s, 64);
    const int copies = static_cast<int>(ws.size()), iters = std::max(copies, 8);
    for (int64_t T : Ts) {
      const Tensor& x = xs.get(T, s.K);
      Buffer out(&g, DType::kF32, {T, s.N});
      const std::string plan = "small-n s" + std::to_string(fp8_small_n_plan_splits(g, T, ws[0].lin));
      for (auto [path, name] : {std::pair{LinearPath::kFp8SmallN, plan.c_str()}, {LinearPath::kFp8Wgmma, "wgmma"},
                                {LinearPath::kDispatch, "dispatch"}}) {
        const double ms = time_path(g, out, x, ws, path, iters);
        if (ms >= 0) print_row(s.name, T, name, ms, 2.0 * T * s.N * s.K, bytes, copy);
      }
      if (T > 16) continue;
      for (int splits : {1, 2, 4, 6, 8, 12, 16}) {
        if (!fp8_small_n_probe(g, out, x, ws[0].lin, splits)) continue;
        const double ms = time_graph(
            g, [&](int i) { fp8_small_n_probe(g, out, x, ws[static_cast<size_t>(i % copies)].lin, splits); }, iters);
        const std::string name = "forced s" + std::to_string(splits);
        print_row(s.name, T, name.c_str(), ms, 2.0 * T * s.N * s.K, bytes, copy);
      }
    }
  }
  const auto fp8 = WeightFormat::kFp8Channel;
  const auto dyn = ActivationQuant::kFp8TokenDynamic;
  {
    const int copies = 8;  // 8 x 63 MB
    std::vector<BenchLinear> qkv, z;
    for (int i = 0; i < copies; ++i) {
      qkv.push_back(make_linear(&g, fp8, dyn, 1, 12288, 3072, 1));
      z.push_back(make_linear(&g, fp8, dyn, 1, 8192, 3072, 1));
    }
    for (int64_t T : Ts) {
      const Tensor& x = xs.get(T, 3072);
      Buffer mo(&g, DType::kF32, {T, 12288}), zo(&g, DType::kF32, {T, 8192});
      auto at = [&](int i) { return static_cast<size_t>(i % copies); };
      const double branches_ms = time_graph(g, [&](int i) {
        g.run_branches({[&] { g.linear(mo, x, qkv[at(i)].lin); }, [&] { g.linear(zo, x, z[at(i)].lin); }});
      }, 16);
      const double fused_ms = time_graph(g, [&](int i) { g.linears({mo, zo}, x, {&qkv[at(i)].lin, &z[at(i)].lin}); }, 16);
      std::printf("%-32s %5lld branches of linear %8.2f us, linears %8.2f us\n", "122B in_proj qkv + z",
                  static_cast<long long>(T), branches_ms * 1e3, fused_ms * 1e3);
    }
  }
  {
    const int copies = 16;  // 16 x 9.4 MB
    std::vector<BenchLinear> gu, dn;
    for (int i = 0; i < copies; ++i) {
      gu.push_back(make_linear(&g, fp8, dyn, 1, 2048, 3072, 2));
      dn.push_back(make_linear(&g, fp8, dyn, 1, 3072, 1024, 1));
    }
    for (int64_t T : Ts) {
      const Tensor& x = xs.get(T, 3072);
      Buffer gup(&g, DType::kF32, {T, 2048}), act(&g, DType::kF32, {T, 1024}), out(&g, DType::kF32, {T, 3072});
      auto at = [&](int i) { return static_cast<size_t>(i % copies); };
      const double chain_ms = time_graph(g, [&](int i) {
        g.linear(gup, x, gu[at(i)].lin);
        g.silu_mul(act, gup);
        g.linear(out, act, dn[at(i)].lin);
      }, 16);
      const double fused_ms = time_graph(g, [&](int i) { g.gated_mlp(out, x, gu[at(i)].lin, dn[at(i)].lin); }, 16);
      std::printf("%-32s %5lld chain of linear %8.2f us, gated_mlp %8.2f us\n", "122B shared expert",
                  static_cast<long long>(T), chain_ms * 1e3, fused_ms * 1e3);
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
  for (const Case& c : {Case{"router 256x3072", 256, 3072, {2, 4, 8, 16, 64, 338, 512, 1024, 2048, 8192}},
                        Case{"router 256x2048", 256, 2048, {4, 16, 64, 338, 2048}},
                        Case{"in_proj_a 32x2048", 32, 2048, {4, 16, 64, 338, 2048}},
                        Case{"lm_head 248320x3072", 248320, 3072, {2, 4, 8, 16, 32, 64, 512}}}) {
    const double bytes = static_cast<double>(c.N * c.K) * 2;
    auto ws = weight_copies(g, WeightFormat::kBf16, ActivationQuant::kNone, c.N, c.K, 1, bytes, 64);
    for (int64_t T : c.Ts) {
      Buffer x = random_x(g, T, c.K), out(&g, DType::kF32, {T, c.N});
      const int iters = std::max<int>(static_cast<int>(ws.size()), 4);
      for (auto [path, name] : {std::pair{LinearPath::kGemv, "gemv"}, {LinearPath::kSimt, "simt"},
                                {LinearPath::kBf16Split, "split-bf16"}, {LinearPath::kBf16SmallN, "small-n"},
                                {LinearPath::kDispatch, "dispatch"}}) {
        if (path == LinearPath::kSimt && T * c.N > int64_t{64} * 248320) continue;  // minutes on CUDA cores
        const double ms = time_path(g, out, x, ws, path, iters);
        if (ms >= 0) print_row(c.name, T, name, ms, 2.0 * T * c.N * c.K, bytes, copy);
      }
    }
  }
}

RegisterKernelBench reg_prefill("gemm fp8 prefill", bench_fp8_prefill);
RegisterKernelBench reg_tiles("gemm fp8 tiles", bench_fp8_tiles);
RegisterKernelBench reg_small("gemm small-N", bench_small_n);
RegisterKernelBench reg_small_tiles("gemm small-T tile", bench_small_n_tiles);
RegisterKernelBench reg_bf16("gemm bf16", bench_bf16);
RegisterKernelBench reg_codes("gemm codes", bench_codes);

}  // namespace
}  // namespace sparkserve
