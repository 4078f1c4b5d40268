// Sparse MoE (model-qwen35.md §2.7): router top-k and the routed SiLU-gated experts.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

void CpuBackend::moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) {
  const int64_t T = router_logits.dim(0), E = router_logits.dim(1), k = weights.dim(1);
  CHECK(ids.dim(1) == k && k <= E && ids.dtype == DType::kI32);
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = router_logits.ptr<const float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[static_cast<size_t>(e)] = std::exp(l[e] - mx));
    for (float& v : p) v /= sum;  // softmax over all experts
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    float top_sum = 0;
    for (int64_t j = 0; j < k; ++j) top_sum += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      ids.ptr<int32_t>()[t * k + j] = e;
      weights.ptr<float>()[t * k + j] = p[static_cast<size_t>(e)] / top_sum;
    }
  }
}

void CpuBackend::moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids,
                             const Tensor& weights, const Linear& gate_up, const Linear& down) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1), E = gate_up.weight.dim(0);
  const int64_t I = down.in_features;
  CHECK(gate_up.out_features == 2 * I && gate_up.in_features == H && down.out_features == H);
  // Token-slots routed to each expert.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
  for (int64_t s = 0; s < T * k; ++s) {
    const int32_t e = ids.ptr<const int32_t>()[s];
    CHECK(e >= 0 && e < E);
    slots[static_cast<size_t>(e)].push_back(s);
  }
  // y[slot] = expert output for that token (unweighted), computed expert by expert; the matmuls
  // inside parallelise over output rows.
  std::vector<float> y(static_cast<size_t>(T * k * H));
  std::vector<float> xs, gu, act, ys;
  for (int64_t e = 0; e < E; ++e) {
    const auto& sl = slots[static_cast<size_t>(e)];
    if (sl.empty()) continue;
    const int64_t n = static_cast<int64_t>(sl.size());
    xs.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(&xs[static_cast<size_t>(i * H)], x.ptr<const float>() + (sl[static_cast<size_t>(i)] / k) * H,
                  static_cast<size_t>(H) * 4);
    gu.resize(static_cast<size_t>(n * 2 * I));
    cpu::linear_rows(pool_, gu.data(), xs.data(), n, gate_up, e);
    act.resize(static_cast<size_t>(n * I));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < I; ++j)
        act[static_cast<size_t>(i * I + j)] =
            cpu::silu(gu[static_cast<size_t>(i * 2 * I + j)]) * gu[static_cast<size_t>(i * 2 * I + I + j)];
    ys.resize(static_cast<size_t>(n * H));
    cpu::linear_rows(pool_, ys.data(), act.data(), n, down, e);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(&y[static_cast<size_t>(sl[static_cast<size_t>(i)] * H)], &ys[static_cast<size_t>(i * H)],
                  static_cast<size_t>(H) * 4);
  }
  // Weighted sum per token in ascending expert id, as HF's eager loop accumulates.
  std::vector<int64_t> order(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    const int32_t* id = ids.ptr<const int32_t>() + t * k;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
    float* o = out.ptr<float>() + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t j : order) {
      const float w = weights.ptr<const float>()[t * k + j];
      const float* yy = &y[static_cast<size_t>((t * k + j) * H)];
      for (int64_t c = 0; c < H; ++c) o[c] += w * yy[c];
    }
  }
}

}  // namespace sparkserve
