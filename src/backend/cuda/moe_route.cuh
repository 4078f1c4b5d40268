// The router's softmax + top-k for one token, run by one warp (lanes 0..31 of the calling block):
// route_topk_kernel (moe.cu), the fused routing + activation quantization of moe_w4a4.cu and the
// grouped MoE's plan kernel (moe_grouped.cu) share it, so all give the same ids and weights bit for
// bit.
//
// Up to 32 · kRouteMaxPerLane experts and k <= 32 (the Qwen3.5 MoEs: 256 experts, top-8): each lane
// holds its experts' probabilities in registers and each of the k rounds is a warp argmax by two
// redux.sync (the largest key, then the lowest id holding it); the logits are read once and ids and
// weights written once (the shared-memory version read the logits twice and let lane 0 write each
// round's id and weight and re-read the weights to renormalise them: a chain of L2 round trips where
// they are global). Measured on the H200, the routing kernel after the router: 3.2 µs less per launch
// at 1..64 tokens (docs/performance.md "The MoE's glue at small T"). More: the probabilities in shared
// memory and k rounds of a shuffle argmax (route_topk_warp_smem), the same operations in the same
// order, so the same bits. (A rank-based top-k by the whole block, each thread counting the experts
// that sort before its own, was tried: 20.8 µs per fused launch under ncu instead of 11.4, +0.5 ms
// per 122B decode step; docs/performance.md.)
#pragma once

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

inline constexpr int kRouteMaxPerLane = 16;

// logits: [E] f32, p: [E] f32 scratch (shared memory) -> ids: [k] i32, weights: [k] f32 (the top-k
// probabilities, largest first, lowest id among ties, renormalised to sum 1). Lane = threadIdx.x % 32;
// every lane of the warp must call it; ids / weights are written by lane 0. A NaN probability ranks
// below every number (so NaN logits still give k distinct valid ids, never -1). The reference of
// route_topk_warp_regs (tests/gpu: the two give the same bits) and its fallback for large E or k.
__device__ inline void route_topk_warp_smem(float* p, const float* l, int64_t E, int64_t k, int32_t* ids,
                                            float* weights) {
  const int lane = threadIdx.x % 32;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) sum += (p[e] = expf(l[e] - mx));
  sum = warp_sum(sum);
  for (int64_t e = lane; e < E; e += 32) p[e] /= sum;
  __syncwarp();
  float top_sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    // Largest remaining key, lowest id among ties (a stable descending sort's order). Keys: the
    // probability (>= 0), -1 for NaN, -2 for taken; -3 starts the search, so an untaken expert
    // always wins while k <= E.
    float best = -3.0f;
    int32_t best_e = -1;
    for (int64_t e = lane; e < E; e += 32) {
      const float key = isnan(p[e]) ? -1.0f : p[e];
      if (key > best) {
        best = key;
        best_e = static_cast<int32_t>(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe >= 0 && (best_e < 0 || ob > best || (ob == best && oe < best_e))) {
        best = ob;
        best_e = oe;
      }
    }
    const float prob = p[best_e];  // the probability itself (NaN stays NaN)
    __syncwarp();
    if (lane == 0) {
      ids[j] = best_e;
      weights[j] = prob;  // renormalised below
      p[best_e] = -2.0f;  // taken
    }
    top_sum += prob;
    __syncwarp();
  }
  if (lane == 0)
    for (int64_t j = 0; j < k; ++j) weights[j] /= top_sum;
}

// route_topk_warp_smem's result for E <= 32 V, k <= 32, with lane l's probabilities of experts l + 32 i
// in registers: the max, the exponentials, their sum (lane order, then warp_sum) and the divisions are
// the same operations in the same order; a round's winner is the same (largest key, lowest id among
// ties); the weights are the same
// quotients prob_j / top_sum with top_sum added in the same order. Written by lanes 0..k-1.
template <int V>
__device__ inline void route_topk_warp_regs(const float* l, int E, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float p[V];
#pragma unroll
  for (int i = 0; i < V; ++i) p[i] = lane + 32 * i < E ? l[lane + 32 * i] : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < V; ++i) mx = fmaxf(mx, p[i]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (lane + 32 * i < E) sum += (p[i] = expf(p[i] - mx));
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < V; ++i) p[i] /= sum;
  // Keys as ordered integers: taken or absent 0 < NaN 1 < the probability's bits + 2 (p >= 0).
  uint32_t key[V];
#pragma unroll
  for (int i = 0; i < V; ++i)
    key[i] = lane + 32 * i >= E ? 0u : isnan(p[i]) ? 1u : (p[i] == 0.0f ? 2u : __float_as_uint(p[i]) + 2u);
  float top_sum = 0.0f, my_prob = 0.0f;
  int32_t my_id = 0;
  for (int j = 0; j < k; ++j) {
    // This lane's largest key and the lowest of its ids holding it (ids grow with i).
    uint32_t best = 0;
    int bi = 0;
    float bp = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (key[i] > best) {
        best = key[i];
        bi = i;
        bp = p[i];
      }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t win = __reduce_min_sync(0xffffffffu, best == top ? static_cast<uint32_t>(lane + 32 * bi) : 0xffffffffu);
    const float prob = __shfl_sync(0xffffffffu, bp, static_cast<int>(win % 32));  // NaN stays NaN
    if (lane == static_cast<int>(win % 32)) {
#pragma unroll
      for (int i = 0; i < V; ++i)
        if (i == bi) key[i] = 0u;  // taken
    }
    top_sum += prob;
    if (lane == j) {
      my_id = static_cast<int32_t>(win);
      my_prob = prob;
    }
  }
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = my_prob / top_sum;
  }
}

// logits: [E] f32, p: [E] f32 scratch (shared memory; used only past 32 kRouteMaxPerLane experts or
// 32 slots) -> ids: [k] i32, weights: [k] f32, as route_topk_warp_smem. Every lane of the warp must
// call it.
__device__ inline void route_topk_warp(float* p, const float* l, int64_t E, int64_t k, int32_t* ids, float* weights) {
  if (k <= 32 && E <= 256)
    route_topk_warp_regs<8>(l, static_cast<int>(E), static_cast<int>(k), ids, weights);
  else if (k <= 32 && E <= 32 * kRouteMaxPerLane)
    route_topk_warp_regs<kRouteMaxPerLane>(l, static_cast<int>(E), static_cast<int>(k), ids, weights);
  else
    route_topk_warp_smem(p, l, E, k, ids, weights);
}

// moe_route_topk's kernel (moe.cu), one warp per token, on `stream`.
// logits: [T, E] f32 -> weights: [T, k] f32, ids: [T, k] i32 (device)
void launch_route_topk(cudaStream_t stream, float* weights, int32_t* ids, const float* logits, int64_t T, int64_t E,
                       int64_t k);

}  // namespace sparkserve
