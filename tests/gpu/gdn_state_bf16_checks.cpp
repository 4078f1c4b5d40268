// gpu_ops group "gdn_bf16": every GDN op that takes the recurrent state pool, with a bf16 pool
// (backend/ops.h, "The recurrent state pool"; --gdn-state-dtype bfloat16), on CUDA against the CPU
// backend with the same bf16 pool, on fresh random inputs: the fused decode step (122B / 35B shapes at
// 1, 16, 64 sequences, an odd geometry: dk 64, dv 48, H % 4 != 0), gdn_recurrent (decode spans with
// saves, a commit's spans of 1..4 tokens), gdn_verify and the fused verify step (the pools must come
// back bit for bit), gdn_chunked (the tensor-core kernel: one and several spans, continued state, saves
// inside and at the end of chunks, 16..128-column slices; and the token-by-token fallback of other
// head sizes), and copies of bf16 state rows.
//
// Outputs: the f32 path's bound (kFp32, kForms, kTensorCoreGdn = 1e-3: the same files' reasons). Both
// sides widen the same bf16 values and compute in f32 as with an f32 pool; only what they store is
// rounded, so an output (computed before the store) differs as in f32.
// The stored state: let a, b be the f32 values the two sides round, |a - b| <= B max|ref| with B the
// f32 path's bound. Rounding each to nearest bf16 moves it by at most half an ulp of its binade, so
//   |bf16(a) - bf16(b)| <= B max|ref| + ulp(max(|bf16(a)|, |bf16(b)|))
// (one bf16 ulp where a and b straddle a rounding boundary; 0 where they round alike). Checked per
// element as err = max |got - ref| / (that right-hand side) <= 1; max|ref| over the bf16 pool carries
// a factor (1 + 2^-8) for its own rounding. A formula or indexing error, a missed rounding (f32 bits
// truncated instead of rounded: up to an ulp everywhere, on top of B) or a state stored twice rounded
// gives many elements over it. How many elements differ by one ulp is printed (the straddles).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_harness.h"

namespace sparkserve {
namespace {

constexpr double kTensorCoreGdn = 1e-3;  // gdn_chunked_checks.cpp
constexpr double kSaveVsStop = 1e-6;     // gdn_chunked_checks.cpp

std::vector<uint16_t> bf16_bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

// A bf16 state pool with the same random values on both backends.
Pair bf16_pool(Harness& h, std::vector<int64_t> shape, float scale) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const std::vector<uint16_t> bits = bf16_bits_of(randn(n, scale));
  return h.make(DType::kBF16, std::move(shape), bits.data());
}

std::vector<uint16_t> bits(Backend* b, const Tensor& t) {
  std::vector<uint16_t> v(t.nbytes() / 2);
  b->download(v.data(), t);
  return v;
}

double bf16_ulp(double x) {
  x = std::fabs(x);
  return x == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(x) - 7);
}

// The bound above for a bf16 pool, given the f32 path's bound B; prints how many elements differ.
double state_err(Harness& h, const Pair& p, double B, const std::string& what) {
  const std::vector<uint16_t> g = bits(h.gpu, p.gpu()), c = bits(h.cpu, p.cpu());
  double mr = 0;
  for (uint16_t x : c) mr = std::max(mr, std::fabs(static_cast<double>(bf16_to_f32(x))));
  const double slack = B * mr * (1.0 + 1.0 / 256);
  double worst = 0;
  int64_t differ = 0, over_ulp = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (g[i] == c[i]) continue;
    const double a = bf16_to_f32(g[i]), b = bf16_to_f32(c[i]), d = std::fabs(a - b);
    if (!std::isfinite(d)) return INFINITY;
    ++differ;
    const double u = bf16_ulp(std::max(std::fabs(a), std::fabs(b)));
    over_ulp += d > u;
    worst = std::max(worst, d / (slack + u));
  }
  std::printf("      %s: %lld of %zu state values differ (%lld by more than one ulp)\n", what.c_str(),
              static_cast<long long>(differ), c.size(), static_cast<long long>(over_ulp));
  return worst;
}

bool same_bits(Harness& h, const Pair& p) { return bits(h.gpu, p.gpu()) == bits(h.cpu, p.cpu()); }

// ---- the fused decode step (gdn_decode_checks.cpp's cases, bf16 state) ----------------------------
void check_decode_step(Harness& h, const char* name, const GdnDims& d, int64_t H, bool bf16_ab, int64_t B) {
  const int64_t C = d.conv_dim(), Hv = d.num_v_heads, dv = d.v_head_dim, K = d.conv_kernel, slots = B + 3;
  const std::string tag = std::string(name) + " B" + std::to_string(B);
  BatchLayout L = single_token_spans(B, slots);
  Weight wa = make_weight(h, {Hv, H}, bf16_ab, 2.0f / std::sqrt(static_cast<float>(H)));
  Weight wb = make_weight(h, {Hv, H}, bf16_ab, 2.0f / std::sqrt(static_cast<float>(H)));
  std::vector<float> alog(static_cast<size_t>(Hv)), nw = randn(dv, 0.2f);
  for (auto& x : alog) x = std::log(1.0f + 15.0f * std::uniform_real_distribution<float>(0, 1)(g_rng));
  for (auto& x : nw) x += 1.0f;
  Pair hid = h.f32({B, H}, randn(B * H)), mixed = h.f32({B, C}, randn(B * C)),
       z = h.f32({B, Hv * dv}, randn(B * Hv * dv, 2.0f)), conv_w = h.f32({C, K}, randn(C * K, 0.5f)),
       A_log = h.f32({Hv}, alog), dt = h.f32({Hv}, randn(Hv, 0.5f)), norm_w = h.f32({dv}, nw);
  Pair conv = h.f32({slots, C, K - 1}, randn(slots * C * (K - 1))),
       rec = bf16_pool(h, {slots, Hv, d.k_head_dim, dv}, 0.3f), out = h.out({B, Hv * dv});
  for (Backend* be : {h.cpu, h.gpu}) {
    const bool g = be == h.gpu;
    be->gdn_decode_step(g ? out.gpu() : out.cpu(), g ? hid.gpu() : hid.cpu(), g ? mixed.gpu() : mixed.cpu(),
                        g ? z.gpu() : z.cpu(), g ? wa.gpu_lin : wa.cpu_lin, g ? wb.gpu_lin : wb.cpu_lin,
                        g ? conv_w.gpu() : conv_w.cpu(), g ? A_log.gpu() : A_log.cpu(), g ? dt.gpu() : dt.cpu(),
                        g ? norm_w.gpu() : norm_w.cpu(), 1e-6f, g ? conv.gpu() : conv.cpu(), g ? rec.gpu() : rec.cpu(),
                        L, d);
  }
  record("gdn_bf16", "decode_step " + tag + " out", h.err(out), kFp32);
  record("gdn_bf16", "decode_step " + tag + " conv state", h.err(conv), kFp32);
  record("gdn_bf16", "decode_step " + tag + " state", state_err(h, rec, kFp32, tag), 1.0);
}

// ---- gdn_recurrent, gdn_verify, the fused verify step ----------------------------------------------
void check_delta_ops(Harness& h, const GdnDims& d) {
  const int64_t C = d.conv_dim(), Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, K = d.conv_kernel;
  const std::string name = "hk" + std::to_string(d.num_k_heads) + " hv" + std::to_string(Hv) + " dk" +
                           std::to_string(dk) + " dv" + std::to_string(dv);
  const int32_t slots = 5;
  auto gates = [&](int64_t T) {  // g <= 0, beta in (0, 1), as gdn_gating makes them
    std::vector<float> g = randn(T * Hv, 0.5f), b = randn(T * Hv, 0.5f);
    for (float& x : g) x = -std::fabs(x);
    for (float& x : b) x = 1.0f / (1.0f + std::exp(-x));
    return std::pair{h.f32({T, Hv}, g), h.f32({T, Hv}, b)};
  };
  // Decode spans, saves after their token into rows past the slots; then a commit's spans of 1..4.
  for (bool commit : {false, true}) {
    Spans sp = commit ? make_spans({{3, 4}, {0, 1}, {90, 3}, {17, 2}}, 16, 64, slots)
                      : make_spans({{3, 1}, {0, 1}, {90, 1}}, 16, 64, slots);
    const std::vector<std::vector<GdnStateSave>> saves =
        commit ? std::vector<std::vector<GdnStateSave>>{{{1, slots}, {4, slots + 1}}, {}, {{3, slots + 2}}, {}}
               : std::vector<std::vector<GdnStateSave>>{{{1, slots}}, {}, {{1, slots + 1}}};
    for (size_t i = 0; i < saves.size(); ++i) {
      sp.layout.seqs[i].saves = saves[i].data();
      sp.layout.seqs[i].num_saves = static_cast<int64_t>(saves[i].size());
    }
    const int64_t T = sp.layout.total_rows;
    auto [g, beta] = gates(T);
    Pair qkv = h.f32({T, C}, randn(T * C)), st = bf16_pool(h, {slots + 3, Hv, dk, dv}, 0.3f), o = h.out({T, Hv, dv});
    h.cpu->gdn_recurrent(o.cpu(), qkv.cpu(), g.cpu(), beta.cpu(), st.cpu(), sp.layout, d);
    h.gpu->gdn_recurrent(o.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st.gpu(), sp.layout, d);
    const std::string tag = "recurrent " + name + (commit ? " spans of 1..4, saves" : " decode, saves");
    record("gdn_bf16", tag + " out", h.err(o), kFp32);
    record("gdn_bf16", tag + " state", state_err(h, st, kFp32, tag), 1.0);
  }
  // Verify spans of 1..4 tokens: the pools are only read.
  Spans sp = make_spans({{3, 4}, {0, 1}, {90, 3}, {17, 2}}, 16, 64, slots);
  const int64_t T = sp.layout.total_rows;
  auto [g, beta] = gates(T);
  Pair mixed = h.f32({T, C}, randn(T * C)), w = h.f32({C, K}, randn(C * K, 0.5f)),
       cs = h.f32({slots, C, K - 1}, randn(slots * C * (K - 1))), st = bf16_pool(h, {slots, Hv, dk, dv}, 0.3f),
       qkv = h.out({T, C}), o = h.out({T, Hv, dv});
  h.cpu->gdn_verify(o.cpu(), qkv.cpu(), mixed.cpu(), w.cpu(), g.cpu(), beta.cpu(), cs.cpu(), st.cpu(), sp.layout, d);
  h.gpu->gdn_verify(o.gpu(), qkv.gpu(), mixed.gpu(), w.gpu(), g.gpu(), beta.gpu(), cs.gpu(), st.gpu(), sp.layout, d);
  record("gdn_bf16", "verify " + name + " out", std::max(h.err(o), h.err(qkv)), kFp32);
  record("gdn_bf16", "verify " + name + " states unchanged", same_bits(h, st) && h.err(cs) == 0 ? 0.0 : 1.0, kExact);
  // The fused verify step (one wave of blocks: the cluster kernel), bf16 a/b.
  if (dv >= 16 && dv % 8 == 0 && dk <= 128) {
    const int64_t H = 512;
    Weight wa = make_weight(h, {Hv, H}, true, 3.0f / std::sqrt(static_cast<float>(H)));
    Weight wb = make_weight(h, {Hv, H}, true, 3.0f / std::sqrt(static_cast<float>(H)));
    std::vector<float> alog(static_cast<size_t>(Hv));
    for (auto& x : alog) x = std::log(1.0f + 15.0f * std::uniform_real_distribution<float>(0, 1)(g_rng));
    Pair Al = h.f32({Hv}, alog), dt = h.f32({Hv}, randn(Hv, 0.5f)), nw = h.f32({dv}, randn(dv, 0.3f));
    Pair hid = h.f32({T, H}, randn(T * H)), z = h.f32({T, Hv * dv}, randn(T * Hv * dv));
    Pair out = h.out({T, Hv * dv}), g2 = h.out({T, Hv}), b2 = h.out({T, Hv});
    h.cpu->gdn_verify_step(out.cpu(), g2.cpu(), b2.cpu(), hid.cpu(), mixed.cpu(), z.cpu(), wa.cpu_lin, wb.cpu_lin,
                           w.cpu(), Al.cpu(), dt.cpu(), nw.cpu(), 1e-6f, cs.cpu(), st.cpu(), sp.layout, d);
    h.gpu->gdn_verify_step(out.gpu(), g2.gpu(), b2.gpu(), hid.gpu(), mixed.gpu(), z.gpu(), wa.gpu_lin, wb.gpu_lin,
                           w.gpu(), Al.gpu(), dt.gpu(), nw.gpu(), 1e-6f, cs.gpu(), st.gpu(), sp.layout, d);
    record("gdn_bf16", "verify_step " + name + " out, g, beta", std::max({h.err(out), h.err(g2), h.err(b2)}), kForms);
    record("gdn_bf16", "verify_step " + name + " states unchanged", same_bits(h, st) && h.err(cs) == 0 ? 0.0 : 1.0,
           kExact);
  }
}

// ---- gdn_chunked ---------------------------------------------------------------------------------
// Inputs as gdn_chunked_checks.cpp's HF-gating regime: v a SiLU output, g = -exp(A_log) softplus(.).
void chunk_inputs(Harness& h, const GdnDims& d, int64_t T, Pair& qkv, Pair& g, Pair& beta) {
  const int64_t C = d.conv_dim(), Hv = d.num_v_heads, kd = d.key_dim();
  std::vector<float> x = randn(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 2 * kd; c < C; ++c) {
      float& v = x[static_cast<size_t>(t * C + c)];
      v = 2.0f * v / (1.0f + std::exp(-v));
    }
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<float> alog(static_cast<size_t>(Hv)), dtb = randn(Hv, 0.5f), a = randn(T * Hv, 2.0f), gv(a.size()),
      bv = randn(T * Hv, 2.0f);
  for (auto& v : alog) v = std::log(1.0f + 15.0f * u01(g_rng));
  for (int64_t i = 0; i < T * Hv; ++i) {
    const float s = a[static_cast<size_t>(i)] + dtb[static_cast<size_t>(i % Hv)];
    gv[static_cast<size_t>(i)] = -std::exp(alog[static_cast<size_t>(i % Hv)]) * (s > 20.0f ? s : std::log1p(std::exp(s)));
  }
  for (auto& v : bv) v = 1.0f / (1.0f + std::exp(-v));
  qkv = h.f32({T, C}, x);
  g = h.f32({T, Hv}, gv);
  beta = h.f32({T, Hv}, bv);
}

void check_chunked(Harness& h, const GdnDims& d, const std::vector<std::array<int64_t, 2>>& spans,
                   const std::vector<std::vector<int64_t>>& saves, const std::string& tag) {
  const int32_t slots = static_cast<int32_t>(spans.size()) + 1;
  Spans sp = make_spans(spans, 16, 4096, slots);
  std::vector<std::vector<GdnStateSave>> at(spans.size());
  int32_t rows = slots;
  for (size_t i = 0; i < spans.size(); ++i) {
    for (int64_t t : saves[i]) at[i].push_back({t, rows++});
    sp.layout.seqs[i].saves = at[i].data();
    sp.layout.seqs[i].num_saves = static_cast<int64_t>(at[i].size());
  }
  const int64_t T = sp.layout.total_rows, Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim;
  Pair qkv, g, beta;
  chunk_inputs(h, d, T, qkv, g, beta);
  Pair st = bf16_pool(h, {rows, Hv, dk, dv}, 0.3f), o = h.out({T, Hv, dv});
  const std::vector<uint16_t> st0 = bits(h.cpu, st.cpu());
  h.cpu->gdn_chunked(o.cpu(), qkv.cpu(), g.cpu(), beta.cpu(), st.cpu(), sp.layout, d);
  h.gpu->gdn_chunked(o.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st.gpu(), sp.layout, d);
  // k_head_dim 128: the tensor-core kernel; else the token-by-token recurrence against the CPU's
  // chunked form (kForms, ops_vs_cpu.cpp).
  const double B = dk == 128 ? kTensorCoreGdn : kForms;
  const std::string name = "chunked hk" + std::to_string(d.num_k_heads) + " hv" + std::to_string(Hv) + " dk" +
                           std::to_string(dk) + " dv" + std::to_string(dv) + " " + tag;
  record("gdn_bf16", name + " out", h.err(o), B);
  record("gdn_bf16", name + " state", state_err(h, st, B, name), 1.0);
  if (dk != 128 || rows == slots) return;
  // Each save against a GPU call that stops there, from the same bf16 state: both round f32 values
  // within kSaveVsStop of each other (gdn_chunked_checks.cpp).
  double worst = 0;
  const std::vector<uint16_t> got = bits(h.gpu, st.gpu());
  const int64_t row_n = Hv * dk * dv;
  for (size_t i = 0; i < spans.size(); ++i)
    for (const GdnStateSave& v : at[i]) {
      BatchLayout stop;
      stop.total_rows = T;
      stop.seqs.push_back(sp.layout.seqs[i]);
      stop.seqs[0].num_tokens = v.tokens;
      stop.seqs[0].num_saves = 0;
      Pair st1 = h.make(DType::kBF16, {rows, Hv, dk, dv}, st0.data()), o1 = h.out({T, Hv, dv});
      h.gpu->gdn_chunked(o1.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st1.gpu(), stop, d);
      const std::vector<uint16_t> s1 = bits(h.gpu, st1.gpu());
      double mr = 0;
      for (int64_t k = 0; k < row_n; ++k)
        mr = std::max(mr, std::fabs(static_cast<double>(bf16_to_f32(s1[static_cast<size_t>(stop.seqs[0].gdn_slot * row_n + k)]))));
      for (int64_t k = 0; k < row_n; ++k) {
        const double a = bf16_to_f32(got[static_cast<size_t>(v.row * row_n + k)]),
                     b = bf16_to_f32(s1[static_cast<size_t>(stop.seqs[0].gdn_slot * row_n + k)]);
        worst = std::max(worst, std::fabs(a - b) / (kSaveVsStop * mr * (1.0 + 1.0 / 256) +
                                                    bf16_ulp(std::max(std::fabs(a), std::fabs(b)))));
      }
    }
  record("gdn_bf16", name + " saves vs calls stopping there", worst, 1.0);
}

// ---- copies of bf16 rows (a snapshot save / restore) ---------------------------------------------
void check_copies(Harness& h) {
  Pair rec = bf16_pool(h, {6, 32, 128, 128}, 1.0f), conv = h.f32({6, 8192, 3}, randn(6 * 8192 * 3));
  std::vector<TensorCopy> cc, gc;
  for (auto [from, to] : {std::pair{2, 5}, std::pair{2, 0}}) {
    cc.push_back({rec.cpu().rows(to, 1), rec.cpu().rows(from, 1)});
    gc.push_back({rec.gpu().rows(to, 1), rec.gpu().rows(from, 1)});
    cc.push_back({conv.cpu().rows(to, 1), conv.cpu().rows(from, 1)});
    gc.push_back({conv.gpu().rows(to, 1), conv.gpu().rows(from, 1)});
  }
  h.cpu->copy_batch(cc);
  h.gpu->copy_batch(gc);
  const std::vector<uint16_t> r = bits(h.cpu, rec.cpu());
  const size_t row = r.size() / 6;
  const bool moved = std::equal(r.begin() + 2 * row, r.begin() + 3 * row, r.begin() + 5 * row) &&
                     std::equal(r.begin() + 2 * row, r.begin() + 3 * row, r.begin());
  record("gdn_bf16", "copy_batch bf16 recurrent + f32 conv rows", moved && same_bits(h, rec) && h.err(conv) == 0 ? 0.0 : 1.0,
         kExact);
}

void run(Harness& h) {
  const GdnDims b122{16, 64, 128, 128, 4}, b35{16, 32, 128, 128, 4}, odd{2, 6, 64, 48, 3};
  for (int64_t B : {1, 16, 64}) check_decode_step(h, "122B hk16 hv64 H3072", b122, 3072, true, B);
  check_decode_step(h, "35B hk16 hv32 H2048 f32 a/b", b35, 2048, false, 64);
  check_decode_step(h, "odd hk2 hv6 dk64 dv48 H1030 f32 a/b", odd, 1030, false, 3);
  for (const GdnDims& d : {GdnDims{2, 6, 16, 24, 4}, b122, GdnDims{4, 4, 64, 32, 3}}) check_delta_ops(h, d);
  const GdnDims small{2, 8, 128, 128, 4};
  check_chunked(h, small, {{0, 200}}, {{}}, "T200");
  check_chunked(h, small, {{0, 2048}}, {{1000}}, "T2048");
  check_chunked(h, small, {{0, 150}, {333, 77}, {64, 1}, {1000, 64}, {5, 129}},
                {{1, 64, 100, 150}, {}, {1}, {63, 64}, {2, 65, 127, 128}}, "5 spans continued, saves");
  check_chunked(h, b122, {{0, 300}, {517, 129}, {9, 1}}, {{127, 128, 299}, {}, {1}}, "3 spans, saves");
  check_chunked(h, GdnDims{2, 6, 128, 32, 4}, {{0, 257}, {3, 70}}, {{200}, {1, 69}}, "2 spans, saves");
  check_chunked(h, GdnDims{1, 2, 128, 16, 4}, {{0, 190}}, {{}}, "T190");
  check_chunked(h, GdnDims{2, 6, 16, 24, 4}, {{0, 70}, {12, 5}}, {{35}, {}}, "recurrence fallback");
  check_copies(h);
}

RegisterOpChecks register_gdn_bf16("gdn_bf16", run);

}  // namespace
}  // namespace sparkserve
