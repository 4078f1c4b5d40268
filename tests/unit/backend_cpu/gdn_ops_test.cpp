// Gated DeltaNet ops vs double formulas: conv with state, gating, the delta rule in its recurrent
// and chunked forms (against a double-precision recurrence and against each other), spanning
// several 64-token chunks, with non-zero initial states and two sequences per batch.
#include <algorithm>

#include "op_test_util.h"

namespace sparkserve::test {
namespace {

CpuBackend& backend() {
  static CpuBackend b(2);
  return b;
}

BatchLayout layout_of(const std::vector<int64_t>& lens, const std::vector<int32_t>& slots) {
  BatchLayout b;
  int64_t row = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    SeqSpan s;
    s.row_begin = row;
    s.num_tokens = lens[i];
    s.gdn_slot = slots[i];
    b.seqs.push_back(s);
    row += lens[i];
  }
  b.total_rows = row;
  return b;
}

TEST(CpuOps, GdnConvMatchesCausalDepthwiseConvWithState) {
  const int64_t C = 19, K = 4, S = K - 1;
  const std::vector<int64_t> lens = {7, 2, 1};
  const std::vector<int32_t> slots = {2, 0, 1};
  BatchLayout batch = layout_of(lens, slots);
  HostTensor x = random_f32({batch.total_rows, C}), w = random_f32({C, K}, 0.5f), state = random_f32({3, C, S});
  std::vector<float> state0(state.f(), state.f() + state.n());
  HostTensor out(DType::kF32, {batch.total_rows, C});
  backend().gdn_conv(out, x, w, state, batch);
  std::vector<double> want(static_cast<size_t>(batch.total_rows * C));
  for (size_t si = 0; si < lens.size(); ++si) {
    const SeqSpan& sp = batch.seqs[si];
    for (int64_t c = 0; c < C; ++c) {
      // input at time t' in [-S, n): state for t' < 0.
      auto in = [&](int64_t tp) -> double {
        return tp < 0 ? state0[static_cast<size_t>((sp.gdn_slot * C + c) * S + (S + tp))] : x.f()[(sp.row_begin + tp) * C + c];
      };
      for (int64_t t = 0; t < sp.num_tokens; ++t) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += w.f()[c * K + j] * in(t - (K - 1) + j);  // w[K-1] * current
        want[static_cast<size_t>((sp.row_begin + t) * C + c)] = silu_d(acc);
      }
      // New state = the last K-1 inputs.
      for (int64_t j = 0; j < S; ++j)
        ASSERT_EQ(state.f()[(sp.gdn_slot * C + c) * S + j], static_cast<float>(in(sp.num_tokens - S + j)));
    }
  }
  expect_close(out.f(), want, 1e-5, 1e-6, "gdn_conv");
}

TEST(CpuOps, GdnConvInPiecesEqualsOneShot) {
  const int64_t C = 11, K = 4, T = 9;
  HostTensor x = random_f32({T, C}), w = random_f32({C, K}), s1(DType::kF32, {1, C, K - 1}), s2(DType::kF32, {1, C, K - 1});
  HostTensor o1(DType::kF32, {T, C}), o2(DType::kF32, {T, C});
  backend().gdn_conv(o1, x, w, s1, layout_of({T}, {0}));
  for (auto [b, n] : {std::pair<int64_t, int64_t>{0, 2}, {2, 1}, {3, 6}})
    backend().gdn_conv(o2.t.rows(b, n), x.t.rows(b, n), w, s2, layout_of({n}, {0}));
  for (int64_t i = 0; i < T * C; ++i) ASSERT_EQ(o1.f()[i], o2.f()[i]);
  for (int64_t i = 0; i < C * (K - 1); ++i) ASSERT_EQ(s1.f()[i], s2.f()[i]);
}

TEST(CpuOps, GdnGating) {
  const int64_t T = 5, Hv = 6;
  HostTensor a = random_f32({T, Hv}, 3.0f), b = random_f32({T, Hv}, 3.0f), A_log = random_f32({Hv}), dt = random_f32({Hv});
  a.f()[0] = 30.0f;  // past softplus's linear threshold (20)
  HostTensor g(DType::kF32, {T, Hv}), beta(DType::kF32, {T, Hv});
  backend().gdn_gating(g, beta, a, b, A_log, dt);
  std::vector<double> wg, wb;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      double x = double(a.f()[t * Hv + h]) + dt.f()[h];
      wg.push_back(-std::exp(double(A_log.f()[h])) * std::log1p(std::exp(x)));
      wb.push_back(sigmoid_d(b.f()[t * Hv + h]));
    }
  expect_close(g.f(), wg, 1e-5, 1e-7, "gdn g");
  expect_close(beta.f(), wb, 1e-6, 1e-7, "gdn beta");
}

// Double-precision delta rule for one sequence, updating `S` ([Hv, dk, dv]) in place.
std::vector<double> delta_rule_ref(const HostTensor& qkv, const HostTensor& g, const HostTensor& beta, const SeqSpan& sp,
                                   std::vector<double>& S, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, r = Hv / d.num_k_heads;
  const int64_t C = d.conv_dim();
  std::vector<double> out(static_cast<size_t>(sp.num_tokens * Hv * dv));
  for (int64_t t = 0; t < sp.num_tokens; ++t) {
    const float* row = qkv.f() + (sp.row_begin + t) * C;
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = h / r;  // repeat_interleave pairing
      std::vector<double> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < dk; ++i) {
        q[static_cast<size_t>(i)] = row[kh * dk + i];
        k[static_cast<size_t>(i)] = row[d.key_dim() + kh * dk + i];
        qs += q[static_cast<size_t>(i)] * q[static_cast<size_t>(i)];
        ks += k[static_cast<size_t>(i)] * k[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < dk; ++i) {
        q[static_cast<size_t>(i)] /= std::sqrt(qs + 1e-6) * std::sqrt(double(dk));
        k[static_cast<size_t>(i)] /= std::sqrt(ks + 1e-6);
      }
      const float* v = row + 2 * d.key_dim() + h * dv;
      double* Sh = &S[static_cast<size_t>(h * dk * dv)];
      const double decay = std::exp(double(g.f()[(sp.row_begin + t) * Hv + h]));
      const double bt = beta.f()[(sp.row_begin + t) * Hv + h];
      for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < dk; ++i) kv += Sh[i * dv + j] * k[static_cast<size_t>(i)];
        const double delta = (v[j] - kv) * bt;
        for (int64_t i = 0; i < dk; ++i) Sh[i * dv + j] += k[static_cast<size_t>(i)] * delta;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += Sh[i * dv + j] * q[static_cast<size_t>(i)];
        out[static_cast<size_t>((t * Hv + h) * dv + j)] = o;
      }
    }
  }
  return out;
}

enum class Form { kRecurrent, kChunked };

void check_delta_rule(const GdnDims& d, const std::vector<int64_t>& lens, Form form) {
  const std::vector<int32_t> slots = lens.size() == 1 ? std::vector<int32_t>{1} : std::vector<int32_t>{1, 0};
  BatchLayout batch = layout_of(lens, slots);
  const int64_t T = batch.total_rows, Hv = d.num_v_heads;
  HostTensor qkv = random_f32({T, d.conv_dim()}), g(DType::kF32, {T, Hv}), beta(DType::kF32, {T, Hv});
  // Decays from ~1 (state carried across chunk boundaries) to strong; beta in (0, 1).
  std::uniform_real_distribution<float> ug(-1.5f, -0.001f), ub(0.05f, 0.95f);
  for (int64_t i = 0; i < T * Hv; ++i) {
    g.f()[i] = ug(rng());
    beta.f()[i] = ub(rng());
  }
  HostTensor state = random_f32({2, Hv, d.k_head_dim, d.v_head_dim}, 0.5f);
  std::vector<std::vector<double>> ref_state;
  for (int32_t s = 0; s < 2; ++s)
    ref_state.emplace_back(state.f() + s * Hv * d.k_head_dim * d.v_head_dim,
                           state.f() + (s + 1) * Hv * d.k_head_dim * d.v_head_dim);
  HostTensor out(DType::kF32, {T, Hv, d.v_head_dim});
  if (form == Form::kRecurrent) {
    backend().gdn_recurrent(out, qkv, g, beta, state, batch, d);
  } else {
    backend().gdn_chunked(out, qkv, g, beta, state, batch, d);
  }
  double max_ref = 0;
  for (const SeqSpan& sp : batch.seqs) {
    std::vector<double> want = delta_rule_ref(qkv, g, beta, sp, ref_state[static_cast<size_t>(sp.gdn_slot)], d);
    for (double v : want) max_ref = std::max(max_ref, std::fabs(v));
    // fp32 evaluation of a recurrence over <= 150 steps (and, in the chunked form, 64x64
    // triangular solves with decays exp(gc_i - gc_j) <= 1) on outputs of magnitude ~0.05-1:
    // 2e-5 absolute leaves room for ~100 ulps of accumulated rounding (measured: a few ulps), still
    // far below the effect of a formula error (a wrong pairing or decay order changes outputs by
    // a large fraction of their size).
    expect_close(out.f() + sp.row_begin * Hv * d.v_head_dim, want, 1e-5, 2e-5,
                 form == Form::kRecurrent ? "gdn_recurrent" : "gdn_chunked");
    const float* s_got = state.f() + sp.gdn_slot * Hv * d.k_head_dim * d.v_head_dim;
    expect_close(s_got, ref_state[static_cast<size_t>(sp.gdn_slot)], 1e-5, 2e-5, "final state");
  }
  EXPECT_GT(max_ref, 0.02);  // non-trivial outputs: 1000x the absolute tolerance
}

const GdnDims kShapes[] = {
    {2, 6, 16, 24, 4},  // r = 3, dv != dk (the MoE fixture's GDN)
    {2, 4, 24, 16, 4},  // r = 2, dv < dk
    {1, 1, 8, 8, 4},
};

TEST(CpuOps, GdnRecurrentMatchesDoubleRecurrence) {
  for (const GdnDims& d : kShapes) {
    check_delta_rule(d, {1}, Form::kRecurrent);
    check_delta_rule(d, {1, 1}, Form::kRecurrent);
    check_delta_rule(d, {9, 3}, Form::kRecurrent);
  }
}

TEST(CpuOps, GdnChunkedMatchesDoubleRecurrence) {
  for (const GdnDims& d : kShapes) {
    check_delta_rule(d, {5}, Form::kChunked);
    check_delta_rule(d, {64}, Form::kChunked);
    check_delta_rule(d, {65, 150}, Form::kChunked);
  }
}

TEST(CpuOps, GdnChunkedEqualsRecurrentInFp32) {
  const GdnDims d = kShapes[0];
  const int64_t T = 130, Hv = d.num_v_heads;
  BatchLayout batch = layout_of({T}, {0});
  HostTensor qkv = random_f32({T, d.conv_dim()}), g(DType::kF32, {T, Hv}), beta(DType::kF32, {T, Hv});
  std::uniform_real_distribution<float> ug(-0.5f, -0.001f), ub(0.05f, 0.95f);
  for (int64_t i = 0; i < T * Hv; ++i) {
    g.f()[i] = ug(rng());
    beta.f()[i] = ub(rng());
  }
  HostTensor s1 = random_f32({1, Hv, d.k_head_dim, d.v_head_dim}, 0.5f), s2(DType::kF32, {1, Hv, d.k_head_dim, d.v_head_dim});
  std::copy_n(s1.f(), s1.n(), s2.f());
  HostTensor o1(DType::kF32, {T, Hv, d.v_head_dim}), o2(DType::kF32, {T, Hv, d.v_head_dim});
  backend().gdn_recurrent(o1, qkv, g, beta, s1, batch, d);
  backend().gdn_chunked(o2, qkv, g, beta, s2, batch, d);
  // Same function in two fp32 evaluation orders (model-qwen35.md §8: not bitwise equal); the same
  // 2e-5 absolute bound as against the double reference.
  expect_close(o2.f(), std::vector<double>(o1.f(), o1.f() + o1.n()), 1e-5, 2e-5, "chunked vs recurrent");
  expect_close(s2.f(), std::vector<double>(s1.f(), s1.f() + s1.n()), 1e-5, 2e-5, "chunked vs recurrent state");
}

// State saves (SeqSpan::saves) in gdn_conv, gdn_recurrent and gdn_chunked: the outputs and the slot
// are bit for bit those of the call without saves, and each save's row bit for bit the slot a call
// over the span's first `tokens` rows leaves (a chunk ending at the save; inside a chunk and at its
// end, after the first token, at the span's end, two spans).
TEST(CpuOps, GdnStateSavesAreTheStateOfACallEndingThere) {
  const GdnDims d = kShapes[0];
  const int64_t Hv = d.num_v_heads, C = d.conv_dim(), K = d.conv_kernel;
  const std::vector<std::vector<GdnStateSave>> saves = {{{1, 2}, {40, 3}, {64, 4}, {100, 5}, {150, 6}}, {{7, 7}}};
  BatchLayout batch = layout_of({150, 9}, {1, 0});
  for (size_t i = 0; i < saves.size(); ++i) {
    batch.seqs[i].saves = saves[i].data();
    batch.seqs[i].num_saves = static_cast<int64_t>(saves[i].size());
  }
  const int64_t T = batch.total_rows, rows = 8;
  HostTensor mixed = random_f32({T, C}), w = random_f32({C, K}, 0.5f), qkv = random_f32({T, C});
  HostTensor g(DType::kF32, {T, Hv}), beta(DType::kF32, {T, Hv});
  std::uniform_real_distribution<float> ug(-1.0f, -0.001f), ub(0.05f, 0.95f);
  for (int64_t i = 0; i < T * Hv; ++i) {
    g.f()[i] = ug(rng());
    beta.f()[i] = ub(rng());
  }
  const HostTensor conv0 = random_f32({rows, C, K - 1}), rec0 = random_f32({rows, Hv, d.k_head_dim, d.v_head_dim}, 0.5f);
  const int64_t conv_row = C * (K - 1), rec_row = Hv * d.k_head_dim * d.v_head_dim;
  auto copy_of = [](const HostTensor& t) {
    HostTensor c(DType::kF32, t.t.shape);
    std::copy_n(t.f(), t.n(), c.f());
    return c;
  };
  // One op over `b` from the initial pools: its output and pool.
  auto run = [&](int op, const BatchLayout& b) {
    HostTensor pool = copy_of(op == 0 ? conv0 : rec0), out(DType::kF32, op == 0 ? std::vector<int64_t>{T, C}
                                                                                  : std::vector<int64_t>{T, Hv, d.v_head_dim});
    std::fill_n(out.f(), out.n(), 0.0f);
    if (op == 0) backend().gdn_conv(out, mixed, w, pool, b);
    if (op == 1) backend().gdn_recurrent(out, qkv, g, beta, pool, b, d);
    if (op == 2) backend().gdn_chunked(out, qkv, g, beta, pool, b, d);
    return std::pair{std::move(out), std::move(pool)};
  };
  BatchLayout plain = batch;
  for (SeqSpan& sp : plain.seqs) sp.num_saves = 0;
  for (int op : {0, 1, 2}) {
    const char* name = op == 0 ? "gdn_conv" : op == 1 ? "gdn_recurrent" : "gdn_chunked";
    const int64_t row_n = op == 0 ? conv_row : rec_row;
    auto [out, pool] = run(op, batch);
    auto [out0, pool0] = run(op, plain);
    EXPECT_TRUE(std::equal(out.f(), out.f() + out.n(), out0.f())) << name << ": outputs as without saves";
    for (const SeqSpan& sp : batch.seqs) {
      const float* live = pool.f() + sp.gdn_slot * row_n;
      EXPECT_TRUE(std::equal(live, live + row_n, pool0.f() + sp.gdn_slot * row_n)) << name << ": live state";
      for (int64_t i = 0; i < sp.num_saves; ++i) {
        BatchLayout stop;
        stop.total_rows = T;
        stop.seqs.push_back(sp);
        stop.seqs[0].num_tokens = sp.saves[i].tokens;
        stop.seqs[0].num_saves = 0;
        auto [out1, pool1] = run(op, stop);
        const float* saved = pool.f() + sp.saves[i].row * row_n;
        EXPECT_TRUE(std::equal(saved, saved + row_n, pool1.f() + sp.gdn_slot * row_n))
            << name << ": the save after " << sp.saves[i].tokens << " tokens";
      }
    }
  }
}

// gdn_verify (a speculative verify span) = decoding its tokens one at a time with gdn_conv and
// gdn_recurrent from the same state, bit for bit, while the pools stay as they were.
TEST(CpuOps, GdnVerifyIsDecodingTokenByTokenAndLeavesTheState) {
  const GdnDims d = kShapes[0];
  const int64_t C = d.conv_dim(), K = d.conv_kernel, Hv = d.num_v_heads, dv = d.v_head_dim;
  BatchLayout batch = layout_of({3, 1, 4}, {2, 0, 1});
  const int64_t T = batch.total_rows;
  HostTensor mixed = random_f32({T, C}), w = random_f32({C, K}, 0.5f), g(DType::kF32, {T, Hv}),
             beta(DType::kF32, {T, Hv});
  std::uniform_real_distribution<float> ug(-0.5f, -0.001f), ub(0.05f, 0.95f);
  for (int64_t i = 0; i < T * Hv; ++i) {
    g.f()[i] = ug(rng());
    beta.f()[i] = ub(rng());
  }
  HostTensor conv = random_f32({3, C, K - 1}), rec = random_f32({3, Hv, d.k_head_dim, dv}, 0.5f);
  const std::vector<float> conv0(conv.f(), conv.f() + conv.n()), rec0(rec.f(), rec.f() + rec.n());
  HostTensor qkv(DType::kF32, {T, C}), out(DType::kF32, {T, Hv, dv});
  backend().gdn_verify(out, qkv, mixed, w, g, beta, conv, rec, batch, d);
  EXPECT_TRUE(std::equal(conv0.begin(), conv0.end(), conv.f()));
  EXPECT_TRUE(std::equal(rec0.begin(), rec0.end(), rec.f()));
  // The decode steps, one token per call, on the live pools.
  HostTensor qkv1(DType::kF32, {T, C}), out1(DType::kF32, {T, Hv, dv});
  for (const SeqSpan& sp : batch.seqs)
    for (int64_t t = 0; t < sp.num_tokens; ++t) {
      BatchLayout one;
      SeqSpan s = sp;
      s.row_begin = sp.row_begin + t;
      s.num_tokens = 1;
      one.seqs.push_back(s);
      one.total_rows = T;
      backend().gdn_conv(qkv1, mixed, w, conv, one);
      backend().gdn_recurrent(out1, qkv1, g, beta, rec, one, d);
    }
  EXPECT_TRUE(std::equal(qkv.f(), qkv.f() + qkv.n(), qkv1.f()));
  EXPECT_TRUE(std::equal(out.f(), out.f() + out.n(), out1.f()));
}

}  // namespace
}  // namespace sparkserve::test
