// GPU tests (issue 6), run where a CUDA device is present (exit code 77 = skipped otherwise):
//  1. every op of backend/ops.h on the CUDA backend vs the CPU reference backend, on fresh random
//     inputs of several sizes (seed printed; --seed N repeats a run);
//  2. every fixture under tests/fixtures/qwen35-*: teacher-forced logits on CUDA vs the CPU backend
//     and vs transformers' fp32 reference, cached decode (prefill + one token at a time) vs the
//     reference decode logits and the exact greedy ids, prefill+decode == recompute, batched == alone.
// Error metric everywhere: max|cuda - ref| / max|ref| over the whole output (the project's metric).
// Bounds, and why:
//  - kExact (0): copies, index ops, argmax, top-k ids: no arithmetic, must be bit-identical.
//  - kFp32 (1e-5): fp32 arithmetic in another summation order (warp-tree and tiled sums vs the CPU's
//    8-lane dot, block vs sequential reductions, expf/cosf vs glibc): relative rounding ~1e-7 per
//    op, growing like sqrt(K) in long dot products; 1e-5 leaves room for K up to ~10^4 and is far
//    below what a wrong formula gives (an eps placement, a bf16 rounding, a mis-paired head: >1e-3).
//  - kForms (1e-4): gdn_chunked for head sizes other than 128, whose CUDA version runs the
//    token-by-token recurrence while the CPU reference runs the chunked (I+L)^-1 form: equal in exact
//    arithmetic, different fp32 rounding through the triangular solve; the CPU tests bound recurrent
//    vs chunked at the same level. k_head_dim 128 runs the tensor-core chunk kernel: 1e-3
//    (gdn_chunked_checks.cpp says why).
//  - model logits vs transformers: 1e-4 (tests/python/test_model_reference.py's fp32 bound); CUDA vs
//    CPU logits and batched vs alone: 1e-4 too (a forward chains ~50 ops of the kFp32 kind).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/nvfp4.h"
#include "core/npy.h"
#include "model/load.h"
#include "gpu_harness.h"
#include "runtime/direct_state.h"

namespace sparkserve {
int run_bench_kernels(Backend& gpu, const std::string& filter);  // bench_kernels.cpp
namespace {

// ---- op tests ---------------------------------------------------------------------------------

void test_dense(Harness& h) {
  for (bool bf16 : {false, true})
    for (auto [V, H, T] : std::vector<std::array<int64_t, 3>>{{1000, 64, 5}, {4096, 1024, 37}}) {
      Weight w = make_weight(h, {V, H}, bf16, 1.0f);
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& i : ids) i = static_cast<int32_t>(g_rng() % V);
      ids[0] = 0;
      ids[1] = static_cast<int32_t>(V - 1);
      Pair id = h.i32({T}, ids), o = h.out({T, H});
      h.cpu->embedding(o.cpu(), id.cpu(), w.cpu_lin);
      h.gpu->embedding(o.gpu(), id.gpu(), w.gpu_lin);
      record("embedding", std::string(bf16 ? "bf16 " : "f32 ") + sz({V, H, T}), h.err(o), kExact);
    }
  for (auto [R, D] : std::vector<std::array<int64_t, 2>>{{1, 32}, {7, 256}, {64, 3072}, {300, 128}}) {
    auto xv = randn(R * D, 3.0f), wv = randn(D, 0.5f), dv = randn(R * D);
    Pair x = h.f32({R, D}, xv), w = h.f32({D}, wv), o = h.out({R, D});
    h.cpu->rmsnorm(o.cpu(), x.cpu(), w.cpu(), 1e-6f);
    h.gpu->rmsnorm(o.gpu(), x.gpu(), w.gpu(), 1e-6f);
    record("rmsnorm", sz({R, D}), h.err(o), kFp32);
    h.cpu->rmsnorm(x.cpu(), x.cpu(), w.cpu(), 1e-6f);  // in place (out aliases x)
    h.gpu->rmsnorm(x.gpu(), x.gpu(), w.gpu(), 1e-6f);
    record("rmsnorm", "in place " + sz({R, D}), h.err(x), kFp32);
    Pair res = h.f32({R, D}, xv), d = h.f32({R, D}, dv), o2 = h.out({R, D});
    h.cpu->add_rmsnorm(res.cpu(), o2.cpu(), d.cpu(), w.cpu(), 1e-6f);
    h.gpu->add_rmsnorm(res.gpu(), o2.gpu(), d.gpu(), w.gpu(), 1e-6f);
    record("add_rmsnorm", "residual " + sz({R, D}), h.err(res), kFp32);
    record("add_rmsnorm", "out " + sz({R, D}), h.err(o2), kFp32);
    Pair z = h.f32({R, D}, randn(R * D, 2.0f)), o3 = h.out({R, D});
    h.cpu->gated_rmsnorm(o3.cpu(), d.cpu(), z.cpu(), w.cpu(), 1e-6f);
    h.gpu->gated_rmsnorm(o3.gpu(), d.gpu(), z.gpu(), w.gpu(), 1e-6f);
    record("gated_rmsnorm", sz({R, D}), h.err(o3), kFp32);
  }
  for (bool bf16 : {false, true})
    for (auto [T, K, N] : std::vector<std::array<int64_t, 3>>{
             {1, 64, 1000}, {1, 3072, 1024}, {4, 1024, 4096}, {8, 100, 37}, {16, 2048, 512},
             {17, 1024, 512}, {100, 640, 2048}, {300, 3072, 256}, {64, 33, 65}}) {
      Weight w = make_weight(h, {N, K}, bf16, 1.0f / std::sqrt(static_cast<float>(K)));
      Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
      h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
      h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
      record("linear", std::string(bf16 ? "bf16 " : "f32 ") + "TxKxN " + sz({T, K, N}), h.err(o), kFp32);
    }
  for (auto [T, I] : std::vector<std::array<int64_t, 2>>{{1, 40}, {33, 1024}}) {
    Pair gu = h.f32({T, 2 * I}, randn(T * 2 * I, 3.0f)), o = h.out({T, I});
    h.cpu->silu_mul(o.cpu(), gu.cpu());
    h.gpu->silu_mul(o.gpu(), gu.gpu());
    record("silu_mul", sz({T, I}), h.err(o), kFp32);
    Pair a = h.f32({T, I}, randn(T * I)), b = h.f32({T, I}, randn(T * I, 4.0f)), s = h.out({T, I});
    h.cpu->add(s.cpu(), a.cpu(), b.cpu());
    h.gpu->add(s.gpu(), a.gpu(), b.gpu());
    record("add", sz({T, I}), h.err(s), kExact);
    h.cpu->sigmoid_mul(a.cpu(), b.cpu());
    h.gpu->sigmoid_mul(a.gpu(), b.gpu());
    record("sigmoid_mul", sz({T, I}), h.err(a), kFp32);
    Pair gl = h.f32({T, 1}, randn(T, 3.0f));
    h.cpu->add_sigmoid_scaled(b.cpu(), s.cpu(), gl.cpu());
    h.gpu->add_sigmoid_scaled(b.gpu(), s.gpu(), gl.gpu());
    record("add_sigmoid_sc", sz({T, I}), h.err(b), kFp32);
    std::vector<int64_t> rows;
    for (int64_t r = T - 1; r >= 0; r -= 2) rows.push_back(r);
    rows.push_back(0);
    Pair gth = h.out({static_cast<int64_t>(rows.size()), I});
    // From `s`, which is bit-identical on both sides (a and b went through expf above).
    h.cpu->gather_rows(gth.cpu(), s.cpu(), rows);
    h.gpu->gather_rows(gth.gpu(), s.gpu(), rows);
    record("gather_rows", sz({T, I}), h.err(gth), kExact);
    std::vector<int32_t> rows32(rows.begin(), rows.end());
    Pair idx = h.i32({static_cast<int64_t>(rows32.size())}, rows32), gat = h.out({static_cast<int64_t>(rows.size()), I});
    h.cpu->gather_rows_at(gat.cpu(), s.cpu(), idx.cpu());
    h.gpu->gather_rows_at(gat.gpu(), s.gpu(), idx.gpu());
    record("gather_rows_at", sz({T, I}), h.err(gat), kExact);
  }
  // Rows with a tie for the maximum (the lower index must win), all -inf but one column, NaN and
  // +Inf (reported at their first index; NaN never chosen), and a vocabulary limit below V.
  for (auto [R, V, vocab] : std::vector<std::array<int64_t, 3>>{{1, 1000, 1000}, {3, 10003, 9999}, {9, 248320, 248320}, {64, 248320, 248077}}) {
    auto v = randn(R * V);
    for (int64_t r = 0; r < R; ++r) {
      auto* row = v.data() + r * V;
      const int64_t at = static_cast<int64_t>(std::max_element(row, row + vocab) - row);
      const int64_t other = (at * 7 + 13 + r) % vocab;
      row[std::min(at, other)] = row[std::max(at, other)] = row[at] + 1.0f;
      if (r % 4 == 1) row[(r * 977) % vocab] = std::numeric_limits<float>::quiet_NaN();
      if (r % 4 == 2) row[(r * 331) % vocab] = std::numeric_limits<float>::infinity();
      if (r % 4 == 3) std::fill(row, row + V, -std::numeric_limits<float>::infinity()), row[(r * 53) % vocab] = -3.0f;
      if (vocab < V) row[vocab] = 1e30f;  // beyond the limit: never chosen
    }
    Pair l = h.f32({R, V}, v);
    // Excluded columns (min_tokens' stop ids): row 0's maximum and its tie partner, a NaN column of
    // row 1 (still reported as non-finite) and one past the limit.
    std::vector<int32_t> excluded;
    {
      const float* row = v.data();
      const int64_t at = static_cast<int64_t>(std::max_element(row, row + vocab) - row);
      excluded = {static_cast<int32_t>(at), static_cast<int32_t>((at * 7 + 13) % vocab), static_cast<int32_t>(vocab)};
      if (R > 1) excluded.push_back(static_cast<int32_t>(977 % vocab));
    }
    for (const std::vector<int32_t>& ex : {std::vector<int32_t>{}, excluded}) {
      auto a = h.cpu->argmax(l.cpu(), vocab, ex), b = h.gpu->argmax(l.gpu(), vocab, ex);
      int64_t bad = 0;
      for (size_t i = 0; i < a.size(); ++i) bad += !(a[i] == b[i]);
      record("argmax", "ties, NaN, +Inf, -inf rows " + sz({R, V}) + " vocab " + std::to_string(vocab) +
                           (ex.empty() ? "" : ", " + std::to_string(ex.size()) + " columns excluded"),
             b.size() == a.size() ? static_cast<double>(bad) : INFINITY, kExact);
    }
  }
}

void test_attention(Harness& h) {
  struct Case { int64_t nh, kvh, hd, rot; };
  for (Case c : {Case{4, 2, 32, 8}, Case{32, 2, 256, 64}, Case{8, 8, 128, 128}}) {
    const int64_t bs = 16;
    const int32_t num_blocks = 64;
    Spans sp = make_spans({{0, 37}, {50, 5}, {200, 1}, {700, 1}}, bs, num_blocks, 4);
    const int64_t T = sp.layout.total_rows;
    // q/gate split.
    Pair qg = h.f32({T, c.nh, 2 * c.hd}, randn(T * c.nh * 2 * c.hd)), q = h.out({T, c.nh, c.hd}),
         gate = h.out({T, c.nh, c.hd});
    h.cpu->split_query_gate(q.cpu(), gate.cpu(), qg.cpu());
    h.gpu->split_query_gate(q.gpu(), gate.gpu(), qg.gpu());
    const std::string name = "nh" + std::to_string(c.nh) + " kvh" + std::to_string(c.kvh) + " hd" + std::to_string(c.hd);
    record("split_q_gate", name, std::max(h.err(q), h.err(gate)), kExact);
    // RoPE at the spans' positions (large positions included).
    std::vector<int32_t> pos;
    for (auto& s : sp.layout.seqs)
      for (int64_t i = 0; i < s.num_tokens; ++i) pos.push_back(static_cast<int32_t>(s.start_pos + i));
    pos.back() = 40000;
    Pair p = h.i32({T}, pos);
    h.cpu->rope(q.cpu(), p.cpu(), c.rot, 1e7);
    h.gpu->rope(q.gpu(), p.gpu(), c.rot, 1e7);
    record("rope", name + " rot" + std::to_string(c.rot), h.err(q), kFp32);
    // KV pools with random old contents, then this batch's writes.
    const int64_t pool_n = num_blocks * bs * c.kvh * c.hd;
    Pair kp = h.f32({num_blocks, bs, c.kvh, c.hd}, randn(pool_n)), vp = h.f32({num_blocks, bs, c.kvh, c.hd}, randn(pool_n));
    Pair k = h.f32({T, c.kvh, c.hd}, randn(T * c.kvh * c.hd)), v = h.f32({T, c.kvh, c.hd}, randn(T * c.kvh * c.hd));
    const KvPool cpu_pool{kp.cpu(), vp.cpu(), {}, {}}, gpu_pool{kp.gpu(), vp.gpu(), {}, {}};
    h.cpu->kv_cache_write(cpu_pool, k.cpu(), v.cpu(), sp.layout);
    h.gpu->kv_cache_write(gpu_pool, k.gpu(), v.gpu(), sp.layout);
    record("kv_cache_write", name, std::max(h.err(kp), h.err(vp)), kExact);
    AttentionDims d{c.nh, c.kvh, c.hd, bs, 1.0f / std::sqrt(static_cast<float>(c.hd))};
    // Scale q up so the softmax is peaked, as trained models' are (exercises the running max).
    Pair q2 = h.f32({T, c.nh, c.hd}, randn(T * c.nh * c.hd, 2.0f)), o = h.out({T, c.nh, c.hd});
    h.cpu->attention(o.cpu(), q2.cpu(), cpu_pool, sp.layout, d);
    h.gpu->attention(o.gpu(), q2.gpu(), gpu_pool, sp.layout, d);
    record("attention", name + " prefill+decode", h.err(o), kFp32);
  }
}

void test_gdn(Harness& h) {
  struct Case { int64_t hk, hv, dk, dv, K; };
  for (Case c : {Case{2, 6, 16, 24, 4}, Case{16, 64, 128, 128, 4}, Case{4, 4, 64, 32, 3}}) {
    GdnDims d{c.hk, c.hv, c.dk, c.dv, c.K};
    const int64_t C = d.conv_dim();
    const int32_t slots = 5;
    const std::string name = "hk" + std::to_string(c.hk) + " hv" + std::to_string(c.hv) + " dk" +
                             std::to_string(c.dk) + " dv" + std::to_string(c.dv);
    for (bool decode : {false, true}) {
      Spans sp = decode ? make_spans({{3, 1}, {0, 1}, {90, 1}}, 16, 64, slots)
                        : make_spans({{0, 70}, {12, 5}, {0, 130}, {7, 2}}, 16, 64, slots);
      const int64_t T = sp.layout.total_rows;
      const std::string tag = name + (decode ? " decode" : " prefill");
      // State saves (SeqSpan::saves) into the pool rows past the slots: after the first token, inside
      // and at the end of a chunk, at a span's end; conv, recurrent and chunked ops write them, and
      // the whole pools (slots and save rows) are compared.
      const std::vector<std::vector<GdnStateSave>> saves =
          decode ? std::vector<std::vector<GdnStateSave>>{{{1, slots}}, {}, {{1, slots + 1}}}
                 : std::vector<std::vector<GdnStateSave>>{{{1, slots}, {35, slots + 1}, {64, slots + 2}},
                                                          {},
                                                          {{100, slots + 3}, {130, slots + 4}},
                                                          {{1, slots + 5}}};
      for (size_t i = 0; i < saves.size(); ++i) {
        sp.layout.seqs[i].saves = saves[i].data();
        sp.layout.seqs[i].num_saves = static_cast<int64_t>(saves[i].size());
      }
      const int32_t rows = slots + 6;
      // Conv with random prior state.
      const std::vector<float> cs0 = randn(rows * C * (c.K - 1));
      Pair mixed = h.f32({T, C}, randn(T * C)), w = h.f32({C, c.K}, randn(C * c.K, 0.5f)),
           cs = h.f32({rows, C, c.K - 1}, cs0), qkv = h.out({T, C});
      h.cpu->gdn_conv(qkv.cpu(), mixed.cpu(), w.cpu(), cs.cpu(), sp.layout);
      h.gpu->gdn_conv(qkv.gpu(), mixed.gpu(), w.gpu(), cs.gpu(), sp.layout);
      record("gdn_conv", tag + " out", h.err(qkv), kFp32);
      record("gdn_conv", tag + " state", h.err(cs), kFp32);
      if (!decode) {
        // On the GPU in two calls over the same batch, each span cut after a third of its rows (the
        // rows of the other call belong to no span; no saves: the save rows keep their contents).
        Pair cs2 = h.f32({rows, C, c.K - 1}, cs0), qkv2 = h.out({T, C});
        for (int round = 0; round < 2; ++round) {
          BatchLayout part = sp.layout;
          for (SeqSpan& s : part.seqs) {
            s.num_saves = 0;
            const int64_t cut = (s.num_tokens + 1) / 3;
            if (round == 1) s.row_begin += cut, s.start_pos += cut;
            s.num_tokens = round == 0 ? cut : s.num_tokens - cut;
          }
          h.gpu->gdn_conv(qkv2.gpu(), mixed.gpu(), w.gpu(), cs2.gpu(), part);
        }
        const std::vector<float> cs_cpu = h.cpu_f(cs), cs_split = h.gpu_f(cs2);
        const size_t live = static_cast<size_t>(slots * C * (c.K - 1));
        record("gdn_conv", tag + " in 2 rounds out", rel_err(h.gpu_f(qkv2), h.cpu_f(qkv)), kFp32);
        record("gdn_conv", tag + " in 2 rounds state",
               rel_err(std::vector<float>(cs_split.begin(), cs_split.begin() + live),
                       std::vector<float>(cs_cpu.begin(), cs_cpu.begin() + live)), kFp32);
      }
      // Gating from random a/b (A_log, dt_bias as initialised by HF: log U(1,16), small bias).
      Pair a = h.f32({T, c.hv}, randn(T * c.hv, 2.0f)), b = h.f32({T, c.hv}, randn(T * c.hv, 2.0f));
      std::vector<float> alog(static_cast<size_t>(c.hv)), dtb = randn(c.hv, 0.5f);
      for (auto& x : alog) x = std::log(1.0f + 15.0f * std::uniform_real_distribution<float>(0, 1)(g_rng));
      Pair Al = h.f32({c.hv}, alog), dt = h.f32({c.hv}, dtb), g = h.out({T, c.hv}), beta = h.out({T, c.hv});
      h.cpu->gdn_gating(g.cpu(), beta.cpu(), a.cpu(), b.cpu(), Al.cpu(), dt.cpu());
      h.gpu->gdn_gating(g.gpu(), beta.gpu(), a.gpu(), b.gpu(), Al.gpu(), dt.gpu());
      record("gdn_gating", tag + " g", h.err(g), kFp32);
      record("gdn_gating", tag + " beta", h.err(beta), kFp32);
      // Delta rule from the same inputs on both sides (the CPU's qkv/g/beta), random prior state.
      Pair qkv_in = h.f32({T, C}, h.cpu_f(qkv)), g_in = h.f32({T, c.hv}, h.cpu_f(g)),
           b_in = h.f32({T, c.hv}, h.cpu_f(beta));
      Pair st = h.f32({rows, c.hv, c.dk, c.dv}, randn(rows * c.hv * c.dk * c.dv, 0.3f)),
           o = h.out({T, c.hv, c.dv});
      if (decode) {
        h.cpu->gdn_recurrent(o.cpu(), qkv_in.cpu(), g_in.cpu(), b_in.cpu(), st.cpu(), sp.layout, d);
        h.gpu->gdn_recurrent(o.gpu(), qkv_in.gpu(), g_in.gpu(), b_in.gpu(), st.gpu(), sp.layout, d);
        record("gdn_recurrent", tag + " out", h.err(o), kFp32);
        record("gdn_recurrent", tag + " state", h.err(st), kFp32);
      } else {
        h.cpu->gdn_chunked(o.cpu(), qkv_in.cpu(), g_in.cpu(), b_in.cpu(), st.cpu(), sp.layout, d);
        h.gpu->gdn_chunked(o.gpu(), qkv_in.gpu(), g_in.gpu(), b_in.gpu(), st.gpu(), sp.layout, d);
        // k_head_dim 128 runs the tensor-core chunk kernel (fp16 operands: bound and reasons in
        // gdn_chunked_checks.cpp), other head sizes the token-by-token recurrence (kForms).
        const double bound = c.dk == 128 ? 1e-3 : kForms;
        record("gdn_chunked", tag + " out", h.err(o), bound);
        record("gdn_chunked", tag + " state", h.err(st), bound);
      }
    }
    // Speculative verify: spans of 1..4 tokens (a verify step's next token + drafts) from random
    // states, which both backends must leave untouched (bound 0: nothing may be written).
    Spans sp = make_spans({{3, 4}, {0, 1}, {90, 3}, {17, 2}}, 16, 64, slots);
    const int64_t T = sp.layout.total_rows;
    Pair mixed = h.f32({T, C}, randn(T * C)), w = h.f32({C, c.K}, randn(C * c.K, 0.5f)),
         cs = h.f32({slots, C, c.K - 1}, randn(slots * C * (c.K - 1))), qkv = h.out({T, C});
    Pair g = h.f32({T, c.hv}, randn(T * c.hv, 0.5f)), beta = h.f32({T, c.hv}, randn(T * c.hv, 0.5f));
    for (Pair* p : {&g, &beta}) {  // g <= 0 (a decay), beta in (0, 1), as gdn_gating makes them
      std::vector<float> v = h.cpu_f(*p);
      for (float& x : v) x = p == &g ? -std::fabs(x) : 1.0f / (1.0f + std::exp(-x));
      *p = h.f32({T, c.hv}, v);
    }
    Pair st = h.f32({slots, c.hv, c.dk, c.dv}, randn(slots * c.hv * c.dk * c.dv, 0.3f)), o = h.out({T, c.hv, c.dv});
    h.cpu->gdn_verify(o.cpu(), qkv.cpu(), mixed.cpu(), w.cpu(), g.cpu(), beta.cpu(), cs.cpu(), st.cpu(), sp.layout, d);
    h.gpu->gdn_verify(o.gpu(), qkv.gpu(), mixed.gpu(), w.gpu(), g.gpu(), beta.gpu(), cs.gpu(), st.gpu(), sp.layout, d);
    record("gdn_verify", name + " qkv", h.err(qkv), kFp32);
    record("gdn_verify", name + " out", h.err(o), kFp32);
    record("gdn_verify", name + " states unchanged", std::max(h.err(cs), h.err(st)), kExact);
    // The fused verify chain (a/b projections, gating, gdn_verify, gated norm; gates out) against the
    // CPU's composition of those ops. Bound kForms (1e-4): fp32 on both sides in other summation
    // orders (the H-term a/b products split across a cluster's blocks, warp-shuffle L2 and RMS sums),
    // CUDA's expf/log1pf against libm; the H = 512 a/b products move decay and beta by ~1e-6 relative,
    // carried through up to 4 tokens of state and the norm's rescale (fused decode step: the same).
    if (c.dv >= 16 && c.dv % 8 == 0 && c.dk <= 128) {
      const int64_t H = 512;
      for (bool bf16 : {true, false}) {
        Weight wa = make_weight(h, {c.hv, H}, bf16, 3.0f / std::sqrt(static_cast<float>(H)));
        Weight wb = make_weight(h, {c.hv, H}, bf16, 3.0f / std::sqrt(static_cast<float>(H)));
        std::vector<float> alog(static_cast<size_t>(c.hv));
        for (auto& x : alog) x = std::log(1.0f + 15.0f * std::uniform_real_distribution<float>(0, 1)(g_rng));
        Pair Al = h.f32({c.hv}, alog), dt = h.f32({c.hv}, randn(c.hv, 0.5f)), nw = h.f32({c.dv}, randn(c.dv, 0.3f));
        Pair hid = h.f32({T, H}, randn(T * H)), z = h.f32({T, c.hv * c.dv}, randn(T * c.hv * c.dv));
        Pair out = h.out({T, c.hv * c.dv}), g2 = h.out({T, c.hv}), b2 = h.out({T, c.hv});
        h.cpu->gdn_verify_step(out.cpu(), g2.cpu(), b2.cpu(), hid.cpu(), mixed.cpu(), z.cpu(), wa.cpu_lin, wb.cpu_lin,
                               w.cpu(), Al.cpu(), dt.cpu(), nw.cpu(), 1e-6f, cs.cpu(), st.cpu(), sp.layout, d);
        h.gpu->gdn_verify_step(out.gpu(), g2.gpu(), b2.gpu(), hid.gpu(), mixed.gpu(), z.gpu(), wa.gpu_lin, wb.gpu_lin,
                               w.gpu(), Al.gpu(), dt.gpu(), nw.gpu(), 1e-6f, cs.gpu(), st.gpu(), sp.layout, d);
        const std::string tag = name + (bf16 ? " bf16 a/b" : " f32 a/b");
        record("gdn_verify_step", tag + " out", h.err(out), kForms);
        record("gdn_verify_step", tag + " g, beta", std::max(h.err(g2), h.err(b2)), kForms);
        record("gdn_verify_step", tag + " states unchanged", std::max(h.err(cs), h.err(st)), kExact);
        // The decode form of the same kernel (four single-token spans, both states advance), from
        // copies of the states (the checks above need them unchanged).
        Spans one = make_spans({{3, 1}, {0, 1}, {90, 1}, {17, 1}}, 16, 64, slots);
        const int64_t T1 = one.layout.total_rows;
        Pair cs1 = h.f32({slots, C, c.K - 1}, h.cpu_f(cs)), st1 = h.f32({slots, c.hv, c.dk, c.dv}, h.cpu_f(st));
        Pair hid1 = h.f32({T1, H}, randn(T1 * H)), mixed1 = h.f32({T1, C}, randn(T1 * C)),
             z1 = h.f32({T1, c.hv * c.dv}, randn(T1 * c.hv * c.dv)), out1 = h.out({T1, c.hv * c.dv});
        h.cpu->gdn_decode_step(out1.cpu(), hid1.cpu(), mixed1.cpu(), z1.cpu(), wa.cpu_lin, wb.cpu_lin, w.cpu(),
                               Al.cpu(), dt.cpu(), nw.cpu(), 1e-6f, cs1.cpu(), st1.cpu(), one.layout, d);
        h.gpu->gdn_decode_step(out1.gpu(), hid1.gpu(), mixed1.gpu(), z1.gpu(), wa.gpu_lin, wb.gpu_lin, w.gpu(),
                               Al.gpu(), dt.gpu(), nw.gpu(), 1e-6f, cs1.gpu(), st1.gpu(), one.layout, d);
        record("gdn_decode_step", tag + " out", h.err(out1), kForms);
        record("gdn_decode_step", tag + " states", std::max(h.err(cs1), h.err(st1)), kForms);
      }
    }
    // gdn_recurrent over the same spans of 1..4 tokens (the GDN commit of a verify's accepted prefix)
    // from the same conv outputs: the state advances.
    Pair qkv_in = h.f32({T, C}, h.cpu_f(qkv)), o2 = h.out({T, c.hv, c.dv});
    h.cpu->gdn_recurrent(o2.cpu(), qkv_in.cpu(), g.cpu(), beta.cpu(), st.cpu(), sp.layout, d);
    h.gpu->gdn_recurrent(o2.gpu(), qkv_in.gpu(), g.gpu(), beta.gpu(), st.gpu(), sp.layout, d);
    record("gdn_recurrent", name + " spans of 1..4 out", h.err(o2), kFp32);
    record("gdn_recurrent", name + " spans of 1..4 state", h.err(st), kFp32);
  }
}

void test_moe(Harness& h) {
  for (auto [T, E, k] : std::vector<std::array<int64_t, 3>>{{1, 8, 3}, {33, 256, 8}, {200, 512, 10}}) {
    Pair l = h.f32({T, E}, randn(T * E, 2.0f)), w = h.out({T, k});
    Pair ids = h.make(DType::kI32, {T, k}, nullptr);
    h.cpu->moe_route_topk(w.cpu(), ids.cpu(), l.cpu());
    h.gpu->moe_route_topk(w.gpu(), ids.gpu(), l.gpu());
    std::vector<int32_t> ic(static_cast<size_t>(T * k)), ig(ic.size());
    h.cpu->download(ic.data(), ids.cpu());
    h.gpu->download(ig.data(), ids.gpu());
    record("moe_route_topk", "ids " + sz({T, E, k}), ic == ig ? 0.0 : 1.0, kExact);
    record("moe_route_topk", "weights " + sz({T, E, k}), h.err(w), kFp32);
  }
  // Slots <= experts take the per-slot GEMV path, more take the grouped GEMM (several 64-row tiles
  // per expert in the last case).
  for (bool bf16 : {false, true})
    for (auto [T, E, k, H, I] : std::vector<std::array<int64_t, 5>>{
             {1, 8, 3, 64, 40}, {5, 16, 4, 256, 128}, {40, 64, 8, 512, 96}, {300, 4, 2, 64, 48}}) {
      Weight gu = make_weight(h, {E, 2 * I, H}, bf16, 1.0f / std::sqrt(static_cast<float>(H)));
      Weight dn = make_weight(h, {E, H, I}, bf16, 1.0f / std::sqrt(static_cast<float>(I)));
      std::vector<int32_t> ids;
      std::vector<float> wts;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), g_rng);
        float sum = 0;
        std::vector<float> ww;
        for (int64_t j = 0; j < k; ++j) {
          ids.push_back(all[static_cast<size_t>(j)]);
          ww.push_back(std::uniform_real_distribution<float>(0.05f, 1.0f)(g_rng));
          sum += ww.back();
        }
        for (float x : ww) wts.push_back(x / sum);
      }
      Pair x = h.f32({T, H}, randn(T * H)), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts), o = h.out({T, H});
      h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
      h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
      record("moe_experts", std::string(bf16 ? "bf16 " : "f32 ") + "TxExkxHxI " + sz({T, E, k, H, I}), h.err(o), kFp32);
    }
}

// ---- quantized linear / experts -------------------------------------------------------------
// Every format x activation the loader produces, linear and experts, decode and prefill sizes.
// Bound kFp32: the weight decode and the activation quantization are the same f32 operations as
// the CPU's (bit-identical x̂ and Ŵ), only the f32 summation order differs.
void test_quant(Harness& h) {
  struct Case {
    WeightFormat fmt;
    ActivationQuant act;
    const char* name;
  };
  const std::vector<Case> cases = {
      {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4-ct w4a4"},
      {WeightFormat::kNvfp4, ActivationQuant::kNone, "nvfp4-ct w4a16"},
      {WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, "nvfp4-mo w4a4"},
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8-ch dyn"},
      {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, "fp8-t static"},
      {WeightFormat::kFp8Channel, ActivationQuant::kNone, "fp8-ch w8a16"},
  };
  for (const auto& c : cases) {
    for (auto [T, K, N, P] : std::vector<std::array<int64_t, 4>>{
             {1, 1024, 512, 1}, {3, 256, 96, 2}, {40, 512, 256, 2}, {1, 64, 48, 3}}) {
      const float amax = 4.0f;
      QWeight w = make_qweight(h, 1, N, K, P, c.fmt, c.act, amax);
      Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
      h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
      h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
      record("quant_linear", std::string(c.name) + " TxKxNxP " + sz({T, K, N, P}), h.err(o),
             tensor_core_w4a4_linear(w.gpu_lin, T) ? kTensorCore : kFp32);
    }
    for (auto [T, E, k, H, I] : std::vector<std::array<int64_t, 5>>{{1, 8, 3, 256, 64}, {20, 16, 4, 128, 96}}) {
      QWeight gu = make_qweight(h, E, 2 * I, H, 2, c.fmt, c.act, 4.0f);
      QWeight dn = make_qweight(h, E, H, I, 1, c.fmt, c.act, 1.0f);
      std::vector<int32_t> ids;
      std::vector<float> wts;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(E));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), g_rng);
        for (int64_t j = 0; j < k; ++j) {
          ids.push_back(all[static_cast<size_t>(j)]);
          wts.push_back(1.0f / static_cast<float>(k));
        }
      }
      Pair x = h.f32({T, H}, randn(T * H)), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts), o = h.out({T, H});
      h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
      h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
      record("quant_moe", std::string(c.name) + " TxExkxHxI " + sz({T, E, k, H, I}), h.err(o), kFp32);
    }
  }
}

// The decode GEMVs (backend/cuda/gemv_dense.cu, gemv_fp8_t1.cu, moe_decode.cu) at the Qwen3.5-122B-A10B shapes (hidden 3072;
// GDN in_proj_qkv 12288, z 8192, out_proj K 8192; attention q 16384, k/v 512, o K 8192; experts
// gate_up 2x1024, down K 1024; router 256; lm_head 248320), T = 1..64 (up to 8 tokens share a weight
// pass, so T = 9, 13, 16, 64 cover the token chunking), every format the nvfp4 / nvfp4-fp8dense
// layouts use plus W4A16 / W8A16 / static FP8 / ModelOpt. Bound kFp32 (1e-5): bit-identical x̂ and
// weight codes; the only difference from the CPU is the f32 summation order and the per-block /
// per-row scale applied after the partial sum instead of to every weight (~1e-7 relative).
void test_decode_paths(Harness& h) {
  struct Dense {
    WeightFormat fmt;
    ActivationQuant act;
    const char* name;
    int64_t N, K, P;
    std::vector<int64_t> Ts;
  };
  const std::vector<Dense> dense = {
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8 dyn gdn qkv", 12288, 3072, 1, {1, 4, 16}},
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8 dyn out_proj", 3072, 8192, 1, {1, 3, 5, 9}},
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8 dyn shared gu", 2048, 3072, 2, {1, 2, 7, 13, 64}},
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8 dyn k_proj", 512, 3072, 1, {1, 8}},
      {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, "fp8 static sh down", 3072, 1024, 1, {1, 6, 64}},
      {WeightFormat::kFp8Channel, ActivationQuant::kNone, "fp8 w8a16 qkv", 12288, 3072, 1, {1, 5}},
      // One-token FP8 rows go round-robin over the grid's warps with 4 / 6 / 8 chunks in flight per
      // lane (by row length): a row count that is no multiple of the 8-row step and wraps the grid
      // several times, and a 128-chunk row (the 4-chunk variant).
      {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, "fp8 static odd rows", 8195, 3072, 1, {1}},
      {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, "fp8 dyn K 2048", 1001, 2048, 1, {1}},
      {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4 w4a4 qkv", 12288, 3072, 1, {1, 4, 16}},
      {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4 w4a4 shared gu", 2048, 3072, 2, {1, 3, 64}},
      {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4 w4a4 out_proj", 3072, 8192, 1, {1, 2}},
      {WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, "nvfp4-mo w4a4 sh down", 3072, 1024, 1, {1, 9}},
      {WeightFormat::kNvfp4, ActivationQuant::kNone, "nvfp4 w4a16 q_proj", 16384, 3072, 1, {1, 2}},
  };
  for (const auto& c : dense)
    for (int64_t T : c.Ts) {
      QWeight w = make_qweight(h, 1, c.N, c.K, c.P, c.fmt, c.act, 4.0f);
      Pair x = h.f32({T, c.K}, randn(T * c.K)), o = h.out({T, c.N});
      h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
      h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
      record("decode_linear", std::string(c.name) + " TxNxK " + sz({T, c.N, c.K}), h.err(o),
             tensor_core_w4a4_linear(w.gpu_lin, T) ? kTensorCore : kFp32);
    }
  // BF16 GEMVs (router, GDN a/b, shared_expert_gate, a tenth of lm_head's rows) for T <= 16.
  for (auto [T, N, K] : std::vector<std::array<int64_t, 3>>{
           {1, 256, 3072}, {3, 64, 3072}, {16, 256, 3072}, {9, 1, 3072}, {1, 24832, 3072}, {4, 24832, 3072}}) {
    Weight w = make_weight(h, {N, K}, true, 1.0f / std::sqrt(static_cast<float>(K)));
    Pair x = h.f32({T, K}, randn(T * K)), o = h.out({T, N});
    h.cpu->linear(o.cpu(), x.cpu(), w.cpu_lin);
    h.gpu->linear(o.gpu(), x.gpu(), w.gpu_lin);
    record("decode_linear", "bf16 TxNxK " + sz({T, N, K}), h.err(o), kFp32);
  }
  // Fused MoE at the 122B expert shapes (H 3072, I 1024, top-8; 12 experts so that tokens share
  // experts at T >= 2), W4A4 as in both NVFP4 layouts, and W4A16 / ModelOpt / static FP8 / bf16.
  struct Moe {
    WeightFormat fmt;
    ActivationQuant act;
    const char* name;
    int64_t E, k, H, I;
    std::vector<int64_t> Ts;
  };
  const std::vector<Moe> moes = {
      {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4 w4a4", 12, 8, 3072, 1024, {1, 2, 5, 16, 64}},
      {WeightFormat::kNvfp4, ActivationQuant::kNone, "nvfp4 w4a16", 12, 8, 3072, 1024, {1, 3}},
      {WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, "nvfp4-mo w4a4", 10, 6, 512, 256, {1, 7}},
      {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, "fp8 static", 10, 8, 1024, 512, {1, 4}},
      {WeightFormat::kFp8Channel, ActivationQuant::kNone, "fp8 w8a16", 10, 8, 1024, 512, {2}},
  };
  for (const auto& c : moes) {
    QWeight gu = make_qweight(h, c.E, 2 * c.I, c.H, 2, c.fmt, c.act, 4.0f);
    QWeight dn = make_qweight(h, c.E, c.H, c.I, 1, c.fmt, c.act, 1.0f);
    for (int64_t T : c.Ts) {
      std::vector<int32_t> ids;
      std::vector<float> wts;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(static_cast<size_t>(c.E));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), g_rng);
        float sum = 0;
        std::vector<float> ww;
        for (int64_t j = 0; j < c.k; ++j) {
          ids.push_back(all[static_cast<size_t>(j)]);
          ww.push_back(std::uniform_real_distribution<float>(0.05f, 1.0f)(g_rng));
          sum += ww.back();
        }
        for (float v : ww) wts.push_back(v / sum);
      }
      Pair x = h.f32({T, c.H}, randn(T * c.H)), id = h.i32({T, c.k}, ids), wt = h.f32({T, c.k}, wts),
           o = h.out({T, c.H});
      h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
      h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
      const std::string name = std::string(c.name) + " TxExkxHxI " + sz({T, c.E, c.k, c.H, c.I});
      if (c.act == ActivationQuant::kNone) {
        record("decode_moe", name, h.err(o), kFp32);
        continue;
      }
      // Re-quantized down input: per-token bound (gpu_harness.h, token_errors).
      const double thr = tensor_core_w4a4_moe(gu.gpu_lin, T) ? kTensorCore : kFp32;
      const auto [worst, flipped] = token_errors(h, o, T, c.H, thr);
      record("decode_moe", name + " all tokens", worst, kFlippedTokenErr);
      record("decode_moe_flips", name + (thr == kFp32 ? " tokens > 1e-5" : " tokens > 1e-4"), flipped,
             flipped_tokens_bound(T));
    }
  }
  // Backend::moe_route_experts: the routing fused into the W4A4 experts' first launch on CUDA, vs
  // the CPU's moe_route_topk -> moe_experts on random router logits. The ids must be identical (the
  // fused kernel runs route_topk's own device function) and the weights within 1e-5; the output is
  // bounded as the W4A4 cases above.
  for (const auto& c : std::vector<Moe>{
           {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, "nvfp4 w4a4", 24, 8, 3072, 1024, {1, 4, 33}},
           {WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, "nvfp4-mo w4a4", 10, 6, 512, 256, {1, 7}}}) {
    QWeight gu = make_qweight(h, c.E, 2 * c.I, c.H, 2, c.fmt, c.act, 4.0f);
    QWeight dn = make_qweight(h, c.E, c.H, c.I, 1, c.fmt, c.act, 1.0f);
    for (int64_t T : c.Ts) {
      Pair x = h.f32({T, c.H}, randn(T * c.H)), lg = h.f32({T, c.E}, randn(T * c.E)), o = h.out({T, c.H}),
           wt = h.out({T, c.k}), id = h.i32({T, c.k}, std::vector<int32_t>(static_cast<size_t>(T * c.k), -1));
      h.cpu->moe_route_experts(o.cpu(), wt.cpu(), id.cpu(), lg.cpu(), x.cpu(), gu.cpu_lin, dn.cpu_lin);
      h.gpu->moe_route_experts(o.gpu(), wt.gpu(), id.gpu(), lg.gpu(), x.gpu(), gu.gpu_lin, dn.gpu_lin);
      const std::string name = std::string(c.name) + " routed TxExkxHxI " + sz({T, c.E, c.k, c.H, c.I});
      record("moe_route_experts", name + " ids differ", h.gpu_f(id) == h.cpu_f(id) ? 0.0 : 1.0, 0.0);
      record("moe_route_experts", name + " weights", h.err(wt), kFp32);
      const double thr = tensor_core_w4a4_moe(gu.gpu_lin, T) ? kTensorCore : kFp32;
      const auto [worst, flipped] = token_errors(h, o, T, c.H, thr);
      record("moe_route_experts", name + " all tokens", worst, kFlippedTokenErr);
      record("decode_moe_flips", name + (thr == kFp32 ? " tokens > 1e-5" : " tokens > 1e-4"), flipped,
             flipped_tokens_bound(T));
    }
  }
  for (auto [T, E, k] : std::vector<std::array<int64_t, 3>>{{1, 16, 8}, {6, 16, 8}}) {
    const int64_t H = 3072, I = 1024;
    Weight gu = make_weight(h, {E, 2 * I, H}, true, 1.0f / std::sqrt(static_cast<float>(H)));
    Weight dn = make_weight(h, {E, H, I}, true, 1.0f / std::sqrt(static_cast<float>(I)));
    std::vector<int32_t> ids;
    std::vector<float> wts;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(E));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), g_rng);
      for (int64_t j = 0; j < k; ++j) {
        ids.push_back(all[static_cast<size_t>(j)]);
        wts.push_back(1.0f / static_cast<float>(k) + 0.01f * static_cast<float>(j));
      }
    }
    Pair x = h.f32({T, H}, randn(T * H)), id = h.i32({T, k}, ids), wt = h.f32({T, k}, wts), o = h.out({T, H});
    h.cpu->moe_experts(o.cpu(), x.cpu(), id.cpu(), wt.cpu(), gu.cpu_lin, dn.cpu_lin);
    h.gpu->moe_experts(o.gpu(), x.gpu(), id.gpu(), wt.gpu(), gu.gpu_lin, dn.gpu_lin);
    record("decode_moe", "bf16 TxExkxHxI " + sz({T, E, k, H, I}), h.err(o), kFp32);
  }
}

// ---- model tests ------------------------------------------------------------------------------

std::filesystem::path fixtures_root() {
  if (std::filesystem::is_directory("tests/fixtures")) return "tests/fixtures";
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures";
}

StateLimits limits(int32_t seqs, int32_t blocks) {
  StateLimits l;
  l.max_sequences = seqs;
  l.num_kv_blocks = blocks;
  l.block_size = 16;
  return l;
}

std::vector<float> forward_all(Qwen35Model& m, const std::vector<int32_t>& ids) {
  DirectState st(m.backend(), m.config(), limits(1, 64));
  auto seq = st.open_sequence();
  std::vector<SequenceInput> b(1);
  b[0].state = &*seq;
  b[0].tokens = ids;
  b[0].all_logits = true;
  auto l = st.forward(m, b);
  if (!l.ok()) {
    std::printf("forward failed: %s\n", l.message().c_str());
    return {};
  }
  return l->data;
}

std::vector<float> rows_of(const std::vector<float>& v, int64_t vocab, int64_t begin, int64_t n) {
  if (static_cast<int64_t>(v.size()) < (begin + n) * vocab) return {};
  return std::vector<float>(v.begin() + begin * vocab, v.begin() + (begin + n) * vocab);
}

// Quantized fixtures: CUDA vs the CPU backend, teacher-forced logits. W4A4 / W8A8 activation
// quantization is a step function: the two backends sum in different f32 orders (~1e-7 relative),
// so an activation within that distance of a rounding midpoint (or a router score near a top-k tie)
// can round the other way on one side, and in these random tiny models that moves every later row
// by O(1). The bounds are tests/python/test_quant_model_reference.py's for the same situation (CPU
// vs compressed-tensors' fake-quant forward): row 0 <= 1e-4 and the first 5 rows <= 1e-3, while a
// formula error moves every row, row 0 included, by >= 1e-2. Rows over 1e-4 ("flipped") are counted
// and printed. Metric per row: max|cuda - cpu| over the row / max|cpu| over the prompt.
void test_quant_model(Qwen35Model& G, Qwen35Model& Cm, const std::string& fname, const nlohmann::json& ref,
                      int64_t V) {
  for (auto& p : ref["prompts"]) {
    const std::string pn = p["name"];
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    const auto g = forward_all(G, ids), c = forward_all(Cm, ids);
    if (static_cast<int64_t>(g.size()) != T * V || g.size() != c.size()) {
      record("quant_model", fname + "/" + pn + " logits shape", INFINITY, 0);
      continue;
    }
    double mref = 0;
    for (float v : c) mref = std::max(mref, static_cast<double>(std::fabs(v)));
    std::vector<double> row(static_cast<size_t>(T), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) {
        const size_t i = static_cast<size_t>(t * V + v);
        const double d = std::fabs(static_cast<double>(g[i]) - c[i]);
        row[static_cast<size_t>(t)] = std::max(row[static_cast<size_t>(t)], std::isnan(d) ? INFINITY : d / mref);
      }
    double first5 = 0;
    int flipped = 0, first_flip = -1;
    for (int64_t t = 0; t < T; ++t) {
      if (t < 5) first5 = std::max(first5, row[static_cast<size_t>(t)]);
      if (row[static_cast<size_t>(t)] > 1e-4) {
        ++flipped;
        if (first_flip < 0) first_flip = static_cast<int>(t);
      }
    }
    record("quant_model", fname + "/" + pn + " row0 vs cpu", row[0], 1e-4);
    record("quant_model", fname + "/" + pn + " rows0-4 vs cpu", first5, 1e-3);
    std::printf("      quant_model    %s/%s: %d of %lld rows over 1e-4 (first at %d)\n", fname.c_str(), pn.c_str(),
                flipped, static_cast<long long>(T), first_flip);
  }
}

void test_models(Backend& cpu, Backend& gpu) {
  std::vector<std::filesystem::path> fixtures;
  for (auto& e : std::filesystem::directory_iterator(fixtures_root()))
    if (e.path().filename().string().rfind("qwen35-", 0) == 0 && std::filesystem::exists(e.path() / "reference.json"))
      fixtures.push_back(e.path());
  std::sort(fixtures.begin(), fixtures.end());
  if (fixtures.empty()) record("model", "fixtures found", INFINITY, 0);
  for (const auto& fx : fixtures) {
    const std::string fname = fx.filename().string();
    auto mg = load_qwen35(fx, gpu);
    auto mc = load_qwen35(fx, cpu);
    if (!mg.ok() || !mc.ok()) {
      record("model", fname + " load", INFINITY, 0);
      continue;
    }
    Qwen35Model& G = **mg;
    Qwen35Model& Cm = **mc;
    const int64_t V = G.config().vocab_size;
    std::ifstream f(fx / "reference.json");
    auto ref = nlohmann::json::parse(f);
    if (fname.find("quant") != std::string::npos) {
      test_quant_model(G, Cm, fname, ref, V);
      continue;
    }
    std::vector<std::vector<int32_t>> prompts;
    for (auto& p : ref["prompts"]) {
      const std::string pn = p["name"];
      const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
      const auto greedy = p["greedy_ids"].get<std::vector<int32_t>>();
      prompts.push_back(ids);
      const int64_t T = static_cast<int64_t>(ids.size());
      auto ref_logits = read_npy_f32(fx / p["logits_file"].get<std::string>());
      auto ref_decode = read_npy_f32(fx / p["decode_logits_file"].get<std::string>());
      if (!ref_logits.ok() || !ref_decode.ok()) {
        record("model", fname + "/" + pn + " reference npy", INFINITY, 0);
        continue;
      }
      const auto g_all = forward_all(G, ids);
      record("logits", fname + "/" + pn + " vs transformers", rel_err(g_all, ref_logits->data), kModel);
      record("logits", fname + "/" + pn + " vs cpu backend", rel_err(g_all, forward_all(Cm, ids)), kModel);
      // Cached decode: prefill the prompt, then feed the greedy ids one at a time.
      DirectState st(gpu, G.config(), limits(1, 64));
      auto seq = st.open_sequence();
      std::vector<SequenceInput> b(1);
      b[0].state = &*seq;
      b[0].tokens = ids;
      auto l = st.forward(G, b);
      std::vector<float> dec;
      std::vector<int32_t> got_ids;
      for (size_t s = 0; l.ok() && s < greedy.size(); ++s) {
        dec.insert(dec.end(), l->data.begin(), l->data.end());
        got_ids.push_back(static_cast<int32_t>(std::max_element(l->data.begin(), l->data.end()) - l->data.begin()));
        b[0].tokens = {greedy[s]};
        l = st.forward(G, b);
      }
      // Row s of dec = logits after prompt + greedy[0..s): the reference decode file starts at row
      // T-1 of the teacher-forced sequence, i.e. dec row 0 is the prompt's last row.
      const int64_t nref = ref_decode->shape[0];
      record("decode", fname + "/" + pn + " cached vs transformers",
             rel_err(rows_of(dec, V, 1, std::min<int64_t>(nref, static_cast<int64_t>(greedy.size()) - 1)),
                     rows_of(ref_decode->data, V, 0, std::min<int64_t>(nref, static_cast<int64_t>(greedy.size()) - 1))),
             kModel);
      record("decode", fname + "/" + pn + " greedy ids exact", got_ids == greedy ? 0.0 : 1.0, kExact);
      std::vector<int32_t> full = ids;
      full.insert(full.end(), greedy.begin(), greedy.end() - 1);
      const auto recompute = forward_all(G, full);
      record("decode", fname + "/" + pn + " prefill+decode==recompute",
             rel_err(dec, rows_of(recompute, V, T - 1, static_cast<int64_t>(greedy.size()))), kModel);
    }
    // Batched == alone: every prompt's prefill in one batch, then one decode step each, batched.
    if (prompts.size() >= 2) {
      const int32_t n = static_cast<int32_t>(prompts.size());
      DirectState st(gpu, G.config(), limits(n, 64 * n));
      std::vector<SequenceState> seqs;
      for (int32_t i = 0; i < n; ++i) seqs.push_back(*st.open_sequence());
      std::vector<SequenceInput> b(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        b[static_cast<size_t>(i)].state = &seqs[static_cast<size_t>(i)];
        b[static_cast<size_t>(i)].tokens = prompts[static_cast<size_t>(i)];
      }
      auto l1 = st.forward(G, b);
      for (int32_t i = 0; i < n; ++i) b[static_cast<size_t>(i)].tokens = {static_cast<int32_t>(7 + i)};
      auto l2 = st.forward(G, b);
      double worst = l1.ok() && l2.ok() ? 0.0 : INFINITY;
      for (int32_t i = 0; i < n && std::isfinite(worst); ++i) {
        auto alone_all = forward_all(G, [&] {
          auto v = prompts[static_cast<size_t>(i)];
          v.push_back(7 + i);
          return v;
        }());
        const int64_t T = static_cast<int64_t>(prompts[static_cast<size_t>(i)].size());
        worst = std::max(worst, rel_err(rows_of(l1->data, V, i, 1), rows_of(alone_all, V, T - 1, 1)));
        worst = std::max(worst, rel_err(rows_of(l2->data, V, i, 1), rows_of(alone_all, V, T, 1)));
      }
      record("batch", fname + " batched==alone (prefill, decode)", worst, kModel);
    }
  }
}

}  // namespace
}  // namespace sparkserve

int main(int argc, char** argv) {
  using namespace sparkserve;
  uint64_t seed = std::random_device{}();
  bool ops = true, models = true, bench = false;
  std::string bench_filter, only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) seed = std::stoull(argv[++i]);
    else if (a == "--bench-kernels") bench = true;
    else if (a == "--bench-filter" && i + 1 < argc) bench_filter = argv[++i];
    else if (a == "--ops-only") models = false;
    else if (a == "--only" && i + 1 < argc) {  // op-check groups whose name holds this; no models
      only = argv[++i];
      models = false;
    }
    else if (a == "--models-only") ops = false;
    else {
      std::fprintf(stderr, "usage: gpu_ops [--seed N] [--ops-only|--only GROUP_SUBSTR|--models-only|--bench-kernels [--bench-filter SUBSTR]]\n");
      return 2;
    }
  }
  auto gpu = make_backend("cuda", 1);
  if (!gpu.ok()) {
    std::printf("SKIP: %s\n", gpu.message().c_str());
    return 77;
  }
  if (bench) return run_bench_kernels(**gpu, bench_filter);
  auto cpu = make_cpu_backend(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  g_rng.seed(seed);
  Harness h{cpu.get(), gpu->get()};
  if (ops) {
    const std::vector<OpCheckGroup> builtin = {{"dense", test_dense},     {"attention", test_attention},
                                               {"gdn", test_gdn},         {"moe", test_moe},
                                               {"quant", test_quant},     {"decode_paths", test_decode_paths}};
    std::vector<OpCheckGroup> groups = builtin;
    groups.insert(groups.end(), op_check_groups().begin(), op_check_groups().end());
    for (const OpCheckGroup& g : groups)
      if (only.empty() || g.name.find(only) != std::string::npos) g.run(h);
  }
  if (models) test_models(*cpu, **gpu);
  // Summary: worst error per group.
  std::printf("\n%-16s %6s %6s %12s %10s\n", "group", "checks", "failed", "worst err", "bound");
  std::vector<std::string> groups;
  for (auto& r : g_results)
    if (std::find(groups.begin(), groups.end(), r.group) == groups.end()) groups.push_back(r.group);
  int failed = 0;
  for (auto& gname : groups) {
    int n = 0, f = 0;
    double worst = 0, bound = 0;
    for (auto& r : g_results)
      if (r.group == gname) {
        ++n;
        f += !r.pass;
        worst = std::max(worst, r.err);
        bound = std::max(bound, r.bound);
      }
    failed += f;
    std::printf("%-16s %6d %6d %12.3e %10.0e\n", gname.c_str(), n, f, worst, bound);
  }
  std::printf("%s: %zu checks, %d failed (seed %llu)\n", failed ? "FAIL" : "PASS", g_results.size(), failed,
              static_cast<unsigned long long>(seed));
  return failed ? 1 : 0;
}
