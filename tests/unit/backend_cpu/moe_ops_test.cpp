// MoE ops vs double formulas: fp32 softmax over all experts + top-k + renormalisation, and the
// SiLU-gated experts with stacked [E, 2I, H] / [E, H, I] weights.
#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace sparkserve::test {
namespace {

CpuBackend& backend() {
  static CpuBackend b(2);
  return b;
}

TEST(CpuOps, MoeRouteTopkRenormalisesSoftmaxOverAllExperts) {
  for (auto [T, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 3}, {9, 16, 4}, {4, 5, 5}}) {
    HostTensor logits = random_f32({T, E}, 2.0f), w(DType::kF32, {T, k}), ids(DType::kI32, {T, k});
    backend().moe_route_topk(w, ids, logits);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p(static_cast<size_t>(E));
      double mx = *std::max_element(logits.f() + t * E, logits.f() + (t + 1) * E), sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (p[static_cast<size_t>(e)] = std::exp(logits.f()[t * E + e] - mx));
      for (auto& v : p) v /= sum;
      std::vector<int> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
      double top = 0;
      for (int64_t j = 0; j < k; ++j) top += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(ids.i()[t * k + j], order[static_cast<size_t>(j)]);
        ASSERT_NEAR(w.f()[t * k + j], p[static_cast<size_t>(order[static_cast<size_t>(j)])] / top, 1e-6);
      }
    }
  }
}

TEST(CpuOps, MoeExpertsMatchDoubleFormula) {
  for (auto [T, H, I, E, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 16, 8, 4, 2}, {7, 24, 40, 8, 3}, {20, 32, 12, 6, 6}}) {
    std::vector<double> gu_v, dn_v;
    HostTensor gu = random_bf16({E, 2 * I, H}, gu_v, 0.3f), dn = random_bf16({E, H, I}, dn_v, 0.3f);
    HostTensor x = random_f32({T, H}), ids(DType::kI32, {T, k}), w(DType::kF32, {T, k}), out(DType::kF32, {T, H});
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng());
      for (int64_t j = 0; j < k; ++j) {
        ids.i()[t * k + j] = perm[static_cast<size_t>(j)];
        w.f()[t * k + j] = 1.0f / static_cast<float>(k + j);
      }
    }
    Linear lgu = make_linear(gu, 2 * I, H), ldn = make_linear(dn, H, I);
    backend().moe_experts(out, x, ids, w, lgu, ldn);
    std::vector<double> want;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> acc(static_cast<size_t>(H), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = ids.i()[t * k + j];
        std::vector<double> act(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < H; ++c) {
            g += x.f()[t * H + c] * gu_v[static_cast<size_t>((e * 2 * I + i) * H + c)];
            u += x.f()[t * H + c] * gu_v[static_cast<size_t>((e * 2 * I + I + i) * H + c)];
          }
          act[static_cast<size_t>(i)] = silu_d(g) * u;
        }
        for (int64_t c = 0; c < H; ++c) {
          double y = 0;
          for (int64_t i = 0; i < I; ++i) y += act[static_cast<size_t>(i)] * dn_v[static_cast<size_t>((e * H + c) * I + i)];
          acc[static_cast<size_t>(c)] += w.f()[t * k + j] * y;
        }
      }
      want.insert(want.end(), acc.begin(), acc.end());
    }
    // Two chained fp32 matmuls of length <= 40 on O(1) values: 1e-5 relative + 1e-5 absolute.
    expect_close(out.f(), want, 1e-5, 1e-5, "moe_experts");
  }
}

}  // namespace
}  // namespace sparkserve::test
