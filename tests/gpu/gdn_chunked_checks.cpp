// gpu_ops group "gdn_chunked": the CUDA gdn_chunked (tensor-core chunk kernel for k_head_dim 128, the
// token-by-token recurrence otherwise) against the CPU backend's chunked form, on fresh random inputs.
// Covers spans of 1..200 tokens (odd sizes, chunk multiples and +-1 around them), 8192 tokens, several
// spans in one batch, continued state (start_pos > 0 with a random pooled state; a span split over
// two calls against one CPU call, also as two parts of one batch), state saves inside spans (below),
// value heads sharing key heads (Hv / Hk = 1, 3, 4), dv 16..128, and
// three input regimes: HF's gating (strong decay: little state crosses a chunk boundary), weak decay
// (g in [-0.05, 0]: the state carries across many chunks) and correlated keys (k = a shared
// direction + noise: large k_i.k_j, T = (I + L)^-1 far from I).
//
// Bound kTensorCoreGdn = 1e-3 (max |cuda - cpu| / max |cpu| over the whole output, and over the whole
// state pool). The kernel's products take fp16 operands (10-bit mantissa: each operand rounded by up
// to 2^-11 = 4.9e-4 relative) with fp32 accumulation; the identity part of (I + L)^-1 and the q_i.k_i
// diagonal are added in fp32, so an output's dominant terms carry no rounding and the rest carry one
// rounding per operand. A numpy model of the same arithmetic (fp16-rounded operands, fp32 elsewhere)
// against a float64 recurrence gives 2.8e-4 / 4.8e-4 on the output and 3.3e-4 / 4.0e-4 on the final
// state at 8192 tokens (strong / weak decay). The worst case is a state entry after one or two tokens,
// a single product of two fp16-rounded operands: at most 2 x 2^-11 = 9.8e-4, under the bound. On the
// H200 the worst over four runs (seeds 11-41) was 7.3e-4. A formula error (a decay off by one token, a
// wrong head pairing, a lost chunk boundary or state) moves results by > 1e-2.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_harness.h"

namespace sparkserve {
namespace {

constexpr double kTensorCoreGdn = 1e-3;

enum class Regime { kHfGating, kWeakDecay, kCorrelatedKeys };
const char* regime_name(Regime r) {
  return r == Regime::kHfGating ? "hf-gating" : r == Regime::kWeakDecay ? "weak-decay" : "corr-keys";
}

// Spans (start_pos, num_tokens) on shuffled GDN slots, rows in order.
BatchLayout gdn_spans(const std::vector<std::array<int64_t, 2>>& spans, int32_t num_slots) {
  std::vector<int32_t> slots(static_cast<size_t>(num_slots));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), g_rng);
  BatchLayout b;
  for (size_t i = 0; i < spans.size(); ++i) {
    SeqSpan sp;
    sp.row_begin = b.total_rows;
    sp.start_pos = spans[i][0];
    sp.num_tokens = spans[i][1];
    sp.gdn_slot = slots.at(i);
    b.total_rows += sp.num_tokens;
    b.seqs.push_back(sp);
  }
  return b;
}

struct GdnInputs {
  std::vector<float> qkv, g, beta, state;
};

GdnInputs gdn_inputs(const GdnDims& d, int64_t T, int32_t slots, Regime regime) {
  GdnInputs in;
  const int64_t C = d.conv_dim(), Hv = d.num_v_heads, kd = d.key_dim();
  in.qkv = randn(T * C);
  for (int64_t t = 0; t < T; ++t) {  // v as a SiLU output (the conv's), q and k as they come
    for (int64_t c = 2 * kd; c < C; ++c) {
      float& x = in.qkv[static_cast<size_t>(t * C + c)];
      x = 2.0f * x / (1.0f + std::exp(-x));
    }
  }
  if (regime == Regime::kCorrelatedKeys) {  // every key of a head near one direction
    const std::vector<float> dir = randn(kd, 1.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < kd; ++c) {
        float& x = in.qkv[static_cast<size_t>(t * C + kd + c)];
        x = 3.0f * dir[static_cast<size_t>(c)] + x;
      }
  }
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  in.g.resize(static_cast<size_t>(T * Hv));
  if (regime == Regime::kWeakDecay) {
    for (auto& x : in.g) x = -0.05f * u01(g_rng);
  } else {  // HF's gating: g = -exp(A_log) softplus(a + dt_bias), A_log = log U(1, 16)
    std::vector<float> alog(static_cast<size_t>(Hv)), dtb = randn(Hv, 0.5f);
    for (auto& x : alog) x = std::log(1.0f + 15.0f * u01(g_rng));
    const std::vector<float> a = randn(T * Hv, 2.0f);
    for (int64_t i = 0; i < T * Hv; ++i) {
      const float x = a[static_cast<size_t>(i)] + dtb[static_cast<size_t>(i % Hv)];
      in.g[static_cast<size_t>(i)] = -std::exp(alog[static_cast<size_t>(i % Hv)]) * (x > 20.0f ? x : std::log1p(std::exp(x)));
    }
  }
  in.beta = randn(T * Hv, 2.0f);
  for (auto& x : in.beta) x = 1.0f / (1.0f + std::exp(-x));
  in.state = randn(slots * Hv * d.k_head_dim * d.v_head_dim, 0.3f);
  return in;
}

std::string dims_name(const GdnDims& d) {
  return "hk" + std::to_string(d.num_k_heads) + " hv" + std::to_string(d.num_v_heads) + " dk" +
         std::to_string(d.k_head_dim) + " dv" + std::to_string(d.v_head_dim);
}

// One batch through both backends; records out and state.
void check_batch(Harness& h, const GdnDims& d, const std::vector<std::array<int64_t, 2>>& spans, Regime regime,
                 const std::string& tag) {
  const int32_t slots = static_cast<int32_t>(spans.size()) + 2;
  const BatchLayout b = gdn_spans(spans, slots);
  const int64_t T = b.total_rows, Hv = d.num_v_heads;
  const GdnInputs in = gdn_inputs(d, T, slots, regime);
  Pair qkv = h.f32({T, d.conv_dim()}, in.qkv), g = h.f32({T, Hv}, in.g), beta = h.f32({T, Hv}, in.beta),
       st = h.f32({slots, Hv, d.k_head_dim, d.v_head_dim}, in.state), o = h.out({T, Hv, d.v_head_dim});
  h.cpu->gdn_chunked(o.cpu(), qkv.cpu(), g.cpu(), beta.cpu(), st.cpu(), b, d);
  h.gpu->gdn_chunked(o.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st.gpu(), b, d);
  const std::string name = dims_name(d) + " " + regime_name(regime) + " " + tag;
  record("gdn_chunked", name + " out", h.err(o), kTensorCoreGdn);
  record("gdn_chunked", name + " state", h.err(st), kTensorCoreGdn);
}

// A span of n tokens split over two GPU calls (the second continuing from the pooled state) against
// one CPU call over all n. in_batch: each call takes all n rows, its span only its part (the other
// rows belong to no span); else each call only its rows.
void check_split(Harness& h, const GdnDims& d, int64_t n, int64_t first, Regime regime, bool in_batch) {
  const int64_t Hv = d.num_v_heads, C = d.conv_dim();
  const GdnInputs in = gdn_inputs(d, n, 1, regime);
  BatchLayout whole = gdn_spans({{0, n}}, 1);
  Pair qkv = h.f32({n, C}, in.qkv), g = h.f32({n, Hv}, in.g), beta = h.f32({n, Hv}, in.beta),
       st = h.f32({1, Hv, d.k_head_dim, d.v_head_dim}, in.state), o = h.out({n, Hv, d.v_head_dim});
  h.cpu->gdn_chunked(o.cpu(), qkv.cpu(), g.cpu(), beta.cpu(), st.cpu(), whole, d);
  for (auto [start, len] : {std::array<int64_t, 2>{0, first}, std::array<int64_t, 2>{first, n - first}}) {
    BatchLayout part = gdn_spans({{start, len}}, 1);
    if (in_batch) {
      part.seqs[0].row_begin = start;
      part.total_rows = n;
      h.gpu->gdn_chunked(o.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st.gpu(), part, d);
    } else {
      h.gpu->gdn_chunked(o.gpu().rows(start, len), qkv.gpu().rows(start, len), g.gpu().rows(start, len),
                         beta.gpu().rows(start, len), st.gpu(), part, d);
    }
  }
  const std::string name = dims_name(d) + " " + regime_name(regime) + " " + std::to_string(n) + " as " +
                           std::to_string(first) + "+" + std::to_string(n - first) + (in_batch ? " in one batch" : "");
  record("gdn_chunked", name + " out", h.err(o), kTensorCoreGdn);
  record("gdn_chunked", name + " state", h.err(st), kTensorCoreGdn);
}

// State saves inside spans (SeqSpan::saves; saves[i]: span i's save positions, into the pool rows
// past the slots). One GPU call with the saves against
//  - the same GPU call without them: outputs and live slots bit for bit (a save only adds stores);
//  - the CPU's call with them: every row of the pool, kTensorCoreGdn;
//  - per save, a GPU call over the span's tokens up to it from the same prior state (a forward that
//    stops there): kSaveVsStop. That call's last chunk ends at the save, the saving call computes the
//    same chunk's state from the full chunk's V' (the same values: V'_j depends on tokens <= j) with
//    the same decay factors; what may differ is the power-of-two scale of the chunk's rows (their
//    maximum over 64 tokens instead of those up to the save), exact in fp32 but able to move an fp16
//    operand into or out of the subnormal range (below 2^-19 of its row's maximum), a change below
//    2^-24 of the row's maximum per operand: 1e-6 leaves room for 64 such terms per entry.
constexpr double kSaveVsStop = 1e-6;

void check_saves(Harness& h, const GdnDims& d, const std::vector<std::array<int64_t, 2>>& spans,
                 const std::vector<std::vector<int64_t>>& saves, Regime regime, const std::string& tag) {
  const int32_t slots = static_cast<int32_t>(spans.size()) + 1;
  BatchLayout b = gdn_spans(spans, slots);
  std::vector<std::vector<GdnStateSave>> at(spans.size());
  int32_t rows = slots;
  for (size_t i = 0; i < spans.size(); ++i) {
    for (int64_t t : saves[i]) at[i].push_back({t, rows++});
    b.seqs[i].saves = at[i].data();
    b.seqs[i].num_saves = static_cast<int64_t>(at[i].size());
  }
  const int64_t T = b.total_rows, Hv = d.num_v_heads, row_n = Hv * d.k_head_dim * d.v_head_dim;
  const GdnInputs in = gdn_inputs(d, T, rows, regime);
  const std::vector<int64_t> pool = {rows, Hv, d.k_head_dim, d.v_head_dim};
  Pair qkv = h.f32({T, d.conv_dim()}, in.qkv), g = h.f32({T, Hv}, in.g), beta = h.f32({T, Hv}, in.beta),
       st = h.f32(pool, in.state), o = h.out({T, Hv, d.v_head_dim});
  h.cpu->gdn_chunked(o.cpu(), qkv.cpu(), g.cpu(), beta.cpu(), st.cpu(), b, d);
  h.gpu->gdn_chunked(o.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st.gpu(), b, d);
  const std::string name = dims_name(d) + " " + regime_name(regime) + " " + tag;
  record("gdn_chunked", name + " saves: out", h.err(o), kTensorCoreGdn);
  record("gdn_chunked", name + " saves: pool", h.err(st), kTensorCoreGdn);
  const std::vector<float> got = h.gpu_f(st), got_out = h.gpu_f(o);
  auto row_of = [&](const std::vector<float>& v, int64_t r) {
    return std::vector<float>(v.begin() + r * row_n, v.begin() + (r + 1) * row_n);
  };
  // Without saves.
  BatchLayout plain = b;
  for (SeqSpan& sp : plain.seqs) sp.num_saves = 0;
  Pair st0 = h.f32(pool, in.state), o0 = h.out({T, Hv, d.v_head_dim});
  h.gpu->gdn_chunked(o0.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st0.gpu(), plain, d);
  const std::vector<float> plain_st = h.gpu_f(st0);
  record("gdn_chunked", name + " saves: out, slots as without", std::max(rel_err(got_out, h.gpu_f(o0)),
         rel_err(std::vector<float>(got.begin(), got.begin() + slots * row_n),
                 std::vector<float>(plain_st.begin(), plain_st.begin() + slots * row_n))), kExact);
  // Each save against a call that stops there.
  double worst = 0.0;
  for (size_t i = 0; i < spans.size(); ++i)
    for (const GdnStateSave& v : at[i]) {
      BatchLayout stop;
      stop.total_rows = T;
      stop.seqs.push_back(plain.seqs[i]);
      stop.seqs[0].num_tokens = v.tokens;
      Pair st1 = h.f32(pool, in.state), o1 = h.out({T, Hv, d.v_head_dim});
      h.gpu->gdn_chunked(o1.gpu(), qkv.gpu(), g.gpu(), beta.gpu(), st1.gpu(), stop, d);
      worst = std::max(worst, rel_err(row_of(got, v.row), row_of(h.gpu_f(st1), stop.seqs[0].gdn_slot)));
    }
  record("gdn_chunked", name + " saves vs calls stopping there", worst, kSaveVsStop);
}

void test_gdn_chunked(Harness& h) {
  const GdnDims small{2, 8, 128, 128, 4};
  // Every length 1..200 would take minutes of CPU reference; these hit odd sizes, the chunk
  // boundaries +-1, and several chunks with a partial last one.
  for (int64_t n : {1, 2, 7, 31, 63, 64, 65, 100, 127, 128, 129, 191, 192, 200})
    check_batch(h, small, {{0, n}}, Regime::kHfGating, "T" + std::to_string(n));
  for (Regime r : {Regime::kHfGating, Regime::kWeakDecay, Regime::kCorrelatedKeys}) {
    check_batch(h, small, {{0, 8192}}, r, "T8192");
    check_batch(h, small, {{0, 150}, {333, 77}, {64, 1}, {1000, 64}, {5, 129}}, r, "5 spans continued");
    check_split(h, small, 300, 131, r, /*in_batch=*/false);
    check_split(h, small, 300, 131, r, /*in_batch=*/true);
    // A later agent turn (saves 2 and 0 tokens before its end), and saves after the first token,
    // inside and at the end of chunks, on a single-token span, at a span's end.
    check_saves(h, small, {{10240, 338}}, {{335, 337}}, r, "agent turn");
    check_saves(h, small, {{0, 150}, {333, 77}, {64, 1}, {1000, 64}, {5, 129}},
                {{1, 64, 100, 150}, {}, {1}, {63, 64}, {2, 65, 127, 128}}, r, "5 spans");
  }
  check_saves(h, GdnDims{16, 64, 128, 128, 4}, {{0, 300}, {9, 1}}, {{127, 128, 129, 299}, {1}}, Regime::kHfGating,
              "2 spans");
  check_saves(h, GdnDims{2, 6, 128, 32, 4}, {{0, 257}, {3, 70}}, {{200}, {1, 69}}, Regime::kCorrelatedKeys,
              "2 spans");
  // The 122B's heads (16 key, 64 value), several spans; other head ratios and value widths (the
  // kernel's 64-, 32- and 16-column slices).
  check_batch(h, GdnDims{16, 64, 128, 128, 4}, {{0, 300}, {517, 129}, {9, 1}, {64, 64}}, Regime::kHfGating,
              "4 spans");
  check_batch(h, GdnDims{16, 64, 128, 128, 4}, {{0, 1000}}, Regime::kWeakDecay, "T1000");
  check_batch(h, GdnDims{4, 4, 128, 64, 4}, {{0, 200}, {40, 99}}, Regime::kWeakDecay, "2 spans");
  check_batch(h, GdnDims{2, 6, 128, 32, 4}, {{0, 257}, {3, 70}}, Regime::kCorrelatedKeys, "2 spans");
  check_batch(h, GdnDims{1, 2, 128, 16, 4}, {{0, 190}}, Regime::kWeakDecay, "T190");
}

RegisterOpChecks register_gdn_chunked("gdn_chunked", test_gdn_chunked);

}  // namespace
}  // namespace sparkserve
