// gpu_ops groups "moe_grouped_small" / "moe_grouped_large": the tensor-core NVFP4 W4A4 paths
// (backend/cuda/moe_grouped.cu and nvfp4_group_*.cu: routed experts above 16 tokens, dense Linear at
// T >= 2; every regime also forced) and the dispatch around them vs the CPU backend on
// fresh random inputs. Bounds (gpu_harness.h): kTensorCore for outputs that are not re-quantized;
// token_errors with the kTensorCore threshold for MoE outputs, whose down input is re-quantized.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_harness.h"

namespace sparkserve {

// backend/cuda/moe_grouped.cu (a header for nvcc-built files): the grouped MoE / dense path with the
// tile regime forced (GroupTile's order: 0 small-N, 1 large-N mma.sync, 2 large-N wgmma, 3 medium-N
// wgmma, 4 small-N sliced); false when not taken here.
bool moe_grouped_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                       const Linear& gate_up, const Linear& down, int repeat, int force_tile);
bool grouped_linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int force_tile);
// backend/cuda/moe_grouped.cu: floats in [-6, 6] where the kernels' E2M1 rounding (e2m1_round) differs
// from the CPU's threshold table (bit patterns, sign of zero included); -1 without the CUDA backend.
int64_t e2m1_round_mismatches_probe(Backend& b);

namespace {

constexpr int kTiles = 6;
const char* const kTileNames[kTiles] = {"small-N", "large-N mma.sync", "large-N wgmma", "medium-N wgmma",
                                        "small-N sliced", "small-N sliced half"};
constexpr int kLargeMmaSync = 1, kSliced = 4;

// k distinct experts per token drawn with skewed popularity (expert e weighs 1/(1+e)^0.7: weighted
// sampling without replacement by exponential keys), so some experts get many tokens, several
// tiles of them, and some none; routing weights uniform in [0.05, 1], normalised to sum 1. hot >= 0:
// that expert is in every token's list as well (one expert with T rows).
void random_routing(int64_t T, int64_t E, int64_t k, std::vector<int32_t>& ids, std::vector<float>& wts,
                    int32_t hot = -1) {
  std::uniform_real_distribution<double> u(1e-12, 1.0);
  std::uniform_real_distribution<float> wu(0.05f, 1.0f);
  std::vector<double> key(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e)
      key[static_cast<size_t>(e)] = e == hot ? -1.0 : -std::log(u(g_rng)) * std::pow(1.0 + static_cast<double>(e), 0.7);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)]; });
    float sum = 0;
    std::vector<float> w(static_cast<size_t>(k));
    for (auto& v : w) sum += (v = wu(g_rng));
    for (int64_t j = 0; j < k; ++j) {
      ids.push_back(order[static_cast<size_t>(j)]);
      wts.push_back(w[static_cast<size_t>(j)] / sum);
    }
  }
}

// Gives every partition of every expert partition 0's input scale (as a checkpoint whose gate_proj
// and up_proj saw the same calibration inputs): the kernels then share one activation operand.
void share_input_scales(Harness& h, QWeight& w, int64_t E, int64_t P) {
  std::vector<float> v = h.cpu_f(w.is);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p = 1; p < P; ++p) v[static_cast<size_t>(e * P + p)] = v[static_cast<size_t>(e * P)];
  h.cpu->upload(w.is.cpu(), v.data());
  h.gpu->upload(w.is.gpu(), v.data());
}

struct MoeCase {
  WeightFormat fmt;
  const char* name;
  int64_t T, E, k, H, I, P;  // P: gate_up partitions (1: gate and up share one input scale)
  bool shared_scale = false;  // P = 2 with equal gate / up input scales
  int32_t hot = -1;           // an expert every token routes to
};

void check_moe_experts(Harness& h, const MoeCase& c) {
  QWeight gu = make_qweight(h, c.E, 2 * c.I, c.H, c.P, c.fmt, ActivationQuant::kNvfp4, 4.0f);
  QWeight dn = make_qweight(h, c.E, c.H, c.I, 1, c.fmt, ActivationQuant::kNvfp4, 1.0f);
  if (c.shared_scale) share_input_scales(h, gu, c.E, c.P);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  random_routing(c.T, c.E, c.k, ids, wts, c.hot);
  Pair x = h.f32({c.T, c.H}, randn(c.T * c.H)), id = h.i32({c.T, c.k}, ids), wt = h.f32({c.T, c.k}, wts),
       o = h.out({c.T, c.H});
  h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
  h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
  const std::string name = std::string(c.name) + (c.shared_scale ? " one input scale" : "") +
                           (c.hot >= 0 ? " hot expert" : "") + " TxExkxHxIxP " + sz({c.T, c.E, c.k, c.H, c.I, c.P});
  const auto [worst, flipped] = token_errors(h, o, c.T, c.H, kTensorCore);
  record("moe_grouped", name + " all tokens", worst, kFlippedTokenErr);
  record("moe_grouped", name + " tokens > 1e-4", flipped, flipped_tokens_bound(c.T));
  {  // deterministic: the same inputs give the same bits
    Pair o2 = h.out({c.T, c.H});
    h.gpu->moe_experts(o2.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
    record("moe_grouped", name + " rerun differs", h.gpu_f(o2) == h.gpu_f(o) ? 0.0 : 1.0, kExact);
    // Every regime this device runs, forced, against the same CPU reference (the dispatch picks one).
    const std::vector<float> ref = h.cpu_f(o);
    for (int tile = 0; tile < kTiles; ++tile) {
      Pair o3 = h.out({c.T, c.H});
      h.cpu->upload(o3.cpu(), ref.data());
      if (!moe_grouped_probe(*h.gpu, o3.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin, 0, tile)) continue;
      const auto [w3, f3] = token_errors(h, o3, c.T, c.H, kTensorCore);
      record("moe_grouped", name + " " + kTileNames[tile] + " all tokens", w3, kFlippedTokenErr);
      record("moe_grouped", name + " " + kTileNames[tile] + " tokens > 1e-4", f3, flipped_tokens_bound(c.T));
    }
  }
}

// moe_route_experts: routing on the device (fused into the plan block for T <= 64, the route kernel
// before it above), ids bit-identical to the CPU's, weights kFp32, outputs per token.
void check_route_experts(Harness& h, int64_t T, int64_t H, int64_t I) {
  const int64_t E = 24, k = 8;
  QWeight gu = make_qweight(h, E, 2 * I, H, 2, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 4.0f);
  QWeight dn = make_qweight(h, E, H, I, 1, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1.0f);
  Pair x = h.f32({T, H}, randn(T * H)), lg = h.f32({T, E}, randn(T * E, 2.0f)), o = h.out({T, H}),
       wt = h.out({T, k}), id = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
  h.cpu->moe_route_experts(o.cpu(), wt.cpu(), id.cpu(), lg.cpu(), x.cpu(), gu.cpu_lin, dn.cpu_lin);
  h.gpu->moe_route_experts(o.gpu(), wt.gpu(), id.gpu(), lg.gpu(), x.gpu(), gu.gpu_lin, dn.gpu_lin);
  const std::string name = "routed TxExkxHxI " + sz({T, E, k, H, I});
  record("moe_grouped", name + " ids differ", h.gpu_f(id) == h.cpu_f(id) ? 0.0 : 1.0, kExact);
  record("moe_grouped", name + " weights", h.err(wt), kFp32);
  const auto [worst, flipped] = token_errors(h, o, T, H, kTensorCore);
  record("moe_grouped", name + " all tokens", worst, kFlippedTokenErr);
  record("moe_grouped", name + " tokens > 1e-4", flipped, flipped_tokens_bound(T));
}

// Dense NVFP4 W4A4 Linear (one expert): not re-quantized, so kTensorCore on the whole output.
void check_dense(Harness& h, WeightFormat fmt, const char* fname, int64_t T, int64_t K, int64_t N, int64_t P,
                 bool shared_scale = false) {
  QWeight w = make_qweight(h, 1, N, K, P, fmt, ActivationQuant::kNvfp4, 4.0f);
  if (shared_scale) share_input_scales(h, w, 1, P);
  Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
  h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
  h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
  const std::string name =
      std::string("dense ") + fname + (shared_scale ? " one input scale" : "") + " TxKxNxP " + sz({T, K, N, P});
  record("moe_grouped", name, h.err(o), kTensorCore);
  if (T < 1000) return;
  const std::vector<float> ref = h.cpu_f(o);
  for (int tile = 0; tile < kTiles; ++tile) {  // every regime this device runs, forced
    Pair o3 = h.out({T, N});
    h.cpu->upload(o3.cpu(), ref.data());
    if (!grouped_linear_probe(*h.gpu, o3.gpu(), x.gpu(), w.gpu_lin, tile)) continue;
    record("moe_grouped", name + " " + kTileNames[tile], h.err(o3), kTensorCore);
  }
}

// Block scales of 2^-9 .. 0.117 (E4M3 codes 0x01..0x1f, subnormal ones included) with global scale 1:
// the decoded weights e2m1·sf·2^-14 are fp16 subnormals, which the tensor cores must take as they
// are (a flush to zero would lose every product: error ~1).
void check_tiny_scales(Harness& h) {
  const int64_t T = 64, K = 1024, N = 512;
  std::vector<uint8_t> codes(static_cast<size_t>(N * K / 2)), scales(static_cast<size_t>(N * K / 16));
  for (auto& b : codes) b = static_cast<uint8_t>(g_rng());
  for (auto& b : scales) b = static_cast<uint8_t>(1 + g_rng() % 31);
  const float gsv = 1.0f, isv = 448.0f * 6.0f / 4.0f;
  QWeight w;
  w.w = h.make(DType::kU8, {1, N, K / 2}, codes.data());
  w.ws = h.make(DType::kF8E4M3, {1, N, K / 16}, scales.data());
  w.gs = h.make(DType::kF32, {1, 1}, &gsv);
  w.is = h.make(DType::kF32, {1, 1}, &isv);
  for (int side = 0; side < 2; ++side) {
    Linear& l = side == 0 ? w.cpu_lin : w.gpu_lin;
    l.format = WeightFormat::kNvfp4;
    l.activation = ActivationQuant::kNvfp4;
    l.out_features = N;
    l.in_features = K;
    l.weight = side == 0 ? w.w.cpu() : w.w.gpu();
    l.weight_scale = side == 0 ? w.ws.cpu() : w.ws.gpu();
    l.global_scale = side == 0 ? w.gs.cpu() : w.gs.gpu();
    l.input_scale = side == 0 ? w.is.cpu() : w.is.gpu();
  }
  Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
  h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
  h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
  record("moe_grouped", "dense tiny block scales TxKxN " + sz({T, K, N}), h.err(o), kTensorCore);
}

// More than 65,535 (token, expert) pairs in one call: the GPU's whole-batch result against the same
// tokens in chunks of 1,025 (each under the old limit; a token's outputs do not depend on which other
// tokens share its tiles, so only the accumulation of tile-size choices can differ: kTensorCore), and
// the first 512 tokens against the CPU (the CPU reference of all 65,600 pairs costs too long).
void check_many_slots(Harness& h) {
  const int64_t T = 8200, E = 32, k = 8, H = 128, I = 128, chunk = 1025, T_cpu = 512;
  QWeight gu = make_qweight(h, E, 2 * I, H, 2, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 4.0f);
  QWeight dn = make_qweight(h, E, H, I, 1, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1.0f);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  random_routing(T, E, k, ids, wts);
  const std::vector<float> xv = randn(T * H);
  Pair x = h.f32({T, H}, xv), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts), o = h.out({T, H});
  h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
  const std::vector<float> whole = h.gpu_f(o);
  std::vector<float> chunked;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    Pair xc = h.f32({n, H}, std::vector<float>(xv.begin() + t0 * H, xv.begin() + (t0 + n) * H));
    Pair ic = h.i32({n, k}, std::vector<int32_t>(ids.begin() + t0 * k, ids.begin() + (t0 + n) * k));
    Pair wc = h.f32({n, k}, std::vector<float>(wts.begin() + t0 * k, wts.begin() + (t0 + n) * k));
    Pair oc = h.out({n, H});
    h.gpu->moe_experts(oc.gpu(), xc.gpu(), ic.gpu(), wc.gpu(), gu.gpu_lin, dn.gpu_lin);
    const auto v = h.gpu_f(oc);
    chunked.insert(chunked.end(), v.begin(), v.end());
  }
  const std::string name = "TxExkxHxI " + sz({T, E, k, H, I});
  record("moe_grouped", name + " whole vs chunks of 1025", rel_err(whole, chunked), kTensorCore);
  Pair xs = h.f32({T_cpu, H}, std::vector<float>(xv.begin(), xv.begin() + T_cpu * H));
  Pair is = h.i32({T_cpu, k}, std::vector<int32_t>(ids.begin(), ids.begin() + T_cpu * k));
  Pair ws = h.f32({T_cpu, k}, std::vector<float>(wts.begin(), wts.begin() + T_cpu * k));
  Pair os = h.out({T_cpu, H});
  h.cpu->moe_experts(os.cpu(), xs.cpu(), is.cpu(), ws.cpu(), gu.cpu_lin, dn.cpu_lin);
  h.gpu->upload(os.gpu(), whole.data());  // the whole batch's first rows
  const auto [worst, flipped] = token_errors(h, os, T_cpu, H, kTensorCore);
  record("moe_grouped", name + " first 512 tokens all tokens", worst, kFlippedTokenErr);
  record("moe_grouped", name + " first 512 tokens > 1e-4", flipped, flipped_tokens_bound(T_cpu));
}

// Decode sizes and the regime switches, sized for the CPU reference's time (~0.1 G multiply-adds
// per second on the lent machine): group "moe_grouped_small".
void test_moe_grouped(Harness& h) {
  const WeightFormat ct = WeightFormat::kNvfp4, mo = WeightFormat::kNvfp4ModelOpt;
  check_tiny_scales(h);
  check_dense(h, ct, "nvfp4", 2, 3072, 2048, 2);
  // 122B expert shapes (H 3072, I 1024, top-8) at decode sizes (the dispatch's per-pair GEMVs up to
  // 16 tokens; each grouped regime forced as well), then smaller matrices: T = 64 with 128 experts
  // (4 tokens each: small-N) and with 16 (32 each: medium-N), T = 40 with 32 (10 each: medium-N, pairs
  // of 16 and 32 rows) and T = 96 with 16 (48 each: medium-N, pairs up to 64 rows), partitions sharing
  // one input scale.
  for (const MoeCase& c : std::vector<MoeCase>{{ct, "nvfp4", 1, 16, 8, 3072, 1024, 2},
                                               {ct, "nvfp4", 2, 16, 8, 3072, 1024, 2},
                                               {ct, "nvfp4", 7, 16, 8, 3072, 1024, 2},
                                               {ct, "nvfp4", 64, 128, 8, 512, 256, 2},
                                               {ct, "nvfp4", 64, 16, 8, 512, 256, 2},
                                               {ct, "nvfp4", 40, 32, 8, 512, 256, 2},
                                               {mo, "nvfp4-mo", 40, 32, 8, 512, 256, 2, true},
                                               {ct, "nvfp4", 96, 16, 8, 256, 256, 2},
                                               {mo, "nvfp4-mo", 7, 10, 6, 512, 256, 2},
                                               {ct, "nvfp4", 16, 64, 8, 1024, 256, 2, true}})
    check_moe_experts(h, c);
  check_route_experts(h, 2, 1024, 256);
  check_route_experts(h, 33, 512, 256);
  check_dense(h, ct, "nvfp4", 33, 256, 384, 3);
  check_dense(h, ct, "nvfp4", 200, 1024, 768, 3, true);
}

// Prefill sizes: group "moe_grouped_large" (each regime forced against the same reference, more than
// 65,535 pairs, the route kernel ahead of the plan).
void test_moe_grouped_large(Harness& h) {
  const WeightFormat ct = WeightFormat::kNvfp4, mo = WeightFormat::kNvfp4ModelOpt;
  for (const MoeCase& c : std::vector<MoeCase>{{ct, "nvfp4", 300, 64, 8, 512, 256, 2},
                                               {ct, "nvfp4 gate_up P1", 128, 64, 8, 512, 256, 1},
                                               {ct, "nvfp4", 128, 64, 8, 512, 256, 2, true},
                                               {mo, "nvfp4-mo", 2048, 32, 4, 256, 128, 2}})
    check_moe_experts(h, c);
  check_many_slots(h);
  check_route_experts(h, 300, 512, 256);
  check_dense(h, ct, "nvfp4", 300, 512, 2048, 2);
  check_dense(h, ct, "nvfp4", 1000, 512, 768, 3);
  check_dense(h, mo, "nvfp4-mo", 2048, 256, 2048, 1);  // large-N tiles (enough work items)
}

// Random NVFP4 experts straight from random bytes (any E2M1 codes, E4M3 block scales 0.5 .. 1.9),
// fast enough for the models' full expert sets; the same bytes on both backends.
QWeight random_nvfp4(Harness& h, int64_t E, int64_t N, int64_t K, int64_t P) {
  std::vector<uint8_t> codes(static_cast<size_t>(E * N * K / 2)), scales(static_cast<size_t>(E * N * K / 16));
  for (size_t i = 0; i < codes.size(); i += 8) {
    const uint64_t r = g_rng();
    for (size_t b = 0; b < 8 && i + b < codes.size(); ++b) codes[i + b] = static_cast<uint8_t>(r >> (8 * b));
  }
  for (auto& v : scales) v = static_cast<uint8_t>(0x30 + g_rng() % 16);
  std::vector<float> gs(static_cast<size_t>(E * P)), is(static_cast<size_t>(E * P));
  for (auto& v : gs) v = 448.0f * 6.0f / (1.0f + static_cast<float>(g_rng() % 4));
  for (auto& v : is) v = 448.0f * 6.0f / (4.0f + static_cast<float>(g_rng() % 8));
  QWeight w;
  w.w = h.make(DType::kU8, {E, N, K / 2}, codes.data());
  w.ws = h.make(DType::kF8E4M3, {E, N, K / 16}, scales.data());
  w.gs = h.make(DType::kF32, {E, P}, gs.data());
  w.is = h.make(DType::kF32, {E, P}, is.data());
  for (int side = 0; side < 2; ++side) {
    Linear& l = side == 0 ? w.cpu_lin : w.gpu_lin;
    l.format = WeightFormat::kNvfp4;
    l.activation = ActivationQuant::kNvfp4;
    l.out_features = N;
    l.in_features = K;
    l.partitions = P;
    l.weight = side == 0 ? w.w.cpu() : w.w.gpu();
    l.weight_scale = side == 0 ? w.ws.cpu() : w.ws.gpu();
    l.global_scale = side == 0 ? w.gs.cpu() : w.gs.gpu();
    l.input_scale = side == 0 ? w.is.cpu() : w.is.gpu();
  }
  return w;
}

// Decode batches and short prompts at the models' expert shapes (top-8 of 128-256 experts: 0.5-16 rows
// per expert, skewed routing; 35B T = 338: a later agent turn; 512 / 513: the sliced / medium edge of
// the dispatch at 16 rows per expert), where the CPU reference would take minutes (~0.1 G multiply-adds
// per second on the lent machine): the sliced small-N kernel and moe_experts' own choice against the large-N mma.sync
// kernel (another tiling, K order and pair size) on the same inputs, with the bounds used against the
// CPU (both sides quantize the down input; a code flipped on either side counts).
void check_decode_model_shapes(Harness& h) {
  struct Shape {
    const char* name;
    int64_t E, H, I;
    std::vector<int64_t> Ts;
  };
  for (const Shape& sh : {Shape{"35B", 256, 2048, 512, {16, 33, 64, 128, 338, 512, 513}}, Shape{"122B", 128, 3072, 1024, {17, 65}}}) {
    const int64_t k = 8;
    QWeight gu = random_nvfp4(h, sh.E, 2 * sh.I, sh.H, 2), dn = random_nvfp4(h, sh.E, sh.H, sh.I, 1);
    for (int64_t T : sh.Ts) {
      std::vector<int32_t> ids;
      std::vector<float> wts;
      random_routing(T, sh.E, k, ids, wts);
      Pair x = h.f32({T, sh.H}, randn(T * sh.H)), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts),
           ref = h.out({T, sh.H});
      if (!moe_grouped_probe(*h.gpu, ref.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin, 0, kLargeMmaSync))
        return;  // no large-N kernel on this device (sm_120)
      const std::vector<float> r = h.gpu_f(ref);
      const std::string name = std::string(sh.name) + " shapes vs large-N mma.sync TxExkxHxI " + sz({T, sh.E, k, sh.H, sh.I});
      for (int which = 0; which < 2; ++which) {
        Pair o = h.out({T, sh.H});
        h.cpu->upload(o.cpu(), r.data());
        if (which == 0) {
          if (!moe_grouped_probe(*h.gpu, o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin, 0, kSliced)) continue;
        } else {
          h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
        }
        const auto [worst, flipped] = token_errors(h, o, T, sh.H, kTensorCore);
        const std::string what = name + (which == 0 ? " small-N sliced" : " moe_experts");
        record("moe_grouped", what + " all tokens", worst, kFlippedTokenErr);
        record("moe_grouped", what + " tokens > 1e-4", flipped, flipped_tokens_bound(T));
      }
    }
  }
}

// Decode batch sizes around the dispatch's edges (8/9 tokens: per-pair GEMVs / grouped; 31/33 of 256
// experts: 0.97 / 1.03 rows per expert, sliced items of 128 / 256 rows; 128/129 of 64 experts: 16 / 16.1
// rows per expert, sliced / medium tile) and the sliced kernel's (pairs of at most 16 rows: 16/17, 32/33,
// 64/65, 96/97; 128: 4 rows per expert of 256), skewed routing and one expert in every token's
// list (64 rows: 4 pairs), against the CPU (every regime forced too): group "moe_grouped_decode".
void test_moe_grouped_decode(Harness& h) {
  const WeightFormat ct = WeightFormat::kNvfp4, mo = WeightFormat::kNvfp4ModelOpt;
  record("moe_grouped", "e2m1_round vs the threshold table: mismatching floats in [-6, 6]",
         static_cast<double>(e2m1_round_mismatches_probe(*h.gpu)), kExact);
  for (const MoeCase& c : std::vector<MoeCase>{{ct, "nvfp4", 8, 64, 8, 512, 256, 2},
                                               {mo, "nvfp4-mo", 9, 64, 8, 512, 256, 2},
                                               {ct, "nvfp4", 16, 64, 8, 512, 256, 2},
                                               {mo, "nvfp4-mo", 17, 64, 8, 512, 256, 2},
                                               {mo, "nvfp4-mo", 31, 256, 8, 256, 256, 2},
                                               {ct, "nvfp4", 33, 256, 8, 256, 256, 2},
                                               {ct, "nvfp4", 64, 64, 8, 256, 256, 2, false, 5},
                                               {ct, "nvfp4", 65, 64, 8, 512, 256, 2, true},
                                               {ct, "nvfp4", 96, 64, 8, 256, 256, 2},
                                               {mo, "nvfp4-mo", 97, 64, 8, 256, 256, 2},
                                               {ct, "nvfp4", 128, 256, 8, 256, 256, 2},
                                               {ct, "nvfp4", 128, 64, 8, 256, 256, 2},
                                               {mo, "nvfp4-mo", 129, 64, 8, 256, 256, 2, true}})
    check_moe_experts(h, c);
  check_decode_model_shapes(h);
}

const RegisterOpChecks kRegister("moe_grouped_small", test_moe_grouped);
const RegisterOpChecks kRegisterDecode("moe_grouped_decode", test_moe_grouped_decode);
const RegisterOpChecks kRegisterLarge("moe_grouped_large", test_moe_grouped_large);

}  // namespace
}  // namespace sparkserve
