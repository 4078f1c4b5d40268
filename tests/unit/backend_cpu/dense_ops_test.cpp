// Embedding, norms, linear, elementwise ops vs double-precision formulas.
// Tolerances: fp32 ops with O(D) accumulation get rtol 1e-5 (fp32 epsilon 1.2e-7 times the length
// of the sums here, <= a few hundred terms, with margin); linear layers are bounded relative to
// sum|x_k w_k| (the scale of the rounding error of an fp32 dot product), not to the result.
#include <algorithm>
#include <limits>

#include "op_test_util.h"

namespace sparkserve::test {
namespace {

CpuBackend& backend() {
  static CpuBackend b(3);  // more threads than cores on the CI box: exercises the pool's splitting
  return b;
}

TEST(CpuOps, EmbeddingBf16AndF32AreExactLookups) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const int64_t V = 37, H = 19;
    std::vector<double> vals;
    HostTensor table = dt == DType::kBF16 ? random_bf16({V, H}, vals) : random_f32({V, H});
    if (dt == DType::kF32) vals.assign(table.f(), table.f() + V * H);
    HostTensor ids(DType::kI32, {5});
    int32_t picks[5] = {0, 36, 5, 5, 17};
    std::copy(picks, picks + 5, ids.i());
    HostTensor out(DType::kF32, {5, H});
    backend().embedding(out, ids, make_linear(table, V, H));
    std::vector<double> want;
    for (int32_t p : picks)
      for (int64_t c = 0; c < H; ++c) want.push_back(vals[static_cast<size_t>(p * H + c)]);
    expect_close(out.f(), want, 0, 0, "embedding");
  }
}

std::vector<double> rmsnorm_ref(const HostTensor& x, const HostTensor& w, double eps, bool zero_centred) {
  const int64_t D = w.n(), R = x.n() / D;
  std::vector<double> out;
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x.f()[r * D + i]) * x.f()[r * D + i];
    double s = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) out.push_back(x.f()[r * D + i] * s * (zero_centred ? 1.0 + w.f()[i] : w.f()[i]));
  }
  return out;
}

TEST(CpuOps, RmsNormIsZeroCentred) {
  for (auto [R, D] : {std::pair<int64_t, int64_t>{1, 8}, {7, 64}, {33, 100}}) {
    HostTensor x = random_f32({R, D}, 2.0f), w = random_f32({D}, 0.3f), out(DType::kF32, {R, D});
    backend().rmsnorm(out, x, w, 1e-6f);
    expect_close(out.f(), rmsnorm_ref(x, w, 1e-6, true), 1e-5, 1e-6, "rmsnorm");
    // In place (the model normalises q/k heads in place).
    backend().rmsnorm(x, x, w, 1e-6f);
    for (int64_t i = 0; i < x.n(); ++i) ASSERT_EQ(x.f()[i], out.f()[i]);
  }
}

TEST(CpuOps, RmsNormEpsIsInsideTheRoot) {
  // A tiny input makes eps dominate: x * rsqrt(mean + eps) * (1 + w) with eps = 1e-2.
  HostTensor x(DType::kF32, {1, 4}), w(DType::kF32, {4}), out(DType::kF32, {1, 4});
  for (int i = 0; i < 4; ++i) x.f()[i] = 1e-3f * (i + 1);
  backend().rmsnorm(out, x, w, 1e-2f);
  expect_close(out.f(), rmsnorm_ref(x, w, 1e-2, true), 1e-6, 0, "rmsnorm eps");
}

TEST(CpuOps, AddRmsNormUpdatesResidual) {
  const int64_t R = 5, D = 48;
  HostTensor res = random_f32({R, D}), delta = random_f32({R, D}), w = random_f32({D}, 0.2f), out(DType::kF32, {R, D});
  std::vector<float> sum(static_cast<size_t>(R * D));
  for (int64_t i = 0; i < R * D; ++i) sum[static_cast<size_t>(i)] = res.f()[i] + delta.f()[i];
  backend().add_rmsnorm(res, out, delta, w, 1e-6f);
  for (int64_t i = 0; i < R * D; ++i) ASSERT_EQ(res.f()[i], sum[static_cast<size_t>(i)]);
  expect_close(out.f(), rmsnorm_ref(res, w, 1e-6, true), 1e-5, 1e-6, "add_rmsnorm");
}

TEST(CpuOps, GatedRmsNormUsesPlainWeightThenSiluGate) {
  const int64_t R = 12, D = 24;
  HostTensor x = random_f32({R, D}), z = random_f32({R, D}), w = random_f32({D}, 0.3f), out(DType::kF32, {R, D});
  for (int64_t i = 0; i < D; ++i) w.f()[i] += 1.0f;
  backend().gated_rmsnorm(out, x, z, w, 1e-6f);
  std::vector<double> want = rmsnorm_ref(x, w, 1e-6, false);
  for (int64_t i = 0; i < R * D; ++i) want[static_cast<size_t>(i)] *= silu_d(z.f()[i]);
  expect_close(out.f(), want, 1e-5, 1e-6, "gated_rmsnorm");
}

void check_linear(int64_t T, int64_t K, int64_t N, DType dt) {
  std::vector<double> wv;
  HostTensor w = dt == DType::kBF16 ? random_bf16({N, K}, wv, 0.2f) : random_f32({N, K}, 0.2f);
  if (dt == DType::kF32) wv.assign(w.f(), w.f() + N * K);
  HostTensor x = random_f32({T, K}), out(DType::kF32, {T, N});
  backend().linear(out, x, make_linear(w, N, K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        double p = double(x.f()[t * K + k]) * wv[static_cast<size_t>(n * K + k)];
        s += p;
        mag += std::fabs(p);
      }
      // fp32 dot product with 8 lanes: each result suffers <= K/8 + 4 roundings (lane sums,
      // product, final combine) of relative size 2^-24, so |error| <= (K/8 + 5) 2^-24 sum|terms|.
      const double bound = (K / 8.0 + 5.0) * std::ldexp(1.0, -24) * mag;
      ASSERT_NEAR(out.f()[t * N + n], s, bound) << "T=" << T << " K=" << K << " N=" << N;
    }
}

TEST(CpuOps, LinearBf16AndF32SeveralShapes) {
  for (DType dt : {DType::kBF16, DType::kF32})
    for (auto [T, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 7, 1}, {3, 64, 33}, {17, 100, 5}, {1, 256, 130}, {40, 512, 300}})
      check_linear(T, K, N, dt);
}

// linear_bias is linear, then + b per row, then (accumulate) added to what out held, each step in
// f32 in that order: equal bit for bit to the three ops (linear itself is checked above).
TEST(CpuOps, LinearBiasAddsBiasAndOptionallyTheResidual) {
  const int64_t T = 5, K = 24, N = 7;
  std::vector<double> wv;
  HostTensor w = random_bf16({N, K}, wv, 0.2f);
  HostTensor x = random_f32({T, K}), b = random_f32({N}), lin(DType::kF32, {T, N});
  backend().linear(lin, x, make_linear(w, N, K));
  for (bool accumulate : {false, true}) {
    HostTensor out = random_f32({T, N});
    std::vector<float> before(out.f(), out.f() + T * N);
    backend().linear_bias(out, x, make_linear(w, N, K), b, accumulate);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) {
        const float d = lin.f()[t * N + n] + b.f()[n];
        ASSERT_EQ(out.f()[t * N + n], accumulate ? before[static_cast<size_t>(t * N + n)] + d : d)
            << "t=" << t << " n=" << n << " accumulate=" << accumulate;
      }
  }
}

TEST(CpuOps, ElementwiseOps) {
  const int64_t T = 6, I = 10;
  HostTensor gu = random_f32({T, 2 * I}, 2.0f), act(DType::kF32, {T, I});
  backend().silu_mul(act, gu);
  std::vector<double> want;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) want.push_back(silu_d(gu.f()[t * 2 * I + i]) * gu.f()[t * 2 * I + I + i]);
  expect_close(act.f(), want, 1e-6, 1e-7, "silu_mul");

  HostTensor a = random_f32({T, I}), b = random_f32({T, I}), s(DType::kF32, {T, I});
  backend().add(s, a, b);
  want.clear();
  for (int64_t i = 0; i < T * I; ++i) want.push_back(double(a.f()[i]) + b.f()[i]);
  expect_close(s.f(), want, 1e-7, 0, "add");

  want.clear();
  for (int64_t i = 0; i < T * I; ++i) want.push_back(a.f()[i] * sigmoid_d(b.f()[i]));
  backend().sigmoid_mul(a, b);
  expect_close(a.f(), want, 1e-6, 1e-7, "sigmoid_mul");

  HostTensor out = random_f32({T, I}), y = random_f32({T, I}), g = random_f32({T, 1}, 3.0f);
  want.clear();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) want.push_back(out.f()[t * I + i] + sigmoid_d(g.f()[t]) * y.f()[t * I + i]);
  backend().add_sigmoid_scaled(out, y, g);
  expect_close(out.f(), want, 1e-6, 1e-7, "add_sigmoid_scaled");
}

TEST(CpuOps, GatherRowsAndArgmax) {
  HostTensor x = random_f32({5, 7}), out(DType::kF32, {3, 7});
  backend().gather_rows(out, x, {4, 0, 4});
  for (int64_t c = 0; c < 7; ++c) {
    EXPECT_EQ(out.f()[c], x.f()[4 * 7 + c]);
    EXPECT_EQ(out.f()[7 + c], x.f()[c]);
  }
  HostTensor l(DType::kF32, {2, 4});
  float v[8] = {1, 3, 3, 2, -5, -1, -7, -1};
  std::copy(v, v + 8, l.f());
  auto a = backend().argmax(l, 4, {});
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0], (RowArgmax{1, -1}));  // first of equal maxima
  EXPECT_EQ(a[1], (RowArgmax{1, -1}));
  EXPECT_EQ(backend().argmax(l, 1, {})[1], (RowArgmax{0, -1}));  // only the first column counts
  a = backend().argmax(l, 4, {1, 9});   // excluded columns never win (9: none such)
  EXPECT_EQ(a[0], (RowArgmax{2, -1}));
  EXPECT_EQ(a[1], (RowArgmax{3, -1}));
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  float w[8] = {-inf, -inf, -inf, -inf, nan, 2, inf, nan};
  std::copy(w, w + 8, l.f());
  a = backend().argmax(l, 4, {});
  EXPECT_EQ(a[0], (RowArgmax{0, -1}));  // all -inf: the first column
  EXPECT_EQ(a[1], (RowArgmax{2, 0}));   // NaN never wins; +Inf does, and both are reported at the first
  a = backend().argmax(l, 4, {0, 2});
  EXPECT_EQ(a[1], (RowArgmax{1, 0}));   // an excluded NaN / +Inf column is still reported
}

}  // namespace
}  // namespace sparkserve::test
