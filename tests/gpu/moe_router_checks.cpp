// gpu_ops group "moe_router": the MoE's routing and the grouped MoE's plan on the device
// (backend/cuda/moe_route.cuh, moe_grouped.cu), against references on fresh random inputs:
// - routing: the register top-k the kernels run vs its shared-memory reference (route_topk_warp_smem):
//   the same ids and weights bit for bit (bound 0), on random logits, logits with exact ties (the lowest
//   id must win), with -inf and NaN entries, at E = 256 (the models), odd E, 512 (the most in registers)
//   and past it (the fallback); and vs the CPU backend: ids identical, weights kFp32 (the CPU adds the
//   exponentials in another order);
// - plan: ranks, per-chunk bases, expert offsets and work pairs vs a host reference (slot order within
//   an expert, an expert's rows split evenly over ceil(count / tile_n) pairs): identical (bound 0), for
//   ids given and for the routing fused into the plan (T <= 64), 1 to 3 chunks of 1,024 slots;
// - determinism: a second run gives the same bits;
// - the routed branch from logits (moe_route_experts) vs the CPU at 3, 9 and 33 tokens (the routing
//   fused into moe_w4a4, into the plan, apart).
// The router's linear itself is checked in gemm_bf16 / gemm_router (gemm_checks.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe_probe.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

std::vector<float> logits_with(int64_t T, int64_t E, int kind) {
  std::vector<float> v = randn(T * E, 2.0f);
  for (int64_t i = 0; i < T * E; ++i) {
    float& x = v[static_cast<size_t>(i)];
    if (kind == 1) x = std::round(x * 2.0f) / 2.0f;  // few distinct values: exact ties
    if (kind == 2 && i % 7 == 3) x = -INFINITY;
    if (kind == 2 && i % 53 == 11) x = NAN;
    if (kind == 3 && i / E == 1) x = NAN;  // a whole row
  }
  return v;
}

void check_routing(Harness& h, int64_t T, int64_t E, int64_t k, int kind) {
  const char* kinds[] = {"random", "ties", "-inf/NaN", "NaN row"};
  const std::string name = std::string(kinds[kind]) + " TxExk " + sz({T, E, k});
  Pair l = h.f32({T, E}, logits_with(T, E, kind));
  Pair w = h.out({T, k}), id = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
  Pair w2 = h.out({T, k}), id2 = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
  if (!route_topk_probe(*h.gpu, w.gpu(), id.gpu(), l.gpu(), false) ||
      !route_topk_probe(*h.gpu, w2.gpu(), id2.gpu(), l.gpu(), true)) {
    record("moe_router", "routing probe not taken " + name, 1.0, 0.0);
    return;
  }
  const auto gi = h.gpu_f(id), ri = h.gpu_f(id2), gw = h.gpu_f(w), rw = h.gpu_f(w2);
  const bool same_ids = std::memcmp(gi.data(), ri.data(), gi.size() * 4) == 0;
  const bool same_w = std::memcmp(gw.data(), rw.data(), gw.size() * 4) == 0;
  record("moe_router", "routing ids vs reference differ " + name, same_ids ? 0.0 : 1.0, kExact);
  record("moe_router", "routing weights vs reference differ (bits) " + name, same_w ? 0.0 : 1.0, kExact);
  if (kind >= 2) return;  // the CPU's std::exp / sort and NaN: the reference above is the contract
  h.cpu->moe_route_topk(w.cpu(), id.cpu(), l.cpu());
  record("moe_router", "routing ids vs CPU differ " + name, gi == h.cpu_f(id) ? 0.0 : 1.0, kExact);
  record("moe_router", "routing weights vs CPU " + name, h.err(w), kFp32);
}

// Distinct ids per token, popularity skewed towards low ids (some experts get several pairs' rows).
std::vector<int32_t> skewed_ids(int64_t T, int64_t E, int64_t k) {
  std::vector<int32_t> ids;
  std::uniform_real_distribution<double> u(1e-12, 1.0);
  std::vector<double> key(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) key[static_cast<size_t>(e)] = -std::log(u(g_rng)) * std::pow(1.0 + e, 0.8);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)]; });
    ids.insert(ids.end(), order.begin(), order.begin() + k);
  }
  return ids;
}

// The plan as moe_grouped.cu defines it, on the host.
MoePlanHost plan_reference(const std::vector<int32_t>& ids, int64_t E, int64_t tile_n) {
  constexpr int64_t kChunk = 1024;
  const int64_t slots = static_cast<int64_t>(ids.size()), chunks = (slots + kChunk - 1) / kChunk;
  MoePlanHost p;
  p.rank.resize(static_cast<size_t>(slots));
  p.chunk_base.assign(static_cast<size_t>(chunks * E), 0);
  std::vector<int32_t> seen(static_cast<size_t>(E), 0), count(static_cast<size_t>(E), 0);
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t e = 0; e < E; ++e) p.chunk_base[static_cast<size_t>(c * E + e)] = count[static_cast<size_t>(e)];
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t s = c * kChunk; s < std::min(slots, (c + 1) * kChunk); ++s) {
      const auto e = static_cast<size_t>(ids[static_cast<size_t>(s)]);
      p.rank[static_cast<size_t>(s)] = seen[e]++;
      ++count[e];
    }
  }
  int32_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    p.offsets.push_back(off);
    const int64_t cnt = count[static_cast<size_t>(e)], np = (cnt + tile_n - 1) / tile_n;
    for (int64_t i = 0; i < np; ++i) {
      const auto lo = static_cast<int32_t>(i * cnt / np), hi = static_cast<int32_t>((i + 1) * cnt / np);
      p.pairs.insert(p.pairs.end(), {static_cast<int32_t>(e), off + lo, hi - lo});
    }
    off += static_cast<int32_t>(cnt);
  }
  return p;
}

void compare_plans(const MoePlanHost& got, const MoePlanHost& ref, const std::string& name) {
  record("moe_router", "plan ranks differ " + name, got.rank == ref.rank ? 0.0 : 1.0, kExact);
  record("moe_router", "plan chunk bases differ " + name, got.chunk_base == ref.chunk_base ? 0.0 : 1.0, kExact);
  record("moe_router", "plan offsets differ " + name, got.offsets == ref.offsets ? 0.0 : 1.0, kExact);
  record("moe_router", "plan pairs differ " + name, got.pairs == ref.pairs ? 0.0 : 1.0, kExact);
}

void check_plan(Harness& h, int64_t T, int64_t E, int64_t k, int tile_n, bool fused) {
  const std::string name = std::string(fused ? "routing fused " : "ids given ") + "TxExk tile_n " +
                           sz({T, E, k, static_cast<int64_t>(tile_n)});
  std::vector<int32_t> ids = skewed_ids(T, E, k);
  Pair id = h.i32({T, k}, ids), w = h.out({T, k});
  Pair l = h.f32({T, E}, logits_with(T, E, 0));
  MoePlanHost got, again;
  if (!moe_plan_probe(*h.gpu, id.gpu(), w.gpu(), fused ? &l.gpu() : nullptr, E, tile_n, 1, &got) ||
      !moe_plan_probe(*h.gpu, id.gpu(), w.gpu(), fused ? &l.gpu() : nullptr, E, tile_n, 2, &again)) {
    record("moe_router", "plan probe not taken " + name, 1.0, 0.0);
    return;
  }
  if (fused) {  // the routing's ids: the reference routing's, bit for bit
    Pair rw = h.out({T, k}), rid = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
    route_topk_probe(*h.gpu, rw.gpu(), rid.gpu(), l.gpu(), true);
    const auto gi = h.gpu_f(id), gw = h.gpu_f(w), ri = h.gpu_f(rid), rwv = h.gpu_f(rw);
    record("moe_router", "plan's routing ids differ " + name,
           std::memcmp(gi.data(), ri.data(), gi.size() * 4) == 0 ? 0.0 : 1.0, kExact);
    record("moe_router", "plan's routing weights differ (bits) " + name,
           std::memcmp(gw.data(), rwv.data(), gw.size() * 4) == 0 ? 0.0 : 1.0, kExact);
    ids.resize(static_cast<size_t>(T * k));
    h.gpu->download(ids.data(), id.gpu());
  }
  compare_plans(got, plan_reference(ids, E, tile_n), name);
  record("moe_router", "plan rerun differs " + name,
         got.rank == again.rank && got.offsets == again.offsets && got.pairs == again.pairs ? 0.0 : 1.0, kExact);
}

// The MoE block's routed branch from the router's logits (Backend::moe_route_experts, NVFP4 W4A4
// experts, the models' 256 experts top-8 with small H / I): the routing fused into moe_w4a4's first
// launch up to 8 tokens, into the grouped plan up to 16, its own kernel above; ids identical to the
// CPU's, weights kFp32, the
// outputs per token as moe_grouped_checks.cpp bounds them.
void check_routed_branch(Harness& h, int64_t T) {
  const int64_t E = 256, k = 8, H = 256, I = 64;
  QWeight gu = make_qweight(h, E, 2 * I, H, 2, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 4.0f);
  QWeight dn = make_qweight(h, E, H, I, 1, WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1.0f);
  Pair x = h.f32({T, H}, randn(T * H)), lg = h.f32({T, E}, randn(T * E, 2.0f)), o = h.out({T, H}), wt = h.out({T, k}),
       id = h.i32({T, k}, std::vector<int32_t>(static_cast<size_t>(T * k), -1));
  h.cpu->moe_route_experts(o.cpu(), wt.cpu(), id.cpu(), lg.cpu(), x.cpu(), gu.cpu_lin, dn.cpu_lin);
  h.gpu->moe_route_experts(o.gpu(), wt.gpu(), id.gpu(), lg.gpu(), x.gpu(), gu.gpu_lin, dn.gpu_lin);
  const std::string name = "routed branch TxExkxHxI " + sz({T, E, k, H, I});
  record("moe_router", name + " ids differ", h.gpu_f(id) == h.cpu_f(id) ? 0.0 : 1.0, kExact);
  record("moe_router", name + " weights", h.err(wt), kFp32);
  const double thr = tensor_core_w4a4_moe(gu.gpu_lin, T) ? kTensorCore : kFp32;
  const auto [worst, flipped] = token_errors(h, o, T, H, thr);
  record("moe_router", name + " all tokens", worst, kFlippedTokenErr);
  record("moe_router", name + " flipped tokens", flipped, flipped_tokens_bound(T));
}

void test_moe_router(Harness& h) {
  for (int kind = 0; kind < 4; ++kind) check_routing(h, 64, 256, 8, kind);
  check_routing(h, 3, 256, 8, 0);
  check_routing(h, 16, 256, 1, 1);
  check_routing(h, 40, 100, 8, 1);    // E not a multiple of 32
  check_routing(h, 40, 24, 8, 0);     // fewer experts than lanes
  check_routing(h, 40, 512, 32, 1);   // the most in registers, k = 32
  check_routing(h, 40, 600, 8, 1);    // the shared-memory fallback
  check_routing(h, 20, 64, 40, 0);    // k past a warp: the fallback
  for (int64_t T : {1, 2, 9, 16, 33, 64})
    for (bool fused : {false, true}) check_plan(h, T, 256, 8, 16, fused);
  check_plan(h, 64, 256, 8, 8, true);
  check_plan(h, 64, 128, 8, 64, false);   // several pairs' rows in one pair
  check_plan(h, 130, 256, 8, 16, false);  // two chunks
  check_plan(h, 300, 512, 8, 16, true);   // three chunks: the routing kernel first, then the plan
  check_plan(h, 48, 256, 32, 16, true);   // 1,536 slots: two chunks, routing apart
  for (int64_t T : {3, 9, 33}) check_routed_branch(h, T);
}

const RegisterOpChecks kRegister("moe_router", test_moe_router);

}  // namespace
}  // namespace sparkserve
