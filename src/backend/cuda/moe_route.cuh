// The router's softmax + top-k for one token, run by one warp (lanes 0..31 of the calling block):
// route_topk_kernel (moe.cu), the fused routing + activation quantization of moe_w4a4.cu and the
// grouped MoE's plan kernel (moe_grouped.cu) share it, so all give the same ids and weights bit for
// bit.
//
// k rounds of a warp argmax over the probabilities in shared memory. (A rank-based top-k by the
// whole block, each thread counting the experts that sort before its own, was tried: 20.8 µs per
// fused launch under ncu instead of 11.4, +0.5 ms per 122B decode step; docs/performance.md.)
#pragma once

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// logits: [E] f32, p: [E] f32 scratch (shared memory) -> ids: [k] i32, weights: [k] f32 (the top-k
// probabilities, largest first, lowest id among ties, renormalised to sum 1). Lane = threadIdx.x % 32;
// every lane of the warp must call it; ids / weights are written by lane 0. A NaN probability ranks
// below every number (so NaN logits still give k distinct valid ids, never -1).
__device__ inline void route_topk_warp(float* p, const float* l, int64_t E, int64_t k, int32_t* ids, float* weights) {
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

// moe_route_topk's kernel (moe.cu), one warp per token, on `stream`.
// logits: [T, E] f32 -> weights: [T, k] f32, ids: [T, k] i32 (device)
void launch_route_topk(cudaStream_t stream, float* weights, int32_t* ids, const float* logits, int64_t T, int64_t E,
                       int64_t k);

}  // namespace sparkserve
