// Shared pieces of gpu_ops (tests/gpu): the CPU-vs-CUDA harness, the error metric, result records,
// and a registry through which each op family's checks (one file per family: tests/gpu/*_checks.cpp)
// and kernel benchmarks join the run without editing ops_vs_cpu.cpp. Bounds and the metric are
// explained at the top of ops_vs_cpu.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/nvfp4.h"

namespace sparkserve {


inline constexpr double kExact = 0.0, kFp32 = 1e-5, kForms = 1e-4, kModel = 1e-4;
// NVFP4 W4A4 products on tensor cores (backend/cuda/nvfp4_group_*.cu: the routed experts above 8
// tokens, dense Linear at T >= 2; the predicates below follow backend/cuda/moe.cu's and linear.cu's
// dispatch): the products are exact (both operands exact in fp16), but the tensor
// core adds each k16 step's products into the fp32 accumulator with truncation, so the sum may lose
// up to ~1 ulp (2^-23) of the partial sum per step, always toward zero: at most K/16 x 1.2e-7 of the
// partial sums' magnitude, 2.3e-5 at K = 3072 and 6e-5 at K = 8192 when partial sums are as large as
// the output's maximum. A wrong scale, code or index is off by > 1e-3.
inline constexpr double kTensorCore = 1e-4;
inline bool tensor_core_w4a4_moe(const Linear& gate_up, int64_t T) {
  return is_nvfp4(gate_up.format) && gate_up.activation == ActivationQuant::kNvfp4 && T > 8;
}
inline bool tensor_core_w4a4_linear(const Linear& w, int64_t T) {
  return is_nvfp4(w.format) && w.activation == ActivationQuant::kNvfp4 && T >= 2;
}

struct Result {
  std::string group, name;
  double err, bound;
  bool pass;
};
inline std::vector<Result> g_results;

inline void record(const std::string& group, const std::string& name, double err, double bound) {
  const bool pass = std::isfinite(err) && err <= bound;
  g_results.push_back({group, name, err, bound, pass});
  std::printf("%-5s %-14s %-48s err %.3e  bound %.0e\n", pass ? "ok" : "FAIL", group.c_str(), name.c_str(), err,
              bound);
  std::fflush(stdout);
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!std::isfinite(got[i]) || std::isnan(d)) return INFINITY;
    md = std::max(md, d);
    mr = std::max(mr, std::fabs(static_cast<double>(ref[i])));
  }
  if (mr == 0) return md == 0 ? 0 : INFINITY;
  return md / mr;
}

inline std::mt19937_64 g_rng;

inline std::vector<float> randn(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g_rng);
  return v;
}

// A tensor living on both backends with the same contents.
struct Pair {
  Buffer c, g;
  DType dtype;
  std::vector<int64_t> shape;
  const Tensor& cpu() const { return c.tensor(); }
  const Tensor& gpu() const { return g.tensor(); }
};

struct Harness {
  Backend* cpu;
  Backend* gpu;

  Pair make(DType dt, std::vector<int64_t> shape, const void* host) {
    Pair p{Buffer(cpu, dt, shape), Buffer(gpu, dt, shape), dt, shape};
    if (host) {
      cpu->upload(p.cpu(), host);
      gpu->upload(p.gpu(), host);
    } else {
      // Poison: outputs start as NaN on the GPU side, so an unwritten element fails the check.
      std::vector<float> nan(static_cast<size_t>(p.cpu().nbytes() / 4 + 1), NAN);
      cpu->fill_zero(p.cpu());
      gpu->upload(p.gpu(), nan.data());
    }
    return p;
  }
  Pair f32(std::vector<int64_t> shape, const std::vector<float>& v) { return make(DType::kF32, std::move(shape), v.data()); }
  Pair out(std::vector<int64_t> shape) { return make(DType::kF32, std::move(shape), nullptr); }
  Pair i32(std::vector<int64_t> shape, const std::vector<int32_t>& v) { return make(DType::kI32, std::move(shape), v.data()); }

  std::vector<float> get(Backend* b, const Tensor& t) {
    std::vector<float> v(t.nbytes() / 4);
    b->download(v.data(), t);
    return v;
  }
  std::vector<float> gpu_f(const Pair& p) { return get(gpu, p.gpu()); }
  std::vector<float> cpu_f(const Pair& p) { return get(cpu, p.cpu()); }
  double err(const Pair& p) { return rel_err(gpu_f(p), cpu_f(p)); }
};

// A matrix weight in f32 or bf16 (values rounded to bf16 either way when bf16).
struct Weight {
  Pair p;
  Linear cpu_lin, gpu_lin;
};
inline Weight make_weight(Harness& h, std::vector<int64_t> shape, bool bf16, float scale) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto v = randn(n, scale);
  Weight w;
  if (bf16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    w.p = h.make(DType::kBF16, shape, b.data());
  } else {
    w.p = h.make(DType::kF32, shape, v.data());
  }
  for (Linear* l : {&w.cpu_lin, &w.gpu_lin}) {
    l->format = bf16 ? WeightFormat::kBf16 : WeightFormat::kF32;
    l->out_features = shape[shape.size() - 2];
    l->in_features = shape.back();
  }
  w.cpu_lin.weight = w.p.cpu();
  w.gpu_lin.weight = w.p.gpu();
  return w;
}

// A quantized Linear [E, N, K] with `parts` partitions, each (expert, partition) block quantized on
// its own as compressed-tensors does (own global scale), the same bytes on both backends.
struct QWeight {
  Pair w, ws, gs, is;
  Linear cpu_lin, gpu_lin;
};
inline QWeight make_qweight(Harness& h, int64_t E, int64_t N, int64_t K, int64_t parts, WeightFormat fmt,
                            ActivationQuant act, float x_amax) {
  const int64_t Np = N / parts;
  const bool nvfp4 = is_nvfp4(fmt);
  std::vector<uint8_t> codes, scales8;
  std::vector<float> scales32, gsv, isv;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p = 0; p < parts; ++p) {
      // Different magnitudes per block so the per-partition scales matter.
      auto v = randn(Np * K, (1.0f + static_cast<float>(p + e % 3)) / std::sqrt(static_cast<float>(K)));
      if (nvfp4) {
        auto q = nvfp4_quantize_weight(v.data(), Np, K);
        codes.insert(codes.end(), q.packed.begin(), q.packed.end());
        scales8.insert(scales8.end(), q.scales.begin(), q.scales.end());
        const bool mo = fmt == WeightFormat::kNvfp4ModelOpt;
        gsv.push_back(mo ? 1.0f / q.global_scale : q.global_scale);
        const float igs = 448.0f * 6.0f / (x_amax * (1.0f + 0.25f * static_cast<float>(p)));
        isv.push_back(mo ? 1.0f / igs : igs);
      } else {
        const bool channel = fmt == WeightFormat::kFp8Channel;
        auto q = fp8_quantize_weight(v.data(), Np, K, channel, true);
        codes.insert(codes.end(), q.q.begin(), q.q.end());
        for (int64_t n = 0; n < Np; ++n) scales32.push_back(q.scales[channel ? static_cast<size_t>(n) : 0]);
        isv.push_back(x_amax / 448.0f * (1.0f + 0.25f * static_cast<float>(p)));
        gsv.push_back(1.0f);
      }
    }
  QWeight w;
  if (nvfp4) {
    w.w = h.make(DType::kU8, {E, N, K / 2}, codes.data());
    w.ws = h.make(DType::kF8E4M3, {E, N, K / 16}, scales8.data());
    w.gs = h.make(DType::kF32, {E, parts}, gsv.data());
  } else {
    w.w = h.make(DType::kF8E4M3, {E, N, K}, codes.data());
    w.ws = h.make(DType::kF32, {E, N}, scales32.data());
  }
  w.is = h.make(DType::kF32, {E, parts}, isv.data());
  for (int side = 0; side < 2; ++side) {
    Linear& l = side == 0 ? w.cpu_lin : w.gpu_lin;
    l.format = fmt;
    l.activation = act;
    l.out_features = N;
    l.in_features = K;
    l.partitions = parts;
    l.weight = side == 0 ? w.w.cpu() : w.w.gpu();
    l.weight_scale = side == 0 ? w.ws.cpu() : w.ws.gpu();
    if (nvfp4) l.global_scale = side == 0 ? w.gs.cpu() : w.gs.gpu();
    if (act != ActivationQuant::kNone) l.input_scale = side == 0 ? w.is.cpu() : w.is.gpu();
  }
  return w;
}

// Per-token error of an MoE output whose down input is re-quantized (W4A4 / W8A8): the two backends
// compute silu(gate)*up in different f32 orders (~1e-6 apart after a K = 3072 sum), so an element
// that close to a rounding threshold takes the neighbouring code on one side (measured ~1-2% of
// tokens at the 122B shapes), moving that token's output by one code step of one input (observed
// 5e-4 .. 1.4e-3 of max|ref|; a block-scale step moves 16 inputs), while a formula or indexing error
// moves every token by O(0.1-1). So err_t = max|d| over token t's row / max|ref|; tokens over
// `threshold` (the path's own bound: kFp32 or kTensorCore) are "flipped" and counted. Bounds: every
// token <= kFlippedTokenErr, flipped tokens <= flipped_tokens_bound(T).
inline constexpr double kFlippedTokenErr = 2e-2;
inline double flipped_tokens_bound(int64_t T) { return static_cast<double>(std::max<int64_t>(2, T / 4)); }
inline std::pair<double, int> token_errors(Harness& h, const Pair& o, int64_t T, int64_t H, double threshold) {
  const auto g = h.gpu_f(o), r = h.cpu_f(o);
  double mr = 0, worst = 0;
  for (float v : r) mr = std::max(mr, std::fabs(static_cast<double>(v)));
  int flipped = 0;
  for (int64_t t = 0; t < T; ++t) {
    double d = 0;
    for (int64_t i = 0; i < H; ++i) {
      const size_t j = static_cast<size_t>(t * H + i);
      const double dd = std::fabs(static_cast<double>(g[j]) - r[j]);
      d = std::max(d, std::isfinite(dd) ? dd : INFINITY);
    }
    const double et = mr > 0 ? d / mr : INFINITY;
    worst = std::max(worst, et);
    flipped += et > threshold;
  }
  return {worst, flipped};
}

inline std::string sz(std::initializer_list<int64_t> dims) {
  std::string s;
  for (auto d : dims) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

// Spans (start_pos, num_tokens) with shuffled KV blocks and GDN slots: row order = span order, each
// span's blocks cover its positions [0, start + len).
struct Spans {
  BatchLayout layout;
  std::vector<std::vector<int32_t>> tables;
};
inline Spans make_spans(const std::vector<std::array<int64_t, 2>>& starts_and_lens, int64_t block_size,
                 int32_t num_blocks, int32_t num_slots) {
  Spans s;
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), g_rng);
  std::vector<int32_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g_rng);
  size_t next = 0;
  int64_t row = 0;
  s.tables.resize(starts_and_lens.size());
  for (size_t i = 0; i < starts_and_lens.size(); ++i) {
    const auto [start, len] = starts_and_lens[i];
    const int64_t nb = (start + len + block_size - 1) / block_size;
    for (int64_t b = 0; b < nb; ++b) s.tables[i].push_back(blocks.at(next++));
  }
  for (size_t i = 0; i < starts_and_lens.size(); ++i) {
    SeqSpan sp;
    sp.row_begin = row;
    sp.num_tokens = starts_and_lens[i][1];
    sp.start_pos = starts_and_lens[i][0];
    sp.gdn_slot = slots.at(i);
    sp.block_table = s.tables[i].data();
    sp.num_blocks = static_cast<int64_t>(s.tables[i].size());
    row += sp.num_tokens;
    s.layout.seqs.push_back(sp);
  }
  s.layout.total_rows = row;
  return s;
}

// ---- registries ---------------------------------------------------------------------------------
// A group of op checks: gpu_ops runs every registered group (in registration order within a file;
// files in link order) after the built-in ones; `--only SUBSTR` runs the groups whose name holds it.
struct OpCheckGroup {
  std::string name;
  std::function<void(Harness&)> run;
};
inline std::vector<OpCheckGroup>& op_check_groups() {
  static std::vector<OpCheckGroup> groups;
  return groups;
}
// A kernel benchmark case for `gpu_ops --bench-kernels [--bench-filter SUBSTR]`, run after the
// built-in cases; it prints its own lines.
struct KernelBench {
  std::string name;
  std::function<void(Backend& gpu)> run;
};
inline std::vector<KernelBench>& kernel_benches() {
  static std::vector<KernelBench> benches;
  return benches;
}
struct RegisterOpChecks {
  RegisterOpChecks(std::string name, std::function<void(Harness&)> fn) {
    op_check_groups().push_back({std::move(name), std::move(fn)});
  }
};
struct RegisterKernelBench {
  RegisterKernelBench(std::string name, std::function<void(Backend&)> fn) {
    kernel_benches().push_back({std::move(name), std::move(fn)});
  }
};

// B single-token decode spans (row s, position 7 + s) on shuffled GDN slots of `slots` (> B: the
// rest belong to no span).
inline BatchLayout single_token_spans(int64_t B, int64_t slots) {
  std::vector<int32_t> slot_ids(static_cast<size_t>(slots));
  std::iota(slot_ids.begin(), slot_ids.end(), 0);
  std::shuffle(slot_ids.begin(), slot_ids.end(), g_rng);
  BatchLayout L;
  for (int64_t s = 0; s < B; ++s) {
    SeqSpan sp;
    sp.row_begin = s;
    sp.num_tokens = 1;
    sp.start_pos = 7 + s;
    sp.gdn_slot = slot_ids[static_cast<size_t>(s)];
    L.seqs.push_back(sp);
  }
  L.total_rows = B;
  return L;
}

}  // namespace sparkserve
